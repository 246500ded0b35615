"""Fixtures for the study harness tests: study/ on the import path, and a tiny model + problem files + a user
verifier with mixed rewards, written to disk so that `xrpo train` subprocesses can load them."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

STUDY = Path(__file__).resolve().parents[2] / "study"

# reward 1 for an even number of characters: a random model gets mixed rewards, so every method has a signal
PARITY = textwrap.dedent("""
    from xrpo.rewards import VerifyResult

    def verify(completion, reference):
        return VerifyResult(score=float(len(completion) % 2 == 0), answer=str(len(completion) % 2))
""")


@pytest.fixture(scope="session")
def study_modules():
    sys.path.insert(0, str(STUDY))
    import run_study
    import study_report

    yield run_study, study_report
    sys.path.remove(str(STUDY))


@pytest.fixture(scope="session")
def study_env(tmp_path_factory):
    from xrpo.models.tiny import build_tiny_model, build_tiny_tokenizer

    root = tmp_path_factory.mktemp("study_env")
    texts = [f"Q: {a} + {b} = ?\nA: \\boxed{{{a + b}}}" for a in range(30) for b in range(0, 30, 7)]
    tok = build_tiny_tokenizer(texts)
    model = build_tiny_model(tok, d_model=32, layers=2, heads=2, ffn=64, seed=0)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    (root / "train.jsonl").write_text(
        "".join(
            json.dumps({"id": f"t{i}", "problem": f"{i} + {i + 1} = ?", "answer": str(2 * i + 1)}) + "\n"
            for i in range(24)
        )
    )
    (root / "heldout.jsonl").write_text(
        "".join(json.dumps({"id": f"h{i}", "problem": f"{i} + 3 = ?", "answer": str(i + 3)}) + "\n" for i in range(4))
    )
    (root / "study_parity_verifier.py").write_text(PARITY)
    overrides = [
        f"model.path={root / 'model'}",
        f"data.train={root / 'train.jsonl'}",
        f"data.heldout={root / 'heldout.jsonl'}",
        "data.verifier=study_parity_verifier:verify",
        "rollout.prompts_per_step=4",
        "rollout.rollouts_per_step=16",
        "rollout.max_new_tokens=6",
        "rollout.embedder=hash",
        "log_samples_every=0",
        "optim.lr=1e-2",
        "optim.micro_batch_tokens=64",
        "data.prompt_template=Q: {prompt}\nA:",
    ]
    return {"root": root, "overrides": overrides}
