"""Fixtures for trainer tests: a tiny model saved to disk (the trainer loads models by path, as for real ones),
small problem files, and a user verifier module with mixed rewards for a random model."""

from __future__ import annotations

import json
import math
import sys
import textwrap

import pytest
import torch

from xrpo.models.tiny import build_tiny_model, build_tiny_tokenizer

# reward 1 when the completion has an even number of characters: a random model gets mixed rewards, so advantages
# are non-zero and every parameter receives gradient (with the math verifier a random model scores 0 everywhere)
PARITY = textwrap.dedent("""
    from xrpo.rewards import VerifyResult

    def verify(completion, reference):
        return VerifyResult(score=float(len(completion) % 2 == 0), answer=str(len(completion) % 2))
""")


# The task the direction tests train on: the tiny random model must learn to end its answer with an ASCII letter or
# digit. About 37% of its first samples do (measured on this fixture's model), the target depends on no fact the
# model would have to know, and it is the model's output distribution itself that has to move: every method learns
# it in a few steps, and a loss of the wrong sign visibly unlearns it.
ENDS_ALNUM = textwrap.dedent("""
    from xrpo.rewards import VerifyResult

    def verify(completion, reference):
        last = completion.rstrip()[-1:]
        return VerifyResult(score=float(last.isascii() and last.isalnum()), answer=last)
""")

# rewards every completion, blank ones included (the guard for blank correct rollouts)
ALWAYS = textwrap.dedent("""
    from xrpo.rewards import VerifyResult

    def verify(completion, reference):
        return VerifyResult(score=1.0, answer=completion)
""")


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
    held.write_text(
        "".join(json.dumps({"id": f"h{i}", "problem": f"{i} + 3 = ?", "answer": str(i + 3)}) + "\n" for i in range(4))
    )
    (root / "parity_verifier.py").write_text(PARITY)
    (root / "ends_alnum_verifier.py").write_text(ENDS_ALNUM)
    (root / "always_verifier.py").write_text(ALWAYS)
    learn_held = root / "learn_heldout.jsonl"
    # unseen prompts of the training prompts' form (those are i + (i + 1) for i < 24)
    learn_held.write_text(
        "".join(
            json.dumps({"id": f"h{i}", "problem": f"{i} + {i + 1} = ?", "answer": str(2 * i + 1)}) + "\n"
            for i in range(24, 32)
        )
    )
    sys.path.insert(0, str(root))
    env = {"root": root, "model": model_dir, "train": train, "heldout": held, "learn_heldout": learn_held}
    env["overrides"] = lambda out, method="xrpo", steps=1: base_overrides(env, out, method, steps)
    env["learn_overrides"] = lambda out, method="xrpo", steps=16, seed=0: learn_overrides(env, out, method, steps, seed)
    yield env
    sys.path.remove(str(root))


def base_overrides(env, out, method="xrpo", steps=1):
    return [
        f"output={out}",
        f"steps={steps}",
        f"method.name={method}",
        f"model.path={env['model']}",
        f"data.train={env['train']}",
        f"data.heldout={env['heldout']}",
        "data.verifier=parity_verifier:verify",
        "rollout.prompts_per_step=4",
        "rollout.rollouts_per_step=16",
        "method.n_base=2",
        "rollout.max_new_tokens=6",
        "rollout.embedder=hash",
        "eval_samples=2",
        "eval_k=[1,2]",
        "eval_every=0",
        "save_every=0",
        "log_samples_every=0",
        "progress=false",
        "tensorboard=false",
        "optim.lr=1e-2",
        "optim.micro_batch_tokens=64",
        "data.prompt_template=Q: {prompt}\nA:",
    ]


# two XRPO steps planned in waves (rollout.planner=streaming) on an engine that streams; see check_streamed_runs
STREAMING_OVERRIDES = [
    "steps=2",
    "rollout.planner=streaming",
    "rollout.stream_quorum=0.25",
    "rollout.prompts_per_step=4",
    "rollout.rollouts_per_step=20",
    "rollout.max_new_tokens=12",
    # frequent characters of the tiny model's vocabulary end completions at various steps, so groups complete at
    # different engine steps (with every completion at the length limit, all complete at once)
    "rollout.stop=['=', '+', '?', '{']",
    "save_every=0",
]


