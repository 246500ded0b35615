"""Per-step cost of XRPO's pure math: rollout planning, GRPO advantages, Eq. (4) scores, novelty and sharpening.

One training step of Algorithm 1 calls, on the host:
    plan_phases + allocate_round (round 1) + allocate_round (round 2)         planning (Section 3.2)
    group_advantages                                                            GRPO advantage (Section 2.1)
    length_normalized_loglik over the (B, T) token log-probs                  Eq. (4)
    sharpen_advantages (computes the novelty of Eq. (5) itself)                Eqs. (5)-(6)
`novelty` is also timed alone for reference; it is not added to the step (sharpen_advantages recomputes it).

Beyond the paper: xrpo-plus's planning (plan_phases + posterior_allocation per round, from the same
rounds' rewards, with an 8-rollout earlier visit per prompt) against HRP's planning in the same run, and Knapsack
RL's allocation of the whole step budget from the earlier visit (knapsack_allocation, capped at 4x the even share
per prompt: its value table has one column per count, so no cap would mean Q x B entries), both as read from its
paper (knapsack_fallback=leftover) and as its authors' code computes it (authors_allocation, n_max 128).

Rewards are Bernoulli with a per-prompt success rate drawn uniformly (about 1/4 of prompts all-wrong or
all-right, as in training); token log-probs are float32 with completion lengths uniform in [1, T].

    python benchmarks/bench_algo.py            # full tables
    python benchmarks/bench_algo.py --quick    # small sizes, few repeats: a sanity run
    python benchmarks/bench_algo.py --compare OLD_TREE   # this xrpo.algo.advantages against another checkout's,
                                                         # interleaved in one process (before/after of a change)

"torch" rows pass CPU tensors, as verl's estimator does (the functions take them through numpy.asarray).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import time

import numpy as np
import torch

from xrpo.algo.advantages import group_advantages, length_normalized_loglik, novelty, sharpen_advantages
from xrpo.algo.allocation import allocate_round, plan_phases
from xrpo.algo.knapsack import knapsack_allocation
from xrpo.algo.knapsack_rl import authors_allocation
from xrpo.algo.posterior_alloc import posterior_allocation


def make_step_inputs(num_prompts: int, per_prompt: int, T: int, seed: int = 0):
    """Rewards per round, the final batch, and the (B, T) log-prob tensor of one simulated step."""
    rng = np.random.default_rng(seed)
    n_base = per_prompt // 2
    plan = plan_phases(num_prompts, num_prompts * per_prompt, n_base, 2)
    rate = rng.random(num_prompts)
    rate[: num_prompts // 8] = 0.0  # hard prompts: all wrong
    rate[num_prompts // 8 : num_prompts // 4] = 1.0  # easy prompts: all right
    draw = lambda q, k: (rng.random(k) < rate[q]).astype(np.float64)  # noqa: E731
    round1 = [draw(q, n_base) for q in range(num_prompts)]
    extra1 = allocate_round(round1, plan.round_budgets[0])
    round2 = [np.concatenate([r, draw(q, int(k))]) for q, (r, k) in enumerate(zip(round1, extra1))]
    extra2 = allocate_round(round2, plan.round_budgets[1])
    final = [np.concatenate([r, draw(q, int(k))]) for q, (r, k) in enumerate(zip(round2, extra2))]
    rewards = np.concatenate(final)
    group_ids = np.repeat(np.arange(num_prompts) * 7 + 3, [len(r) for r in final])  # non-contiguous ids
    perm = rng.permutation(len(rewards))  # rollouts arrive in any order
    rewards, group_ids = rewards[perm], group_ids[perm]
    B = len(rewards)
    lengths = rng.integers(1, T + 1, B)
    mask = np.arange(T)[None, :] < lengths[:, None]
    logprobs = np.log(rng.random((B, T), dtype=np.float32) * 0.99 + 0.01)
    return dict(
        plan_args=(num_prompts, num_prompts * per_prompt, n_base, 2),
        budgets=plan.round_budgets,
        round1=round1,
        round2=round2,
        rewards=rewards,
        group_ids=group_ids,
        logprobs=logprobs,
        mask=mask,
    )


def interleaved_medians_ms(fns: dict, repeats: int) -> dict[str, float]:
    """Median time of each function; the repeats go round-robin over the functions so that a burst of load from
    another process on a shared machine spreads over all of them instead of inflating one."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) * 1e3 for name, v in times.items()}


