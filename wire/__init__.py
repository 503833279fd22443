"""Wire formats shared by producers, the Python consumers and the zmq_ops op.

See docs/wire.md for the byte layouts and wire/vectors.json for test vectors.
"""

from wire.errors import WireError
from wire.message import FORMATS, Batch, decode_message, recv, send
from wire.zmqops_format import dump_arrays, load_arrays

__all__ = ["FORMATS", "Batch", "WireError", "decode_message", "dump_arrays", "load_arrays", "recv", "send"]
