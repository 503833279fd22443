"""What the trainers train: ResNet-50, an emulated device, or an input-only stand-in, for each framework.

`models.tf` holds TensorFlow's (tensorpack ModelDescs, and the emulated
device's native op in `models/tf/emulated_op/`), `models.torch` PyTorch's
(torchvision's ResNet-50 and `EmulatedDevice`, the op's twin). This package
itself imports neither framework: each half is imported by its own trainer.
"""