def time_components(inp: dict, backend: str, repeats: int, alloc_mode: str = "proportional") -> dict[str, float]:
    if backend == "torch":
        rewards, gids = torch.from_numpy(inp["rewards"]), torch.from_numpy(inp["group_ids"])
        logprobs, mask = torch.from_numpy(inp["logprobs"]), torch.from_numpy(inp["mask"])
    else:
        rewards, gids, logprobs, mask = inp["rewards"], inp["group_ids"], inp["logprobs"], inp["mask"]
    adv = group_advantages(rewards, gids)
    scores = length_normalized_loglik(logprobs, mask)

    def planning():
        plan_phases(*inp["plan_args"])
        allocate_round(inp["round1"], inp["budgets"][0], mode=alloc_mode)
        allocate_round(inp["round2"], inp["budgets"][1], mode=alloc_mode)

    out = interleaved_medians_ms(
        {
            "planning": planning,
            "group_advantages": lambda: group_advantages(rewards, gids),
            "length_normalized_loglik": lambda: length_normalized_loglik(logprobs, mask),
            "novelty": lambda: novelty(scores, gids),
            "sharpen_advantages": lambda: sharpen_advantages(adv, rewards, scores, gids),
        },
        repeats,
    )
    out["step"] = (
        out["planning"] + out["group_advantages"] + out["length_normalized_loglik"] + out["sharpen_advantages"]
    )
    out["step w/o (B,T)"] = out["step"] - out["length_normalized_loglik"]
    return out


