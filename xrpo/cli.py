"""The `xrpo` command line. Subcommands are registered by the modules that implement them."""
from __future__ import annotations

import argparse
import sys

from xrpo import __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xrpo",
        description="XRPO (eXplore-eXploit GRPO): RL from verifiable rewards for LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"xrpo {__version__}")
    parser.add_subparsers(dest="command", metavar="COMMAND")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
