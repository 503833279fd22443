"""The multi-device ResNet-50 trainer and its measurement loop (tensorpack on TF graph mode)."""
