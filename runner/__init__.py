"""What runs around a trainer, for both frameworks: producers, signals, memory, capacity, loader sweeps, clusters.

Imports neither TensorFlow nor PyTorch (docs/layout.md names each file).
"""
