"""How this project imports each framework: what every TensorFlow or PyTorch half builds on.

Below the halves in `models/`, `feeders/`, `consumers/` and the trainers, so
that each can import it without reaching up into a trainer. This package's
`__init__` imports no framework; `frameworks.tf_env` imports TensorFlow.
"""
