import os
import sys

# `python -m producers` puts the current folder first on sys.path: a loader's folder holding core.py or
# wire.py would shadow the project's packages. The project's folder goes first instead.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.abspath(sys.path[0] or os.curdir) != _ROOT:
    sys.path.insert(0, _ROOT)

from producers import parent  # noqa: E402

parent.watch()  # before the heavy imports: a run that dies now still takes us with it

from producers.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
