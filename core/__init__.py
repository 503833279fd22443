"""The framework-neutral core: run configuration, the input-path registry, one-line errors, images.

Nothing here imports TensorFlow or PyTorch, so both trainers (harness/tf/,
harness/torch/) and the neutral stages (producers/, wire/, consumers/,
profiler/) can share it.
"""
