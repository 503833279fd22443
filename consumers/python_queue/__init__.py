"""The `python-queue` input path: its declaration (`path.py`), read by each framework's half."""
