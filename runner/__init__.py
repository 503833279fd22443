"""Run orchestration shared by every trainer: the run's producer processes and its clean stop on signals.

Imports neither TensorFlow nor PyTorch.
"""
