"""`python -m benchmarks bench-wire|bench-decode`: the wire and decode benchmarks."""

import argparse
import sys

from benchmarks import bench_decode, bench_wire


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in (bench_wire, bench_decode):
        module.register(sub)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
