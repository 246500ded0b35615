"""Throughput and overhead of the sandboxed code verifier (xrpo/rewards/code.py, xrpo/sandbox/programs.py).

1. verdicts per second for a batch of small programs (a mix of pass / fail / timeout), `--workers` sandboxes at once;
2. overhead per program: one sandboxed run (start-up, isolation, harness, clean-up) against running the same program
   bare (`python -I -S -c CODE` with the input on stdin), measured interleaved, median of `--repeats`;
3. the grader's own comparison of a large correct output (1,000,000 integer tokens, 6.9 MB, laid out differently
   from the expected output so that every token is compared), median of 5: work done in the caller's thread.

    python benchmarks/bench_code.py --batch 256 --workers 2 --repeats 30

Before / after a change, on the same machine state: ``--ab OTHER_CHECKOUT`` alternates batches of this checkout and
another one (each in a fresh interpreter importing its own xrpo; which goes first alternates too) and reports the
median verdicts/s of each and their ratio; only this makes a ratio on a shared, noisy machine meaningful.

    python benchmarks/bench_code.py --ab /tmp/xrpo-before --rounds 12 --batch 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from xrpo.rewards import CodeVerifier
from xrpo.sandbox import Limits, probe, run_program

PASS = "a, b = map(int, input().split())\nprint(a + b)"
FAIL = "a, b = map(int, input().split())\nprint(a - b)"
HANG = "while True:\n    pass"
TESTS = json.dumps([{"input": f"{a} {b}\n", "output": f"{a + b}\n"} for a, b in [(1, 2), (5, 7), (10, 0)]])


def batch(n: int, timeout_share: float) -> tuple[list[str], list[str]]:
    n_hang = round(n * timeout_share)
    comps = []
    for i in range(n):
        # distinct programs (a trailing comment), so that the verifier's de-duplication does not skip any
        code = HANG if i < n_hang else (PASS if i % 2 else FAIL)
        comps.append(f"```python\n{code}\n# {i}\n```")
    return comps, [TESTS] * n


def one_batch(n: int, workers: int, timeout: float) -> None:
    """Print the verdicts/s of one batch of `n` programs without hung ones (a child of `ab`)."""
    v = CodeVerifier(workers=workers, timeout=timeout, sample_timeout=4 * timeout, memory_mb=512)
    comps, refs = batch(n, 0.0)
    t0 = time.perf_counter()
    results = v.verify_batch(comps, refs)
    dt = time.perf_counter() - t0
    assert sum(r.score for r in results) == n // 2, [r.reason for r in results]
    print(n / dt)


def ab(other: str, rounds: int, n: int, workers: int, timeout: float) -> None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this": here, "other": os.path.abspath(other)}
    rates: dict[str, list[float]] = {k: [] for k in trees}
    print(f"A/B: this = {here}, other = {trees['other']}; load before: {os.getloadavg()[0]:.2f}")
    for r in range(rounds):
        for name in ("this", "other") if r % 2 == 0 else ("other", "this"):
            env = dict(os.environ, PYTHONPATH=trees[name])
            out = subprocess.run(
                [
                    sys.executable,
                    os.path.abspath(__file__),
                    "--one-batch",
                    str(n),
                    "--workers",
                    str(workers),
                    "--timeout",
                    str(timeout),
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            rates[name].append(float(out.stdout.split()[-1]))
    med = {k: statistics.median(v) for k, v in rates.items()}
    for k, v in rates.items():
        print(f"{k}: median {med[k]:.1f} verdicts/s over {rounds} batches of {n} (min {min(v):.1f}, max {max(v):.1f})")
    print(f"ratio this / other: {med['this'] / med['other']:.3f}; load after: {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout-share", type=float, default=1 / 16, help="fraction of programs that never stop")
    ap.add_argument("--timeout", type=float, default=1.0, help="per-test wall-clock limit")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--ab", metavar="CHECKOUT", help="compare with another checkout, interleaved (module docstring)")
    ap.add_argument("--rounds", type=int, default=12, help="--ab: batches per checkout")
    ap.add_argument("--one-batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_batch:
        return one_batch(args.one_batch, args.workers, args.timeout)
    if args.ab:
        return ab(args.ab, args.rounds, args.batch, args.workers, args.timeout)
    print(f"isolation layers: {', '.join(probe())}; load before: {os.getloadavg()[0]:.2f}")

    v = CodeVerifier(workers=args.workers, timeout=args.timeout, sample_timeout=4 * args.timeout, memory_mb=512)
    comps, refs = batch(args.batch, args.timeout_share)
    t0 = time.perf_counter()
    results = v.verify_batch(comps, refs)
    dt = time.perf_counter() - t0
    reasons: dict = {}
    for r in results:
        reasons[r.reason] = reasons.get(r.reason, 0) + 1
    print(f"batch {args.batch} ({reasons}), {args.workers} workers: {dt:.2f} s, {args.batch / dt:.1f} verdicts/s")
    comps, refs = batch(args.batch, 0.0)
    t0 = time.perf_counter()
    v.verify_batch(comps, refs)
    dt = time.perf_counter() - t0
    print(f"batch {args.batch} without timeouts: {dt:.2f} s, {args.batch / dt:.1f} verdicts/s")

    # overhead of one program with one test: sandboxed (auto / minimal) vs bare, interleaved
    limits = Limits(timeout=10, sample_timeout=20, memory_mb=512)
    times: dict[str, list[float]] = {"bare": [], "minimal": [], "auto": []}
    for _ in range(args.repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-I", "-S", "-c", PASS], input=b"1 2\n", capture_output=True, check=True)
        times["bare"].append(time.perf_counter() - t)
        for iso in ("minimal", "auto"):
            t = time.perf_counter()
            res = run_program(PASS, "stdin", ["1 2\n"], limits=limits, isolation=iso)
            times[iso].append(time.perf_counter() - t)
            assert res.tests[0].stdout == b"3\n", res
    med = {k: statistics.median(v) * 1000 for k, v in times.items()}
    print(
        f"one program, one test (median of {args.repeats}, ms): bare {med['bare']:.1f}, "
        f"sandbox minimal {med['minimal']:.1f} (+{med['minimal'] - med['bare']:.1f}), "
        f"sandbox auto {med['auto']:.1f} (+{med['auto'] - med['bare']:.1f})"
    )
    # marginal cost of one more test in the same program
    for n in (1, 21):
        ts = []
        for _ in range(max(5, args.repeats // 3)):
            t = time.perf_counter()
            run_program(PASS, "stdin", ["1 2\n"] * n, limits=limits)
            ts.append(time.perf_counter() - t)
        med[f"tests{n}"] = statistics.median(ts) * 1000
    print(f"per extra test: {(med['tests21'] - med['tests1']) / 20:.1f} ms")

    from xrpo.rewards.code_compare import compare_stdout

    out = " ".join(map(str, range(10**6))) + "\n"
    want = "\n".join(map(str, range(10**6)))
    ts = []
    for _ in range(5):
        t = time.perf_counter()
        ok, _why = compare_stdout(out, want)
        ts.append(time.perf_counter() - t)
        assert ok
    print(
        f"comparing 1,000,000 tokens ({len(out) / 1e6:.1f} MB): {statistics.median(ts) * 1000:.0f} ms; "
        f"load after: {os.getloadavg()[0]:.2f}"
    )


if __name__ == "__main__":
    main()
