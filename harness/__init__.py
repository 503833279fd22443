"""The framework-neutral harness: one run loop, report, sweep and capacity search for every trainer.

A framework plugin (`harness/tf/plugin.py`, `harness/torch/plugin.py`) only
describes its devices and runs a list of input paths for a configuration;
everything else a run does — defaults, checks, the table, the verdicts, the
JSON (docs/results.schema.json), sweeps, capacity and the files written —
lives here, once, and imports neither TensorFlow nor PyTorch. The plugins
themselves, `harness/tf/` and `harness/torch/`, are the two framework folders
under it; nothing else in `harness/` imports them.
"""