def check_streamed_runs(runs) -> None:
    """Two output directories of the same STREAMING_OVERRIDES run: each step's budget spent exactly in waves, every
    prompt planned once per round of Algorithm 1, some wave planned while other requests decoded (the engine admitted
    it into a running batch), and the two runs alike but for timings (a seed gives the same run)."""
    metrics = [json.loads(x) for x in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert math.isfinite(m["loss/policy"]) and m["rollout/count"] == 20
    rounds = [json.loads(x) for x in (runs[0] / "rounds.jsonl").read_text().splitlines()]
    for step in (1, 2):
        waves = [r for r in rounds if r["step"] == step]
        assert sum(sum(r["alloc"]) for r in waves) == 20 and waves[0]["alloc"] == [2, 2, 2, 2]
        assert all("members" in r and r["stage"] in (1, 2) for r in waves[1:])
        for t in (1, 2):
            assert sorted(q for r in waves[1:] if r["stage"] == t for q in r["members"]) == [0, 1, 2, 3]
    assert any(r.get("in_flight", 0) > 0 for r in rounds)
    for name in ("metrics.jsonl", "rounds.jsonl"):
        a = [json.loads(x) for x in (runs[0] / name).read_text().splitlines()]
        b = [json.loads(x) for x in (runs[1] / name).read_text().splitlines()]
        strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time/")} for r in rows]  # noqa: E731
        assert strip(a) == strip(b)
    assert (runs[0] / "samples.jsonl").read_text() == (runs[1] / "samples.jsonl").read_text()


def learn_overrides(env, out, method="xrpo", steps=16, seed=0):
    """The ends-with-alnum task: 8 prompts x 64 rollouts of at most 3 tokens per step, held-out pass@1 over 8 unseen
    prompts x 16 samples; fewshot ICL prompts (the random model cannot read the paper's XML template)."""
    return [
        f"output={out}",
        f"steps={steps}",
        f"method.name={method}",
        f"seed={seed}",
        f"model.path={env['model']}",
        f"data.train={env['train']}",
        f"data.heldout={env['learn_heldout']}",
        "data.verifier=ends_alnum_verifier:verify",
        "data.prompt_template=Q: {prompt}\nA:",
        "rollout.prompts_per_step=8",
        "rollout.rollouts_per_step=64",
        "method.n_base=4",
        "rollout.max_new_tokens=3",
        "rollout.embedder=hash",
        "rollout.icl_style=fewshot",
        "eval_samples=16",
        "eval_k=[1]",
        "eval_every=0",
        "save_every=0",
        "log_samples_every=0",
        "progress=false",
        "tensorboard=false",
        "optim.lr=1e-2",
        "optim.micro_batch_tokens=256",
    ]


class LossSpy:
    """A policy loss registered through the public registry (`xrpo.algo.losses.register_policy_loss`), selected with
    ``method.policy_loss=<name>``: on every micro-batch it records what the trainer hands the real "vanilla" loss
    (current and old log-probs, advantages, mask, clip bounds, global counts), the loss value and the gradient of the
    loss with respect to each token's log-prob, and returns the real loss unchanged."""

    name = "test-spy-vanilla"

    def __init__(self):
        from xrpo.algo.losses import POLICY_LOSSES, get_policy_loss, register_policy_loss

        self.calls: list[dict] = []
        if self.name not in POLICY_LOSSES:
            vanilla = get_policy_loss("vanilla")

            def spy(logprobs, old_logprobs, advantages, mask, **kw):
                loss, metrics = vanilla(logprobs, old_logprobs, advantages, mask, **kw)
                (grad,) = torch.autograd.grad(loss, logprobs, retain_graph=True)
                POLICY_LOSSES[self.name].sink.append(
                    {
                        "lp": logprobs.detach().clone(),
                        "old": old_logprobs.detach().clone(),
                        "adv": advantages.detach().clone(),
                        "mask": mask.detach().bool().clone(),
                        "grad": grad.detach().clone(),
                        "loss": float(loss.detach()),
                        "metrics": metrics,
                        **kw,
                    }
                )
                return loss, metrics

            register_policy_loss(self.name)(spy)
        POLICY_LOSSES[self.name].sink = self.calls

    @staticmethod
    def ratios(call: dict) -> torch.Tensor:
        """The token ratios exp(logp - old_logp) at valid positions."""
        return torch.exp(call["lp"] - call["old"])[call["mask"]]

    def steps(self, n_steps: int, mini_batches: int = 1, epochs: int = 1) -> list[list[list[dict]]]:
        """The calls grouped as [step][optimizer step][micro-batch]: an optimizer step's micro-batches cover its
        mini-batch's global_tokens valid tokens, and each training step makes epochs x mini_batches of them."""
        out, i = [], 0
        for _ in range(n_steps):
            step = []
            for _ in range(epochs * mini_batches):
                mb, seen = [], 0
                while True:
                    assert i < len(self.calls), "the spy's calls end inside a mini-batch"
                    call = self.calls[i]
                    i += 1
                    mb.append(call)
                    seen += int(call["mask"].sum())
                    if seen >= call["global_tokens"]:
                        break
                step.append(mb)
            out.append(step)
        assert i == len(self.calls), f"{len(self.calls) - i} calls left over"
        return out


@pytest.fixture(scope="module")
def loss_spy():
    from xrpo.algo.losses import POLICY_LOSSES

    yield LossSpy()
    POLICY_LOSSES.pop(LossSpy.name)  # the registry is global: leave it as other tests expect it


@pytest.fixture(scope="session")
def larger_model(tiny_tokenizer):
    """A random float64 Qwen2 of a larger shape than the tiny model (grouped-query attention, untied head, wider
    MLP), for the memory features' equivalence tests."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tiny_tokenizer),
        hidden_size=128,
        intermediate_size=352,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(cfg).double().eval()
