"""The PyTorch trainer: torchvision's ResNet-50 on DistributedDataParallel, one process per device (torchrun).

Fed by the same producers and measured the same way as the TensorFlow
trainer, with one file per input path in `torch_trainer/inputs/`. Nothing
here imports TensorFlow. See docs/torch.md.
"""
