"""Benchmarks that are not the trainer: the wire (bench_wire), decoding (bench_decode), the op (bench_op).

`python -m benchmarks bench-wire|bench-decode` and `python -m benchmarks.bench_op`.
"""
