"""Producer processes: make batches (synthetic, decoded JPEGs, DALI) and push them over ZeroMQ.

Every producer reads the same way: a *source* yields (images, labels) batches,
and `producers.sender` pushes them on the wire; `producers.launcher` runs one
sender per worker process and stops them all together.
"""
