"""Fixtures for trainer tests: a tiny model saved to disk (the trainer loads models by path, as for real ones),
small problem files, and a user verifier module with mixed rewards for a random model."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from xrpo.models.tiny import build_tiny_model, build_tiny_tokenizer

# reward 1 when the completion has an even number of characters: a random model gets mixed rewards, so advantages
# are non-zero and every parameter receives gradient (with the math verifier a random model scores 0 everywhere)
PARITY = textwrap.dedent('''
    from xrpo.rewards import VerifyResult

    def verify(completion, reference):
        return VerifyResult(score=float(len(completion) % 2 == 0), answer=str(len(completion) % 2))
''')


@pytest.fixture(scope="session")
def trainer_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("trainer_env")
    texts = [f"Q: {a} + {b} = ?\nA: \\boxed{{{a + b}}}" for a in range(30) for b in range(0, 30, 7)]
    tok = build_tiny_tokenizer(texts)
    model = build_tiny_model(tok, d_model=32, layers=2, heads=2, ffn=64, seed=0)
    model_dir = root / "model"
    model.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    rows = [{"id": f"t{i}", "problem": f"{i} + {i + 1} = ?", "answer": str(2 * i + 1)} for i in range(24)]
    train = root / "train.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    held = root / "heldout.jsonl"
    held.write_text("".join(json.dumps({"id": f"h{i}", "problem": f"{i} + 3 = ?", "answer": str(i + 3)}) + "\n"
                            for i in range(4)))
    (root / "parity_verifier.py").write_text(PARITY)
    sys.path.insert(0, str(root))
    env = {"root": root, "model": model_dir, "train": train, "heldout": held}
    env["overrides"] = lambda out, method="xrpo", steps=1: base_overrides(env, out, method, steps)
    yield env
    sys.path.remove(str(root))


def base_overrides(env, out, method="xrpo", steps=1):
    return [
        f"output={out}", f"steps={steps}", f"method.name={method}", f"model.path={env['model']}",
        f"data.train={env['train']}", f"data.heldout={env['heldout']}", "data.verifier=parity_verifier:verify",
        "rollout.prompts_per_step=4", "rollout.rollouts_per_step=16", "method.n_base=2",
        "rollout.max_new_tokens=6", "rollout.embedder=hash", "eval_samples=2", "eval_k=[1,2]", "eval_every=0",
        "save_every=0", "log_samples_every=0", "progress=false", "tensorboard=false", "optim.lr=1e-2",
        "optim.micro_batch_tokens=64", "data.prompt_template=Q: {prompt}\nA:",
    ]
