"""The `tpu-debug` command line (subcommands land with the recording spine)."""

from __future__ import annotations

import argparse
import sys

from tpu_debug._version import __version__


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpu-debug", description=__doc__)
    parser.add_argument("--version", action="version", version=f"tpu-debug {__version__}")
    parser.parse_args(argv)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
