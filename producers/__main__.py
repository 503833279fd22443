import sys

from producers import parent

parent.watch()  # before the heavy imports: a run that dies now still takes us with it

from producers.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