def time_allocators(inp: dict, repeats: int) -> dict[str, float]:
    """Planning time of one step (ms): HRP (plan_phases + 2 allocate_round), xrpo-plus (plan_phases + the rewards'
    counts + 2 posterior_allocation, with an earlier visit of 8 rollouts per prompt) and Knapsack RL (one
    knapsack_allocation of the whole budget from that visit, n_max = 4 B / Q; and the authors' rule,
    authors_allocation, from the same visit's rate, their recipe's n_max 128), interleaved."""
    rng = np.random.default_rng(1)
    Q = inp["plan_args"][0]
    rate = np.array([r.mean() for r in inp["round2"]])
    hist_n = np.full(Q, 8)
    hist_k = rng.binomial(hist_n, rate)

    def hrp():
        plan_phases(*inp["plan_args"])
        allocate_round(inp["round1"], inp["budgets"][0])
        allocate_round(inp["round2"], inp["budgets"][1])

    def plus():
        plan_phases(*inp["plan_args"])
        for rnd, b in ((inp["round1"], inp["budgets"][0]), (inp["round2"], inp["budgets"][1])):
            k = np.array([r.sum() for r in rnd])
            m = np.array([r.shape[0] for r in rnd])
            posterior_allocation(k, m, b, history_successes=hist_k, history_trials=hist_n)

    def knapsack():
        knapsack_allocation(hist_k, hist_n, inp["plan_args"][1], n_max=4 * inp["plan_args"][1] // Q)

    def authors():  # 8 rewards seen: every prompt's rate counts (knapsack_min_rewards 8)
        authors_allocation(hist_k / hist_n, hist_n >= 8, inp["plan_args"][1], n_max=128)

    return interleaved_medians_ms({"hrp": hrp, "xrpo-plus": plus, "knapsack": knapsack, "authors": authors}, repeats)


def compare_advantages(old_tree: str, repeats: int, T: int) -> None:
    """Time the four functions of this tree's `xrpo.algo.advantages` and of ``old_tree``'s, interleaved, and check
    that both give the same numbers. The other file is loaded by path under another module name; it may import only
    third-party modules and ``xrpo.algo.tree`` (served from this tree)."""
    path = os.path.join(old_tree, "xrpo", "algo", "advantages.py")
    spec = importlib.util.spec_from_file_location("bench_old_advantages", path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    import xrpo.algo.advantages as new

    print(f"\nBefore/after: {path} (old) against {new.__file__} (new); ms, ratio new / old\n")
    print("| setting | inputs | function | old | new | new / old |")
    print("|---|---|---|---|---|---|")
    for (q, g), backend in [(s, b) for s in [(64, 256), (1024, 64)] for b in ("numpy", "torch")]:
        inp = make_step_inputs(q, g, T)
        r, gids, lp, mask = inp["rewards"], inp["group_ids"], inp["logprobs"], inp["mask"]
        if backend == "torch":
            r, gids, lp, mask = (torch.from_numpy(x) for x in (r, gids, lp, mask))
        fns, outs = {}, {}
        for tag, mod in (("old", old), ("new", new)):
            adv = mod.group_advantages(r, gids)
            scores = mod.length_normalized_loglik(lp, mask)
            outs[tag] = [adv, scores, mod.novelty(scores, gids), mod.sharpen_advantages(adv, r, scores, gids)[0]]
            fns[(tag, "group_advantages")] = lambda m=mod, r=r, gids=gids: m.group_advantages(r, gids)
            fns[(tag, "length_normalized_loglik")] = lambda m=mod, lp=lp, mask=mask: m.length_normalized_loglik(
                lp, mask
            )
            fns[(tag, "novelty")] = lambda m=mod, s=scores, gids=gids: m.novelty(s, gids)
            fns[(tag, "sharpen_advantages")] = lambda m=mod, a=adv, s=scores, r=r, gids=gids: m.sharpen_advantages(
                a, r, s, gids
            )
        for a, b in zip(outs["old"], outs["new"]):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        t = interleaved_medians_ms(fns, repeats)
        for name in ("group_advantages", "length_normalized_loglik", "novelty", "sharpen_advantages"):
            o, n = t[("old", name)], t[("new", name)]
            print(f"| {q} x {g} | {backend} | {name} | {o:.3f} | {n:.3f} | {n / o:.2f} |")
    print("\n(outputs of old and new identical, bit for bit)")


def step_tables(settings, scaling, repeats: int, T: int) -> None:
    """The per-step tables: each component per setting and backend, then the scaling in the number of rollouts."""
    cols = [
        "planning",
        "group_advantages",
        "length_normalized_loglik",
        "novelty",
        "sharpen_advantages",
        "step",
        "step w/o (B,T)",
    ]
    print("| setting | backend | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 2) + "|")
    for q, g in settings:
        inp = make_step_inputs(q, g, T)
        for backend in ("numpy", "torch"):
            r = time_components(inp, backend, repeats)
            print(f"| {q} x {g} ({q * g:,} rollouts) | {backend} | " + " | ".join(f"{r[c]:.2f}" for c in cols) + " |")
        # greedy planning hands out rollouts one at a time (a heap): shown for comparison with the default
        r = time_components(inp, "numpy", max(3, repeats // 3), alloc_mode="greedy")
        print(f"| {q} x {g} ({q * g:,} rollouts) | numpy, greedy planning | {r['planning']:.2f} | | | | | | |")

    print("\nScaling in the number of rollouts (numpy, proportional planning):\n")
    print("| rollouts | step (ms) | us / rollout | step w/o (B,T) (ms) | us / rollout |")
    print("|---|---|---|---|---|")
    for q, g in scaling:
        inp = make_step_inputs(q, g, T)
        r = time_components(inp, "numpy", repeats)
        n = q * g
        print(
            f"| {n:,} ({q} x {g}) | {r['step']:.2f} | {1e3 * r['step'] / n:.3f} | {r['step w/o (B,T)']:.2f} | "
            f"{1e3 * r['step w/o (B,T)'] / n:.3f} |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes and 3 repeats (sanity run)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per figure (median; default 15)")
    ap.add_argument("--tokens", type=int, default=512, help="T, tokens per completion in the log-prob tensor")
    ap.add_argument(
        "--allocation-only", action="store_true", help="only the planning-time table of the allocators beyond the paper"
    )
    ap.add_argument(
        "--compare",
        metavar="OLD_TREE",
        default=None,
        help="also time another checkout's xrpo/algo/advantages.py against this one (before/after)",
    )
    args = ap.parse_args()
    repeats = args.repeats or (3 if args.quick else 15)
    T = 64 if args.quick else args.tokens
    settings = [(16, 32), (64, 32)] if args.quick else [(64, 256), (1024, 64)]
    scaling = [(16, 8), (16, 16), (16, 32)] if args.quick else [(64, 32), (64, 64), (64, 128), (64, 256)]

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads), numpy {np.__version__}; "
        f"T = {T} tokens; median of {repeats} interleaved repeats; times in ms; "
        f"load average at start {os.getloadavg()[0]:.2f}\n"
    )

    if not args.allocation_only:
        step_tables(settings, scaling, repeats, T)
    print("\nAllocation beyond the paper: planning time per step, ms (median, interleaved):\n")
    print(
        "| setting | HRP planning | xrpo-plus planning | xrpo-plus / HRP | Knapsack RL, the rule read from its paper "
        "(whole budget, n_max 4 B/Q) | Knapsack RL, the authors' rule (n_max 128) |"
    )
    print("|---|---|---|---|---|---|")
    for q, g in settings:
        inp = make_step_inputs(q, g, 8)
        r = time_allocators(inp, repeats)
        print(
            f"| {q} x {g} ({q * g:,} rollouts) | {r['hrp']:.2f} | {r['xrpo-plus']:.2f} | "
            f"{r['xrpo-plus'] / r['hrp']:.2f} | {r['knapsack']:.1f} | {r['authors']:.1f} |"
        )
    if args.compare:
        compare_advantages(args.compare, repeats, T)
    print(f"\nload average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
