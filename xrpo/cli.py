"""The `xrpo` command line: `xrpo train`, `xrpo eval`, `xrpo report`, `xrpo simulate`, `xrpo verl`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
import typing

from xrpo import __version__
from xrpo.rundir.fields import coerce, field_docs, strip_optional


def _train(args) -> int:
    from xrpo.trainer.config_loader import build_config
    from xrpo.trainer.loop import NoLearningSignal, TrainingStopped, train
    from xrpo.trainer.preflight import check_config

    try:
        if args.check:
            if args.resume:
                raise SystemExit("xrpo train: --check checks a new run's config; a run's saved one was checked already")
            print(check_config(build_config(args.config, args.overrides)), end="")
            return 0
        if args.resume:
            if args.config or args.overrides:
                raise SystemExit(
                    "xrpo train: --resume continues a run with its saved config.yaml; "
                    "--config and key=value overrides are not allowed with it"
                )
            train(None, resume=args.resume, plots=_report_plots)  # type: ignore[arg-type]
            return 0
        train(build_config(args.config, args.overrides), plots=_report_plots)
    except TrainingStopped as e:  # SIGTERM / SIGINT: the step under way was finished and checkpointed
        print(f"xrpo train: {e}", file=sys.stderr)
        return e.exit_code
    except NoLearningSignal as e:  # stop_without_signal steps in a row gave every rollout the same reward
        print(f"xrpo train: {e}", file=sys.stderr)
        return 1
    return 0


def _report_plots(run_dir):
    """`xrpo report`'s PNGs of a finished run (in RUN_DIR/report), by name: what the trackers get at the end."""
    from pathlib import Path

    from xrpo.eval.report import make_report

    page = Path(make_report(run_dir, html_page=False, log=lambda *_: None))
    return {p.stem: p for p in sorted(page.parent.glob("*.png"))}


def _verl(args) -> int:
    if args.cpu:
        from xrpo.integrations.verl.cpu import cpu_environment, precheck_verl

        precheck_verl()
        # set before verl is imported: its plugin loads the CPU mode here and in every Ray worker (they inherit it)
        os.environ.update(cpu_environment())
    # verl is an optional extra: imported only by this subcommand
    try:
        from xrpo.integrations.verl.main import check_config, check_data_files, config_error, load_config, run
    except ImportError as e:
        raise SystemExit(f"xrpo verl: needs the verl extra (pip install 'xrpo[verl]'): {e}") from None
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    overrides = list(args.overrides)
    if args.cpu:
        from xrpo.integrations.verl.cpu import CPU_OVERRIDES

        overrides = [*CPU_OVERRIDES, *overrides]
    try:  # a bad override, config file or setting: one clear line (verl's own checks assert)
        config = load_config(args.config, overrides)
        check_config(config)
        if args.cpu:
            from xrpo.integrations.verl.cpu import check_cpu_config

            check_cpu_config(config)
    except (HydraException, OmegaConfBaseException, AssertionError) as e:
        raise ValueError(config_error(e, args.config, overrides)) from None
    if args.check:
        from omegaconf import OmegaConf

        check_data_files(config)
        shown = config if args.full else {"algorithm": config.algorithm}
        print(OmegaConf.to_yaml(shown, resolve=args.full), end="")
        if not args.full:
            print("(the algorithm block; the whole resolved config: add --full)")
        print("xrpo verl: config OK")
        return 0
    if not args.cpu:
        run(config)
        return 0
    import time

    from xrpo.integrations.verl.cpu import metrics_path, summary_line

    out_dir = os.path.abspath(config.trainer.default_local_dir)
    os.makedirs(out_dir, exist_ok=True)
    os.environ["VERL_FILE_LOGGER_PATH"] = str(metrics_path(out_dir, time.strftime("%Y%m%d-%H%M%S")))
    run(config)
    print(summary_line(out_dir), flush=True)  # before Ray's exit handlers run
    return 0


def _eval(args) -> int:
    from xrpo.eval.config import EvalConfig
    from xrpo.eval.evaluate import evaluate

    values = {name: getattr(args, name) for name in EvalConfig.__dataclass_fields__ if hasattr(args, name)}
    values["data"] = args.data or ["default"]
    if values.get("k") is not None:
        values["k"] = [k for group in values["k"] for k in group]
    # SIGTERM (a scheduler's preemption) stops an evaluation as Ctrl-C does: every finished chunk is already on disk
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        evaluate(EvalConfig(**values))
    except KeyboardInterrupt:
        print(
            "xrpo eval: interrupted; finished problems are saved: re-run the same command to continue", file=sys.stderr
        )
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _report(args) -> int:
    from xrpo.eval.report import make_report

    make_report(args.run_dir, args.output, html_page=not args.no_html)
    return 0


