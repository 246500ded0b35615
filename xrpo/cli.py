"""The `xrpo` command line: `xrpo train`, `xrpo eval`, `xrpo report`, `xrpo verl`."""
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

def _verl(args) -> int:
    # verl is an optional extra: imported only by this subcommand
    try:
        from xrpo.integrations.verl.main import check_config, load_config, run
    except ImportError as e:
        raise SystemExit(f"xrpo verl: needs the verl extra (pip install 'xrpo[verl]'): {e}") from None
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        config = load_config(args.config, args.overrides)
    except (HydraException, OmegaConfBaseException) as e:  # a bad override or config file: one clear line
        raise ValueError(str(e).splitlines()[0]) from None
    if args.check:
        from omegaconf import OmegaConf

        check_config(config)
        print(OmegaConf.to_yaml({"algorithm": config.algorithm}), end="")
        print("xrpo verl: config OK")
        return 0
    run(config)
    return 0

def _eval(args) -> int:
    from xrpo.eval.evaluate import EvalConfig, evaluate

    values = {name: getattr(args, name) for name in EvalConfig.__dataclass_fields__ if hasattr(args, name)}
    values["data"] = args.data or ["default"]
    if values.get("k") is not None:
        values["k"] = [k for group in values["k"] for k in group]
    try:
        evaluate(EvalConfig(**values))
    except KeyboardInterrupt:
        print("xrpo eval: interrupted; finished problems are saved: re-run the same command to continue",
              file=sys.stderr)
        return 130
    return 0

def _report(args) -> int:
    from xrpo.eval.report import make_report

    make_report(args.run_dir, args.output, html_page=not args.no_html)
    return 0

def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers, got {text!r}") from None

def _add_eval_parser(sub) -> None:
    """`xrpo eval` options come from EvalConfig's fields and their docstrings (one source for --help and docs)."""
    from xrpo.eval.evaluate import EvalConfig
    from xrpo.trainer.config import field_docs

    docs = field_docs(EvalConfig)
    ev = sub.add_parser(
        "eval", help="pass@k, cons@n, response length and truncation of a model on benchmark files",
        description="Sample n completions per problem, verify them, and report pass@k / cons@n per dataset and on "
                    "average (results.json, results.md, pass_at_k.png, lengths.png; resumable). Examples: "
                    "xrpo eval default default; xrpo eval runs/x aime24.parquet champ --n 32; "
                    "xrpo eval Qwen/Qwen2.5-Math-1.5B math500.jsonl --prompt-template boxed --engine vllm",
    )
    ev.add_argument("model", help=docs["model"])
    ev.add_argument("data", nargs="*", metavar="DATA", help=docs["data"] + " Default: default.")
    ints = {"n", "max_new_tokens", "seed", "icl_k", "limit", "batch_size", "chunk_size", "threads",
            "max_prompt_tokens", "vllm_max_model_len"}
    for name in EvalConfig.__dataclass_fields__:
        if name in ("model", "data"):
            continue
        flag = "--" + name.replace("_", "-")
        h = docs.get(name, "")
        default = EvalConfig.__dataclass_fields__[name].default
        if name in ("greedy", "save_completions"):
            ev.add_argument(flag, action="store_true", help=h)
        elif name == "chat_template":
            ev.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=h)
        elif name == "k":
            ev.add_argument(flag, type=_int_list, nargs="+", default=None, metavar="K", help=h)
        elif name == "stop":
            ev.add_argument(flag, action="append", default=None, metavar="STRING", help=h + " Repeatable.")
        elif name in ints:
            ev.add_argument(flag, type=int, default=default, help=h)
        elif name in ("temperature", "top_p", "vllm_kv_cache_gib", "vllm_gpu_memory_utilization"):
            ev.add_argument(flag, type=float, default=default, help=h)
        elif name == "engine":
            ev.add_argument(flag, choices=["hf", "vllm"], default=default, help=h)
        else:
            ev.add_argument(flag, default=default, help=h)
    ev.set_defaults(func=_eval)

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
    vr = sub.add_parser(
        "verl",
        help="train with XRPO inside verl (Ray, multi-GPU / multi-node; needs the verl extra), see docs/verl.md",
    )
    vr.add_argument("--config", help="verl YAML listing ppo_trainer and xrpo_base in its defaults (examples/verl/)")
    vr.add_argument("--check", action="store_true", help="compose and validate the config, print it, start nothing")
    vr.add_argument("overrides", nargs="*", metavar="key=value", help="hydra overrides, e.g. trainer.nnodes=2")
    vr.set_defaults(func=_verl)

    _add_eval_parser(sub)
    rp = sub.add_parser("report", help="one page (Markdown + HTML with plots) from a training run's logs")
    rp.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by xrpo train")
    rp.add_argument("--output", help="where to write (default RUN_DIR/report)")
    rp.add_argument("--no-html", action="store_true", help="write report.md and the PNGs only")
    rp.set_defaults(func=_report)
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
    except ImportError as e:
        if "pip install" not in str(e):
            raise  # a broken install or a bug, not a missing optional extra
        print(f"xrpo {args.command}: error: {e}", file=sys.stderr)
        return 2

if __name__ == "__main__":
    sys.exit(main())
