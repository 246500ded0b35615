"""Does a task + model give XRPO's mechanisms something to act on? Measured before any training.

    python benchmarks/regime.py                                   # the default job's model and task
    python benchmarks/regime.py --config study/signal.yaml        # the study's regime
    python benchmarks/regime.py model.warmup_steps=1200 --prompts 512 --json out.json

On the training problems (the first --prompts of the run's training split), with the run's sampling settings:
  1. base: n_base plain rollouts per prompt; share of groups with zero reward variance (all right or all wrong),
     the spread of per-prompt success rates (prompts by number of successes in base + extra rollouts);
  2. corpus: the verified correct base rollouts, loaded once at the start as the paper loads "baseline-correct
     solutions" (each prompt's own entry is never retrieved for it); --corpus-out writes them as a seed-solution
     file for `rollout.icl_corpus`;
  3. on the prompts with no success in their base group, --extra more rollouts two ways, each from its own seed:
     plain (what GRPO or HRP without ICL would draw) and ICL-seeded (the K most similar solved problems, the
     trainer's renderer). Reported: success per rollout and the flip rate (at least one success), with 95% intervals,
     and the paired difference per prompt. With --answer-in-context, a third arm on the same prompts: an ICL prompt
     whose one example is the prompt's own question with its reference answer, shaped like the model's shortest
     verified solution (the best example any retrieval could give: does the model read its context at all?);
  4. held-out pass@1 from --eval-samples samples per held-out problem.
Positional arguments are the trainer's key=value overrides (`xrpo train` takes the same).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = successes / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return (c - h, c + h)


def paired_t(diffs: list[float]) -> tuple[float, float]:
    """Mean and 95% Student-t half-width of paired differences."""
    from xrpo.algo.allocation import t_ci_half_width

    a = np.asarray(diffs, dtype=float)
    if len(a) < 2:
        return (float(a.mean()) if len(a) else float("nan"), float("nan"))
    return float(a.mean()), float(t_ci_half_width(a.std(ddof=1), len(a), 0.05))


def write_corpus(cfg, items: list[tuple[str, str, str]], path: str, exclude_seeds: list[int], log) -> None:
    """The distinct verified solutions as a seed-solution JSONL; ids get this run's seed as a prefix (the built-in
    task's ids repeat across seeds with other questions), and problems of the held-out splits of ``exclude_seeds``
    are left out (a study's runs validate on those: their answers must not reach the training prompts)."""
    import dataclasses

    from xrpo.trainer import setup

    banned: set[str] = set()
    for s in exclude_seeds:
        _, heldout = setup.load_data(dataclasses.replace(cfg, seed=s), log=lambda *_: None)
        banned |= {p.text for p in heldout}
    # a prompt's identical correct rollouts are one seed solution: the corpus stores a repeated one once anyway
    allowed = [i for i in items if i[1] not in banned]
    kept = list(dict.fromkeys(allowed))
    with open(path, "w", encoding="utf-8") as f:
        for pid, text, sol in kept:
            f.write(json.dumps({"problem_id": f"seed{cfg.seed}-{pid}", "problem": text, "solution": sol}) + "\n")
    log(
        f"wrote {len(kept)} verified solutions of {len({i[0] for i in kept})} problems to {path} "
        f"({len(items) - len(allowed)} of held-out questions left out, {len(allowed) - len(kept)} repeats)"
    )


def measure(
    cfg,
    *,
    prompts: int,
    n_base: int,
    extra: int,
    eval_samples: int,
    corpus_out: str | None = None,
    exclude_seeds: tuple[int, ...] = (),
    answer_in_context: bool = False,
    log=print,
) -> dict:
    import dataclasses

    from xrpo.rewards import get_verifier
    from xrpo.rollout.engine import SamplingParams
    from xrpo.rollout.validate import sample_and_score
    from xrpo.trainer import setup

    train, heldout = setup.load_data(cfg, log=log)
    train = train[:prompts]
    model, tokenizer, _ = setup.load_model(cfg, log=log)
    model.eval()
    engine = setup.build_engine(cfg, model, tokenizer)
    renderer = setup.make_renderer(cfg, tokenizer)
    verifier = get_verifier(cfg.data.verifier, **cfg.data.verifier_args)
    r = cfg.rollout
    base = SamplingParams(
        temperature=r.temperature, top_p=r.top_p, max_new_tokens=r.max_new_tokens, stop=tuple(r.stop), seed=cfg.seed
    )
    t0 = time.perf_counter()

    def draw(problems, n: int, offset: int, **kw):
        """``n`` samples per problem, each call from its own seed (the run's seed + ``offset``)."""
        params = dataclasses.replace(base, seed=cfg.seed + offset)
        return sample_and_score(problems, engine, verifier, renderer, n=n, sampling=params, **kw)

    # 1. base groups, and as many more plain rollouts (the group-size-2*n_base view and the plain arm of 3.)
    _, recs = draw(train, n_base, 0, keep_text=True)
    _, more = draw(train, extra, 1)
    c_base = np.array([d["c"] for d in recs])
    c_more = np.array([d["c"] for d in more])
    rate = (c_base + c_more) / (n_base + extra)
    zero_var = float(np.mean((c_base == 0) | (c_base == n_base)))
    never = c_base == 0

    # 2. the corpus: every verified correct base rollout, loaded at the start
    from xrpo.icl import ICLCorpus, get_embedder

    # this run's own solutions only (not rollout.icl_corpus: the measurement says what such a seed gives)
    corpus = ICLCorpus(get_embedder(cfg.rollout.embedder), max_per_problem=cfg.rollout.corpus_max_per_problem)
    items = [
        (p.id, p.text, text) for p, d in zip(train, recs) for text, ok in zip(d["completions"], d["correct"]) if ok
    ]
    if corpus_out:
        write_corpus(cfg, items, corpus_out, exclude_seeds, log)
    if items:
        corpus.add_many([i[0] for i in items], [i[1] for i in items], [i[2] for i in items], [0] * len(items))

    # 3. the prompts at 0/n_base: plain (already drawn) vs ICL-seeded extras
    hard = [int(i) for i in np.flatnonzero(never)]
    hard_problems = [train[i] for i in hard]
    examples = corpus.retrieve_many([p.id for p in hard_problems], [p.text for p in hard_problems], k=cfg.method.icl_k)
    icl_texts = [renderer.render_icl(p, ex).text for p, ex in zip(hard_problems, examples)]
    with_ex = [len(ex) > 0 for ex in examples]
    _, icl = draw(hard_problems, extra, 2, prompts=icl_texts) if hard else (None, [])
    c_icl = np.array([d["c"] for d in icl], dtype=int)
    c_plain = c_more[hard] if hard else np.array([], dtype=int)
    c_own = None
    if answer_in_context and hard:
        # the upper bound of any example: the prompt's own question with its answer, written as this model writes a
        # verified solution (a verified base completion with its extracted answer replaced by this prompt's
        # reference answer): can the model copy from its context?
        from xrpo.icl import Example

        shapes = [
            (text, ans)
            for d in recs
            for text, ok, ans in zip(d["completions"], d["correct"], d["answers"])
            if ok and ans and ans in text
        ]
        # the shortest: the least of another problem's working around the answer
        shape, said = min(shapes, key=lambda x: len(x[0])) if shapes else (" \\boxed{0}", "0")
        cut = shape.rfind(said)
        own = [
            [Example(p.id, p.text, shape[:cut] + str(p.answer) + shape[cut + len(said) :], 1.0)] for p in hard_problems
        ]
        log(f"answer in context: solutions shaped as {shape!r} (answer {said!r}); first prompt {own[0][0].solution!r}")
        own_texts = [renderer.render_icl(p, ex).text for p, ex in zip(hard_problems, own)]
        _, own_recs = draw(hard_problems, extra, 4, prompts=own_texts)
        c_own = np.array([d["c"] for d in own_recs], dtype=int)

    # 4. held-out pass@1
    ev, _ = draw(heldout, eval_samples, 3, ks=[1])
    seconds = time.perf_counter() - t0

    def arm(c: np.ndarray) -> dict:
        n_roll = int(len(c) * extra)
        s, f = int(c.sum()), int((c > 0).sum())
        return {
            "success_per_rollout": s / max(n_roll, 1),
            "success_per_rollout_ci": wilson(s, n_roll),
            "flip_rate": f / max(len(c), 1),
            "flip_rate_ci": wilson(f, len(c)),
        }

    diff, half = paired_t(list((c_icl - c_plain) / extra)) if hard else (float("nan"), float("nan"))
    successes = np.bincount(c_base + c_more, minlength=n_base + extra + 1)
    cells: dict[str, list[float]] = {}
    for p, x in zip(train, rate):
        md = p.metadata or {}
        if "family" in md:
            cells.setdefault(f"{md['family']}-L{md.get('difficulty', 0)}", []).append(float(x))
    return {
        "prompts": len(train),
        "n_base": n_base,
        "extra": extra,
        "zero_variance_groups_at_n_base": zero_var,
        "zero_variance_groups_at_2n": float(np.mean((rate == 0) | (rate == 1))),
        "all_wrong_at_n_base": float(np.mean(never)),
        "all_right_at_n_base": float(np.mean(c_base == n_base)),
        "mean_reward": float(rate.mean()),
        "prompts_by_successes": [int(x) for x in successes],
        "mean_reward_by_cell": {k: float(np.mean(v)) for k, v in sorted(cells.items())},
        "corpus_problems": len(corpus),
        "hard_prompts": len(hard),
        "hard_prompts_with_examples": int(sum(with_ex)),
        "plain": arm(c_plain),
        "icl": arm(c_icl),
        "icl_minus_plain_per_rollout": diff,
        "icl_minus_plain_per_rollout_ci95": half,
        **(
            {
                "answer_in_context": arm(c_own),
                "answer_in_context_minus_plain_per_rollout": paired_t(list((c_own - c_plain) / extra)),
            }
            if c_own is not None
            else {}
        ),
        "heldout_pass@1": ev["eval/pass@1"],
        "heldout_problems": len(heldout),
        "eval_samples": eval_samples,
        "seconds": seconds,
    }


def markdown(m: dict, label: str) -> str:
    bins = " ".join(str(c) for c in m["prompts_by_successes"])
    pl, ic = m["plain"], m["icl"]

    def ci(x):
        return f"[{x[0]:.3f}, {x[1]:.3f}]"

    return "\n".join(
        [
            f"| {label} | {m['heldout_pass@1']:.3f} | {m['zero_variance_groups_at_n_base']:.1%} | "
            f"{m['mean_reward']:.3f} | {m['hard_prompts']} | "
            f"{pl['success_per_rollout']:.3f} {ci(pl['success_per_rollout_ci'])}"
            f" | {ic['success_per_rollout']:.3f} {ci(ic['success_per_rollout_ci'])} | {pl['flip_rate']:.3f} / "
            f"{ic['flip_rate']:.3f} | {bins} |"
        ]
    )


HEADER = (
    "| regime | held-out pass@1 | zero-variance groups (n_base) | mean reward | prompts at 0/n_base | plain success "
    "per rollout [95%] | ICL success per rollout [95%] | flip rate plain / ICL | prompts with 0, 1, ... successes "
    "of n_base + extra |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="trainer key=value overrides")
    ap.add_argument("--config", help="a trainer YAML config (as `xrpo train --config`)")
    ap.add_argument("--prompts", type=int, default=512, help="training prompts measured")
    ap.add_argument("--n-base", type=int, default=None, help="base rollouts per prompt (default: method.n_base)")
    ap.add_argument("--extra", type=int, default=4, help="extra rollouts per prompt, plain and ICL")
    ap.add_argument("--eval-samples", type=int, default=16)
    ap.add_argument("--label", default=None, help="row label in the Markdown table")
    ap.add_argument("--json", help="write the measurements here")
    ap.add_argument(
        "--corpus-out",
        help="write the verified correct base rollouts here as a seed-solution JSONL (rollout.icl_corpus)",
    )
    ap.add_argument(
        "--exclude-heldout-seeds",
        type=int,
        nargs="*",
        default=[],
        help="--corpus-out leaves out the questions of these seeds' held-out splits",
    )
    ap.add_argument(
        "--answer-in-context",
        action="store_true",
        help="a third arm on the prompts at 0/n_base: the ICL prompt holds the prompt's own question and answer as its "
        "one example (no retrieval can do better): does the model use its context at all?",
    )
    args = ap.parse_args(argv)
    import torch

    from xrpo.trainer.config_loader import build_config

    cfg = build_config(args.config, args.overrides)
    torch.set_num_threads(cfg.threads or 1)
    torch.manual_seed(cfg.seed)
    n_base = args.n_base or cfg.method.n_base
    m = measure(
        cfg,
        prompts=args.prompts,
        n_base=n_base,
        extra=args.extra,
        eval_samples=args.eval_samples,
        corpus_out=args.corpus_out,
        exclude_seeds=tuple(args.exclude_heldout_seeds),
        answer_in_context=args.answer_in_context,
    )
    m["config"] = args.config
    m["overrides"] = args.overrides
    label = args.label or " ".join([args.config or "default"] + args.overrides)
    print(HEADER)
    print(markdown(m, label))
    if "answer_in_context" in m:
        a = m["answer_in_context"]
        lo, hi = a["success_per_rollout_ci"]
        print(
            f"answer in context (the prompt's own question and answer as the example): success per rollout "
            f"{a['success_per_rollout']:.3f} [{lo:.3f}, {hi:.3f}], flip rate {a['flip_rate']:.3f}; minus plain, "
            "paired: {:+.3f} ± {:.3f}".format(*m["answer_in_context_minus_plain_per_rollout"])
        )
    print(json.dumps(m, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(m, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