def _simulate(args) -> int:
    from xrpo.sim.runner import SimConfig
    from xrpo.sim.tables import run_cli

    values: dict = {}
    if args.config:
        from pathlib import Path

        from xrpo.rundir.yamlfile import read_yaml

        path = Path(args.config)
        try:
            loaded = read_yaml(path) or {}  # its errors name the file and line
        except FileNotFoundError as e:
            raise FileNotFoundError(f"--config: {e}") from None
        except ValueError as e:
            raise ValueError(f"--config: {e}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"--config: {path} must hold a mapping of options, got {type(loaded).__name__}")
        known = set(SimConfig.__dataclass_fields__)
        hints = typing.get_type_hints(SimConfig)
        for key, value in loaded.items():
            if key not in known:
                raise ValueError(f"--config: {path} has unknown option {key!r}; valid: {', '.join(sorted(known))}")
            try:  # the type conversion the command-line flags get (`add_field_options`)
                values[key] = coerce(value, key, hints[key])
            except ValueError as e:
                raise ValueError(f"--config: {path}: {e}") from None
    for name in SimConfig.__dataclass_fields__:
        if hasattr(args, name):  # given on the command line (defaults are suppressed): overrides the file
            values[name] = getattr(args, name)
    try:
        cfg = SimConfig(**values)
    except (TypeError, ValueError) as e:  # a value out of range: say where the values came from
        msg = f"bad option value: {e}" if isinstance(e, TypeError) else str(e)
        given = f" (options from --config {args.config} and the command line)" if args.config else ""
        raise ValueError(msg + given) from None
    run_cli(cfg, output=args.output, sweep_spec=args.sweep, plots=not args.no_plots)
    return 0


def _str_list(text: str) -> list[str]:
    return [x for x in text.replace(",", " ").split() if x]


# -- the one helper behind every subcommand's options ----------------------------------------------------------
def add_field_options(
    parser: argparse.ArgumentParser,
    cls,
    *,
    show_defaults: bool,
    skip: tuple[str, ...] = (),
    special: dict[str, dict] | None = None,
) -> None:
    """One ``--flag`` per field of the config dataclass ``cls`` (``xrpo eval``'s `EvalConfig`, ``xrpo simulate``'s
    `SimConfig`; ``xrpo train``'s sections are set as ``key=value`` through the same conversion,
    `xrpo.trainer.config_loader`): its help is the field's docstring (`field_docs`), its value is converted to the
    field's declared type by `xrpo.rundir.fields.coerce` (a bool field is ``--flag / --no-flag``, a list of ints or
    names is comma-separated).

    show_defaults: leave a flag not given out of the parsed namespace (so the dataclass's default, or a --config
        file's value, applies) and show the default in its help; False: the namespace holds the default.
    special: argparse options of a field that replace the derived ones (``help_suffix`` is appended to its help).
    """
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        h = docs.get(f.name, "")
        if show_defaults and default is not None:
            h += f" (default: {','.join(map(str, default)) if isinstance(default, list) else default})"
        kw: dict = {"default": argparse.SUPPRESS if show_defaults else default}
        base, _ = strip_optional(hints[f.name])
        if base is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif base == list[int]:
            kw.update(type=_int_list, metavar="M1,M2,...")
        elif base == list[str]:
            kw.update(type=_str_list, metavar="NAME,...")
        elif base in (int, float):
            kw["type"] = _converter(f.name, hints[f.name], base.__name__)
        extra = dict((special or {}).get(f.name, {}))
        h += extra.pop("help_suffix", "")
        if extra:
            kw = {"default": kw["default"], **extra}
        parser.add_argument("--" + f.name.replace("_", "-"), help=h.replace("%", "%%"), **kw)


def _converter(name: str, ftype, shown: str):
    def convert(text: str):
        return coerce(text, name, ftype)

    convert.__name__ = shown  # argparse's error names it: "invalid int value: 'x'"
    return convert


def _add_simulate_parser(sub) -> None:
    """`xrpo simulate` options come from SimConfig's fields and their docstrings."""
    from xrpo.sim.runner import SWEEPABLE, SimConfig

    sp = sub.add_parser(
        "simulate",
        help="allocation simulator: what each rollout-allocation rule buys per step (no model, seconds)",
        description="Simulate training steps from prompt success rates alone (a Beta mixture, or the rates measured "
        "in a run's rounds.jsonl): uniform (GRPO), HRP proportional / greedy, CurES, DAPO refill and the "
        "best allocation in hindsight, through the library's own allocation functions. Prints a "
        "Markdown table (mean ± 95% interval over steps) and the paper's latency model of rounds; "
        "with --output also writes simulate.md, simulate.json and plots. docs/simulate.md explains "
        "every figure. Examples: xrpo simulate; xrpo simulate --dist '0.5*0 + 0.5*beta(1,4)' --icl "
        "--icl-mult 0.5; xrpo simulate --rounds-file runs/x --output sim; xrpo simulate --sweep "
        "lam=0,0.1,0.3,1 --output sim",
    )
    sp.add_argument("--config", help="YAML file of these options (underscored names); flags given here override it")
    sp.add_argument(
        "--output",
        metavar="DIR",
        help="write simulate.md, simulate.json, simulate.png, latency.png "
        "(sweep: sweep.md, sweep.json, sweep_NAME.png) there; default: print the table only",
    )
    sp.add_argument(
        "--sweep",
        metavar="NAME=V1,V2,...",
        help="re-run the simulator for each value of one option "
        f"({', '.join(SWEEPABLE)}); for dist separate the mixtures with ';'",
    )
    sp.add_argument("--no-plots", action="store_true", help="with --output, write no PNGs (no matplotlib needed)")
    add_field_options(sp, SimConfig, show_defaults=True)
    sp.set_defaults(func=_simulate)


def _int_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers, got {text!r}") from None


def _add_eval_parser(sub) -> None:
    """`xrpo eval` options come from EvalConfig's fields and their docstrings (one source for --help and docs)."""
    from xrpo.eval.config import EvalConfig
    from xrpo.rollout.build import ENGINES

    docs = field_docs(EvalConfig)
    ev = sub.add_parser(
        "eval",
        help="pass@k, cons@n, response length and truncation of a model on benchmark files",
        description="Sample n completions per problem, verify them, and report pass@k / cons@n per dataset and on "
        "average (results.json, results.md, pass_at_k.png, lengths.png; resumable). Examples: "
        "xrpo eval default default; xrpo eval runs/x aime24.parquet champ --n 32; "
        "xrpo eval Qwen/Qwen2.5-Math-1.5B math500.jsonl --prompt-template boxed --engine vllm",
    )
    ev.add_argument("model", help=docs["model"])
    ev.add_argument("data", nargs="*", metavar="DATA", help=docs["data"] + " Default: default.")
    add_field_options(
        ev,
        EvalConfig,
        skip=("model", "data"),
        show_defaults=False,
        special={
            "greedy": {"action": "store_true"},
            "save_completions": {"action": "store_true"},
            "k": {"type": _int_list, "nargs": "+", "metavar": "K"},
            "stop": {"action": "append", "metavar": "STRING", "help_suffix": " Repeatable."},
            "engine": {"choices": list(ENGINES)},
        },
    )
    ev.set_defaults(func=_eval)


def build_parser() -> argparse.ArgumentParser:
    from xrpo.trainer.config_loader import help_text

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
    tr.add_argument(
        "--check",
        action="store_true",
        help="check the config and exit: every check that needs no model or data (paths, hub ids, extras, trackers), "
        "then the resolved config as the run's config.yaml would hold it; loads and writes nothing",
    )
    tr.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. method.name=grpo")
    tr.set_defaults(func=_train)
    vr = sub.add_parser(
        "verl",
        help="train with XRPO inside verl (Ray, multi-GPU / multi-node; needs the verl extra), see docs/verl.md",
    )
    vr.add_argument("--config", help="verl YAML listing ppo_trainer and xrpo_base in its defaults (examples/verl/)")
    vr.add_argument(
        "--check",
        action="store_true",
        help="compose and validate the config (data files included), print its algorithm block, start nothing",
    )
    vr.add_argument("--full", action="store_true", help="with --check: print the whole resolved config")
    vr.add_argument(
        "--cpu",
        action="store_true",
        help="CPU mode (verl 0.9.1 only): dry-run a recipe on a machine without GPUs, see docs/verl.md 'CPU mode'",
    )
    vr.add_argument("overrides", nargs="*", metavar="key=value", help="hydra overrides, e.g. trainer.nnodes=2")
    vr.set_defaults(func=_verl)

    _add_eval_parser(sub)
    rp = sub.add_parser("report", help="one page (Markdown + HTML with plots) from a training run's logs")
    rp.add_argument("run_dir", metavar="RUN_DIR", help="a directory written by xrpo train")
    rp.add_argument("--output", help="where to write (default RUN_DIR/report)")
    rp.add_argument("--no-html", action="store_true", help="write report.md and the PNGs only")
    rp.set_defaults(func=_report)
    _add_simulate_parser(sub)
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
