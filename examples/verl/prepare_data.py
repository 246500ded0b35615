"""Write verl's RL parquet (train + validation) from anything xrpo's loaders read.

    # the paper's data (§4.1): "randomly sampling 10K examples from ... DAPO-Math-17k", evaluated on AIME
    python examples/verl/prepare_data.py --train dapo_math_17k.parquet --train-limit 10000 \
        --val aime25.jsonl --out $HOME/data/xrpo
    # offline, no download: xrpo's built-in arithmetic task (what the GPU smoke test trains on)
    python examples/verl/prepare_data.py --task default --out $HOME/data/xrpo-default
    # ... only its easiest gcd problems, which the built-in model solves about a quarter of the time (the CPU dry run)
    python examples/verl/prepare_data.py --task default --families gcd --levels 0 --out $HOME/data/xrpo-gcd

Inputs: JSONL / JSON / parquet (verl's layout included) / `datasets` directories, read by `xrpo.data.load_problems`
(field detection, clear errors naming file and row). Outputs ``train.parquet`` and ``val.parquet`` in ``--out``,
written by `xrpo.data.save_problems_verl_parquet`: ``prompt`` (chat messages), ``reward_model.ground_truth``,
``data_source``, ``extra_info.index`` (the problem id, which the ICL corpus keys on). ``--instruction`` is appended
to each prompt's last user message (e.g. the answer format the verifier expects).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import replace
from pathlib import Path

from xrpo.data import Problem, load_problems, make_default_task, save_problems_verl_parquet
from xrpo.data.tasks import DEFAULT_FAMILIES

BOXED = "Please reason step by step, and put your final answer within \\boxed{}."


def with_instruction(p: Problem, instruction: str, template: str = "{prompt}") -> Problem:
    if isinstance(p.prompt, str):
        text = f"{p.prompt}\n{instruction}" if instruction else p.prompt
        return replace(p, prompt=template.format(prompt=text))
    if not instruction:
        return p
    msgs = [dict(m) for m in p.prompt]
    last = max(i for i, m in enumerate(msgs) if m["role"] == "user")
    msgs[last]["content"] = f"{msgs[last]['content']}\n{instruction}"
    return replace(p, prompt=msgs)


def sample(problems: list[Problem], limit: int | None, seed: int) -> list[Problem]:
    if limit is None or limit >= len(problems):
        return problems
    return random.Random(seed).sample(problems, limit)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", choices=["default"], help="xrpo's built-in offline task instead of --train/--val")
    ap.add_argument("--train", help="training problems (any format xrpo.data.load_problems reads)")
    ap.add_argument("--val", help="validation problems")
    ap.add_argument("--train-limit", type=int, help="keep a random sample of this many training problems")
    ap.add_argument("--val-limit", type=int, help="keep a random sample of this many validation problems")
    ap.add_argument("--n-train", type=int, default=2048, help="--task default: training problems")
    ap.add_argument("--n-val", type=int, default=128, help="--task default: validation problems")
    ap.add_argument(
        "--families",
        nargs="+",
        metavar="NAME",
        help="--task default: only these families (xrpo.data.tasks.FAMILIES; default: the default task's)",
    )
    ap.add_argument(
        "--levels",
        nargs="+",
        type=int,
        metavar="L",
        help="--task default: only these difficulty levels of each family (0 = easiest; default: all)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--instruction",
        default=None,
        help=f"appended to every prompt (default for files: {BOXED!r}; none for --task default)",
    )
    ap.add_argument(
        "--template",
        default="{prompt}",
        help="each prompt's text through this template, e.g. 'Q: {prompt}\\nA:' (what the built-in model was "
        "warm-started on; \\n is a newline)",
    )
    ap.add_argument(
        "--seed-corpus",
        metavar="FILE",
        help="also write the validation problems with their answers as an ICL seed corpus (algorithm.xrpo.corpus_init)",
    )
    ap.add_argument("--out", required=True, help="output directory for train.parquet and val.parquet")
    args = ap.parse_args(argv)

    if args.task == "default":
        if args.train or args.val:
            ap.error("--task default replaces --train/--val")
        families = args.families or list(DEFAULT_FAMILIES)
        levels = {f: args.levels for f in families} if args.levels else None
        train, val = make_default_task(
            n_train=args.n_train, n_heldout=args.n_val, seed=args.seed, families=families, levels=levels
        )
        instruction = args.instruction or ""
    else:
        if not (args.train and args.val):
            ap.error("give --train and --val (or --task default)")
        if args.families or args.levels:
            ap.error("--families and --levels choose problems of --task default")
        train = load_problems(args.train)
        val = load_problems(args.val)
        instruction = BOXED if args.instruction is None else args.instruction
    if "{prompt}" not in args.template:
        ap.error("--template must contain {prompt}")
    template = args.template.replace("\\n", "\n")
    train = [with_instruction(p, instruction, template) for p in sample(train, args.train_limit, args.seed)]
    val = [with_instruction(p, instruction, template) for p in sample(val, args.val_limit, args.seed + 1)]
    out = Path(args.out).expanduser()
    for name, probs in (("train", train), ("val", val)):
        path = save_problems_verl_parquet(probs, out / f"{name}.parquet")
        print(f"{path}: {len(probs)} problems")
    if args.seed_corpus:
        rows = [{"problem_id": p.id, "problem": p.text, "solution": str(p.answer)} for p in val]
        Path(args.seed_corpus).write_text("".join(json.dumps(r) + "\n" for r in rows))
        print(f"{args.seed_corpus}: {len(rows)} seed solutions")
    return 0


if __name__ == "__main__":
    sys.exit(main())
