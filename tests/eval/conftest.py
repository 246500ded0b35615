"""Fixtures for evaluation tests: a tiny model saved to disk (xrpo eval loads models by path, as for real ones), small
problem files, a user verifier with mixed verdicts for a random model, and a tiny finished training run."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

# verdict: right when the completion has an even number of characters; the parsed answer is that parity, so a random
# model gets mixed counts (pass@k strictly between 0 and 1) and votes with ties (the math verifier scores it 0)
PARITY = textwrap.dedent("""
    from xrpo.rewards import VerifyResult

    def verify(completion, reference):
        return VerifyResult(score=float(len(completion) % 2 == 0), answer=str(len(completion) % 2))
""")


@pytest.fixture(scope="session")
def eval_env(tmp_path_factory, tiny_tokenizer):
    from xrpo.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("eval_env")
    model = build_tiny_model(tiny_tokenizer, d_model=32, layers=2, heads=2, ffn=64, seed=0)
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    tiny_tokenizer.save_pretrained(model_dir)
    rows = [{"id": f"q{i}", "problem": f"{i} + {i + 2} = ?", "answer": str(2 * i + 2)} for i in range(7)]
    data = root / "small.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "eval_parity_verifier.py").write_text(PARITY)
    sys.path.insert(0, str(root))
    yield {"root": root, "model": model_dir, "data": data, "rows": rows, "verifier": "eval_parity_verifier:verify"}
    sys.path.remove(str(root))


@pytest.fixture(scope="session")
def tiny_run(eval_env, tmp_path_factory):
    """A finished 3-step XRPO run of the tiny model (checkpoints, metrics.jsonl, eval.jsonl, rounds.jsonl)."""
    from xrpo.trainer.config_loader import build_config
    from xrpo.trainer.loop import train

    out = tmp_path_factory.mktemp("runs") / "tiny"
    root = eval_env["root"]
    train_rows = [{"id": f"t{i}", "problem": f"{i} + {i + 1} = ?", "answer": str(2 * i + 1)} for i in range(12)]
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train_rows))
    cfg = build_config(
        None,
        [
            f"output={out}",
            "steps=3",
            "method.name=xrpo",
            f"model.path={eval_env['model']}",
            f"data.train={root / 'train.jsonl'}",
            f"data.heldout={eval_env['data']}",
            f"data.verifier={eval_env['verifier']}",
            "rollout.prompts_per_step=4",
            "rollout.rollouts_per_step=16",
            "method.n_base=2",
            "rollout.max_new_tokens=6",
            "rollout.embedder=hash",
            "eval_samples=2",
            "eval_k=[1,2]",
            "eval_every=2",
            "save_every=0",
            "log_samples_every=0",
            "progress=false",
            "tensorboard=false",
            "optim.lr=1e-2",
            "optim.micro_batch_tokens=64",
            "data.prompt_template=Q: {prompt}\nA:",
        ],
    )
    train(cfg, log=lambda *_: None)
    return out
