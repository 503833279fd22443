"""Images made the same way wherever they are made: a dataset folder's files (`files.py`), the JPEG decoding
stacks (`decoders.py`, with the ROI decoder in `jpeg_roi/`), the DALI pipeline (`dali.py`), and the synthetic
producers' source tiles (`tiles.py`, which the ray-data pipeline draws too).

Below both ends of the wire: the decoding producers run them in their worker processes, and the
in-trainer paths (dali, spdl) in the trainer, so neither end imports the other. No framework here.
"""
