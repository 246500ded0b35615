"""Throughput of the `math` verifier's verify_batch on typical completions.

    python benchmarks/bench_rewards.py [--n 1000] [--workers N] [--timeout 5]

A "typical" completion is ~1.5k characters of reasoning ending in a boxed answer. The mix (fixed seed):
40% the reference verbatim (settled by the exact-match fast path), 25% an equivalent answer in another form
(0.5 vs 1/2, reordered set: math-verify decides), 25% a wrong answer (math-verify decides), 10% no final answer;
seven answer kinds (integers, fractions, roots, sets, intervals, thousands separators, polynomials) with random
values, in groups of 8 completions per reference as in GRPO. Reports wall time and items/s for the pooled verifier
(cold: the call that starts the worker pool; warm: another batch on the running pool) and for in-process mode on
the warm batch.

    python benchmarks/bench_rewards.py --first-item [--repeats 5]

The time a new worker takes over its first answers that reach sympy (a large power against a wrong reference, then
another): what a worker started after a timeout kill spends inside the next item's time limit. Each repeat starts a
new pool of one worker (its start is not timed: a trivial answer goes first).
"""

from __future__ import annotations

import argparse
import random
import time

from xrpo.rewards import MathVerifier, shutdown_pools


def random_answer(rng: random.Random) -> tuple[str, str, str]:
    """(reference, an equivalent answer written differently, a wrong answer) of a random kind."""
    a, b = rng.randint(1, 40), rng.randint(41, 90)
    kind = rng.randrange(7)
    if kind == 0:
        return str(a * b), f"{a * b}.0", str(a * b + 1)
    if kind == 1:
        den = rng.choice([2, 4, 5, 8])
        return rf"\frac{{{a}}}{{{den}}}", str(a / den), rf"\frac{{{a}}}{{{den + 1}}}"
    if kind == 2:
        m = rng.choice([2, 3, 5, 6, 7])
        return rf"{a}\sqrt{{{m}}}", rf"\sqrt{{{a * a * m}}}", rf"{a + 1}\sqrt{{{m}}}"
    if kind == 3:
        return rf"\{{{a},{b}\}}", rf"\{{{b}, {a}\}}", rf"\{{{a},{b + 1}\}}"
    if kind == 4:
        return f"({a},{b}]", rf"\left({a}, {b}\right]", f"[{a},{b}]"
    if kind == 5:
        n = 1000 * b + a
        return str(n), f"{n // 1000},{n % 1000:03d}", str(n + 10)
    return rf"x^2+{2 * a}x+{a * a}", f"(x+{a})^2", rf"x^2+{a * a}"


FILLER = (
    "Let us consider the problem carefully. We first rewrite the expression, then substitute the known values "
    "and simplify step by step, checking each intermediate result. "
)


def make_batch(n: int, seed: int, group: int = 8) -> tuple[list[str], list[str]]:
    """`n` completions for `n / group` prompts (GRPO groups: each reference repeats `group` times)."""
    rng = random.Random(seed)
    completions, references = [], []
    for i in range(n):
        if i % group == 0:
            ref, equiv, wrong = random_answer(rng)
        body = FILLER * 10
        u = rng.random()
        if u < 0.40:
            tail = f"Therefore the answer is $\\boxed{{{ref}}}$."
        elif u < 0.65:
            tail = f"Therefore the answer is $\\boxed{{{equiv}}}$."
        elif u < 0.90:
            tail = f"Therefore the answer is $\\boxed{{{wrong}}}$."
        else:
            tail = "I could not finish the computation."
        completions.append(body + tail)
        references.append(ref)
    return completions, references


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=5.0)
    ap.add_argument("--first-item", action="store_true", help="time a new worker's first answers instead")
    ap.add_argument("--repeats", type=int, default=5, help="with --first-item: new pools to time")
    args = ap.parse_args()
    if args.first_item:
        first_item(args.repeats, args.timeout)
        return
    pooled = MathVerifier(timeout=args.timeout, workers=args.workers)
    # cold: the first call starts the pool; warm: a second, different batch on the running pool
    for seed, label in ((0, "pooled, cold"), (1, "pooled, warm")):
        completions, references = make_batch(args.n, seed)
        start = time.perf_counter()
        out = pooled.verify_batch(completions, references)
        wall = time.perf_counter() - start
        print(
            f"{label:14s} workers={pooled.workers}: {wall:6.2f} s  {args.n / wall:7.1f} items/s  "
            f"mean score {sum(r.score for r in out) / len(out):.3f}  "
            f"timeouts {sum(r.reason == 'timeout' for r in out)}"
        )
    shutdown_pools()

    inline = MathVerifier(in_process=True)
    start = time.perf_counter()
    out_inline = inline.verify_batch(completions, references)
    wall = time.perf_counter() - start
    print(
        f"{'in-process':14s}           : {wall:6.2f} s  {args.n / wall:7.1f} items/s  "
        f"same verdicts as pooled: {[r.score for r in out_inline] == [r.score for r in out]}"
    )


def first_item(repeats: int, timeout: float) -> None:
    firsts, seconds = [], []
    for _ in range(repeats):
        v = MathVerifier(timeout=timeout, workers=1)
        v.verify_batch([r"\boxed{\frac{1}{2}}"], ["0.5"])  # starts the pool; not timed
        for answer, reference, into in ((r"\boxed{2^{1000}}", "5", firsts), (r"\boxed{3^{1000}}", "7", seconds)):
            start = time.perf_counter()
            (r,) = v.verify_batch([answer], [reference])
            into.append(time.perf_counter() - start)
            assert r.reason == "mismatch", r
        shutdown_pools()
    med = sorted(firsts)[len(firsts) // 2], sorted(seconds)[len(seconds) // 2]
    print(
        f"new worker, {repeats} pools: first answer through sympy {med[0] * 1e3:.1f} ms (median; all: "
        f"{', '.join(f'{t * 1e3:.0f}' for t in firsts)}), the next {med[1] * 1e3:.1f} ms"
    )


if __name__ == "__main__":
    main()
