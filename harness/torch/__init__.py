"""The PyTorch plugin of the harness: torchvision's ResNet-50 on DistributedDataParallel, one process per device (torchrun).

Fed by the same producers and measured the same way as the TensorFlow
trainer, with each input path's PyTorch half in `consumers/<path>/torch.py`. Nothing
here imports TensorFlow. See docs/torch.md.
"""
