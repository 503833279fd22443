"""Images from a dataset folder, made the same way wherever they are made: its files (`files.py`), the JPEG
decoding stacks (`decoders.py`, with the ROI decoder in `jpeg_roi/`) and the DALI pipeline (`dali.py`).

Below both ends of the wire: the decoding producers run them in their worker processes, and the
in-trainer paths (dali, spdl) in the trainer, so neither end imports the other. No framework here.
"""
