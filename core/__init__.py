"""The framework-neutral core: run configuration, the input-path registry, one-line errors.

Nothing here imports TensorFlow or PyTorch, so both trainers (tf_trainer/,
torch_trainer/) and the neutral stages (producers/, wire/, consumers/,
profiler/) can share it.
"""
