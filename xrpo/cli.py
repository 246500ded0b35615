"""The `xrpo` command line: `xrpo train` (and more subcommands as they land)."""
from __future__ import annotations

import argparse
import sys

from xrpo import __version__


def _train(args) -> int:
    from xrpo.trainer.config import build_config
    from xrpo.trainer.loop import train

    if args.resume:
        if args.config or args.overrides:
            raise SystemExit("xrpo train: --resume continues a run with its saved config.yaml; "
                             "--config and key=value overrides are not allowed with it")
        train(None, resume=args.resume)  # type: ignore[arg-type]
        return 0
    cfg = build_config(args.config, args.overrides)
    train(cfg)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from xrpo.trainer.config import help_text

    parser = argparse.ArgumentParser(
        prog="xrpo",
        description="XRPO (eXplore-eXploit GRPO): RL from verifiable rewards for LLMs.",
    )
    parser.add_argument("--version", action="version", version=f"xrpo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    tr = sub.add_parser(
        "train",
        help="train a model (no arguments: XRPO on the built-in task and model, CPU, offline, a few minutes)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=help_text(),
    )
    tr.add_argument("--config", help="YAML config file (sections model, data, method, rollout, optim)")
    tr.add_argument("--resume", metavar="DIR", help="continue a run (its directory or one of its checkpoints)")
    tr.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. method.name=grpo")
    tr.set_defaults(func=_train)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as e:
        # bad input: one clear line, no traceback
        print(f"xrpo {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
