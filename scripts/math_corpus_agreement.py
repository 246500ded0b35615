"""How often the math verifier agrees with the hand labels of tests/rewards/math_corpus.jsonl, and how often
math-verify's own reading of each whole completion (`math_verify.parse` + `math_verify.verify`, its default
extraction targets) does: the figures of docs/rewards.md.

    python scripts/math_corpus_agreement.py          # the tables
    python scripts/math_corpus_agreement.py --list   # and every case where a grader and the hand label differ

With PYTHONPATH pointing at another checkout it measures that checkout's verifier on the same corpus (a verifier
without the `last_number` option skips that row).
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
from collections import Counter
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "rewards" / "math_corpus.jsonl"


def load(path: Path = CORPUS) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def math_verify_verdict(completion: str, reference: str) -> int | None:
    """math-verify on the whole completion, the reference boxed as a bare answer; None when it extracts nothing."""
    from math_verify import parse, verify

    gold = parse("\\boxed{" + reference + "}", parsing_timeout=None)
    pred = parse(completion, parsing_timeout=None)
    if not gold or not pred:
        return None
    return int(verify(gold, pred, timeout_seconds=None))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print every disagreement with the hand label")
    args = ap.parse_args()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    from xrpo.rewards import MathVerifier

    cases = load()
    comps, refs = [c["completion"] for c in cases], [c["reference"] for c in cases]
    hand = [c["expected"] for c in cases]
    # what the text says, for graders that read a completion without a marker (its last number)
    hand_text = [c.get("expected_last_number", c["expected"]) for c in cases]
    xrpo = [int(r.score) for r in MathVerifier(in_process=True).verify_batch(comps, refs)]
    rows = [("xrpo math verifier", xrpo, hand, range(len(cases)))]
    xrpo_ln = None
    if "last_number" in inspect.signature(MathVerifier).parameters:
        xrpo_ln = [int(r.score) for r in MathVerifier(in_process=True, last_number=True).verify_batch(comps, refs)]
        rows.append(("xrpo, last_number=True", xrpo_ln, hand_text, range(len(cases))))
    mv = [math_verify_verdict(c, r) for c, r in zip(comps, refs)]
    has = [i for i, v in enumerate(mv) if v is not None]
    rows.append((f"math-verify, on the {len(has)} cases it extracts an answer from", mv, hand_text, has))
    print(f"{len(cases)} cases ({sum(hand)} correct by hand), {CORPUS.relative_to(CORPUS.parents[2])}")
    print("\n| grader | agrees with the hand label | false positives (scores 1, hand 0) | false negatives |")
    print("|---|---|---|---|")
    for name, got, want, idx in rows:
        agree = sum(got[i] == want[i] for i in idx)
        fp = sum(got[i] == 1 and want[i] == 0 for i in idx)
        fn = sum(got[i] == 0 and want[i] == 1 for i in idx)
        print(f"| {name} | {agree} / {len(idx)} | {fp} | {fn} |")
    print()
    for name, mine in (("default", xrpo), ("last_number=True", xrpo_ln)):
        if mine is not None:
            same = sum(mv[i] == mine[i] for i in has)
            print(f"xrpo ({name}) and math-verify give the same verdict on {same} of those {len(has)} cases")
    print("\n| kind or source | cases | xrpo agrees with hand | math-verify agrees with hand (of its verdicts) |")
    print("|---|---|---|---|")
    groups = Counter(c["kind"] for c in cases) + Counter(c["source"] for c in cases if c["source"] != "written")
    for group in groups:
        idx = [i for i, c in enumerate(cases) if group in (c["kind"], c["source"])]
        ok = sum(xrpo[i] == hand[i] for i in idx)
        theirs = [i for i in idx if mv[i] is not None]
        print(f"| {group} | {len(idx)} | {ok} | {sum(mv[i] == hand_text[i] for i in theirs)} / {len(theirs)} |")
    if args.list:
        for name, got, want in (("xrpo", xrpo, hand), ("math-verify", mv, hand_text)):
            print(f"\n{name} differs from the hand label:")
            for i, c in enumerate(cases):
                if got[i] is not None and got[i] != want[i]:
                    text, ref = c["completion"][-160:], c["reference"]
                    print(f"  [{c['kind']}] hand {want[i]}, {name} {got[i]}: {text!r} vs {ref!r}")


if __name__ == "__main__":
    main()
