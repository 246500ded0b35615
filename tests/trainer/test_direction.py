"""Training moves reward the right way, under every preset, and a loss of the wrong sign is caught.

The task (tests/trainer/conftest.py, ENDS_ALNUM): the tiny random model must end its answer with an ASCII letter or
digit; about 37% of its first samples do. Each run trains 18 steps of 8 prompts x 64 rollouts (24 training prompts,
so steps 1-3 and 16-18 each cover every prompt once) and is judged on three figures, all measured before the
margins were fixed (every preset x seeds 0-4 at lr 5e-3; grpo and xrpo also with the sign-flipped loss, 5 seeds,
and without learning, lr 1e-9, 3 seeds):

    heldout   held-out pass@1 after minus before (summary.json; 8 unseen prompts x 16 samples, drawn with the same
              sampling seed before and after, so an unchanged model scores exactly the same).
              Measured: every preset +0.117 to +0.273 (XRPO +0.117 to +0.195); no learning 0.000; flipped loss
              -0.227 to -0.062.
    train     the reward of the 24 training prompts x 8 samples drawn with one fixed seed from the initial and from
              the trained model (paired, like held-out). Measured: every preset +0.120 to +0.297; no learning
              0.000; flipped loss -0.198 to -0.125.
    online    the logged training reward: the first-round rollouts of steps 16-18 against those of steps 1-3 (each
              prompt's mean, then the mean over prompts). Measured: every preset +0.031 to +0.323; flipped loss
              -0.250 to -0.005; but without learning -0.052 to +0.219 (XRPO: its later rounds go where the planner
              sends them, so which prompts' rollouts are counted differs from step to step): it only has to rise.

The margins (0.08) are about two thirds of the smallest gain measured over presets and seeds.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from xrpo.algo.losses import POLICY_LOSSES, get_policy_loss, register_policy_loss
from xrpo.algo.presets import list_presets
from xrpo.data import load_problems
from xrpo.rewards import get_verifier
from xrpo.rollout.engine import SamplingParams
from xrpo.rollout.hf_engine import HFEngine
from xrpo.rollout.prompts import PromptRenderer
from xrpo.rollout.validate import sample_and_score
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train

STEPS = 18
WINDOW = 3  # steps per window: one pass over the 24 training prompts
LR = "optim.lr=5e-3"
HELDOUT_MARGIN = 0.08
TRAIN_MARGIN = 0.08

FLIPPED = "test-flipped-vanilla"


@pytest.fixture
def flipped_loss():
    """GRPO's loss with its sign flipped (descent on reward), registered for one test."""
    vanilla = get_policy_loss("vanilla")

    @register_policy_loss(FLIPPED)
    def flipped(*args, **kwargs):
        loss, metrics = vanilla(*args, **kwargs)
        return -loss, metrics

    yield FLIPPED
    POLICY_LOSSES.pop(FLIPPED)


def quiet(*_):
    pass


def _balanced(steps: list[list[tuple[str, float]]]) -> float:
    """Mean over prompts of each prompt's mean reward over the given steps."""
    by: dict[str, list[float]] = {}
    for rows in steps:
        for pid, r in rows:
            by.setdefault(pid, []).append(r)
    return sum(sum(v) / len(v) for v in by.values()) / len(by)


def _train_prompt_reward(model_dir: Path, env) -> float:
    """Reward of the training prompts, 8 samples each, drawn with a fixed seed (paired before / after)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
    renderer = PromptRenderer(tok, prompt_template="Q: {prompt}\nA:")
    m, _ = sample_and_score(
        load_problems(str(env["train"])),
        HFEngine(model, tok),
        get_verifier("ends_alnum_verifier:verify"),
        renderer,
        n=8,
        sampling=SamplingParams(max_new_tokens=3, seed=1234),
    )
    return m["eval/pass@1"]


def direction(env, out: Path, method: str, seed: int = 0, extra: tuple[str, ...] = ()) -> dict[str, float]:
    """Train ``method`` on the ends-with-alnum task; the three figures of the module docstring."""
    online: list[list[tuple[str, float]]] = []

    def on_step(report):
        online.append([(report.problems[x.problem_index].id, x.reward) for x in report.plan.records if x.round == 0])

    cfg = build_config(None, env["learn_overrides"](out, method, STEPS, seed) + [LR, *extra])
    summary = train(cfg, log=quiet, on_step=on_step)
    assert len(online) == STEPS
    return {
        "heldout": summary["pass@1_after"] - summary["pass@1_before"],
        "train": _train_prompt_reward(Path(summary["final_checkpoint"]) / "model", env)
        - _train_prompt_reward(env["model"], env),
        "online": _balanced(online[-WINDOW:]) - _balanced(online[:WINDOW]),
    }


def assert_learns(fig: dict[str, float]) -> None:
    assert fig["heldout"] >= HELDOUT_MARGIN, fig
    assert fig["train"] >= TRAIN_MARGIN, fig
    assert fig["online"] > 0.0, fig


@pytest.mark.parametrize("method", list_presets())
def test_every_preset_raises_reward(trainer_env, tmp_path, method):
    assert_learns(direction(trainer_env, tmp_path / method, method))


def test_a_sign_flipped_loss_lowers_reward_and_fails_the_check(trainer_env, tmp_path, flipped_loss):
    fig = direction(trainer_env, tmp_path / "flipped", "xrpo", extra=(f"method.policy_loss={flipped_loss}",))
    # the run unlearns the task
    assert fig["train"] <= -TRAIN_MARGIN and fig["heldout"] < 0, fig
    with pytest.raises(AssertionError):
        assert_learns(fig)
