"""``RayXRPOTrainer.fit`` end to end on CPU through ``xrpo verl --cpu``: Ray, verl's FSDP2 actor and
reference workers, vLLM's CPU server, weight sync, a checkpoint and verl's own resume from it, on the built-in model
with a seeded ICL corpus. The test runs the command docs/verl.md gives (examples/verl/cpu_dry_run.sh): two launches,
steps 1-2 with a checkpoint at step 2, then a launch that verl resumes from it for step 3; and checks what a user
would check, on what the runs logged and saved (verl's file logger, its rollout dumps, which hold each row's uid,
advantage and s(y), and the checkpoints' corpora).

The task is the built-in one's easiest gcd problems, where the built-in model solves about a quarter of its
rollouts (measured at temperature 1 on 48 of them: mean 0.24, 17% with no success in 16), so that a step of
4 prompts x 8 rollouts has groups with reward variance (a learning signal), non-uniform planning rounds, unsolved
prompts that ICL seeds, and solved ones that grow the corpus. vLLM's sampling on CPU is not reproducible, so these
hold for any run but a rare one: Algorithm 1's rounds simulated with the measured per-problem success rates gave no
non-uniform round in 3 steps in 0.06% of 20,000 runs, no ICL-seeded prompt in 0.03%, no group with reward variance
never. Wall time and memory: docs/benchmarks.md, "verl on CPU".
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("verl")
pytest.importorskip("vllm")

from xrpo.algo.advantages import group_advantages, sharpen_advantages  # noqa: E402
from xrpo.icl import ICLCorpus, get_embedder  # noqa: E402
from xrpo.integrations.verl.config import xrpo_config  # noqa: E402
from xrpo.integrations.verl.cpu import read_metrics  # noqa: E402
from xrpo.integrations.verl.main import load_config  # noqa: E402
from xrpo.integrations.verl.trainer import CORPUS_DIR  # noqa: E402
from xrpo.models.loading import cache_root, resolve_model_dir  # noqa: E402
from xrpo.trainer.config import ModelConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
STEPS = (1, 2, 3)
ROLLOUTS_PER_STEP = 4 * 8  # data.train_batch_size x actor_rollout_ref.rollout.n in cpu_dry_run.sh


@pytest.mark.slow  # two verl launches on CPU: minutes (docs/benchmarks.md, "verl on CPU")
def test_fit_on_cpu_trains_checkpoints_and_resumes(tmp_path):
    out = tmp_path / "dry_run"
    # the built-in model comes from this test session's model cache, named explicitly: the script's subprocesses then
    # reuse the model the suite built whatever HOME they inherit. On a fresh machine it is built here, in this process
    # (one torch thread, tests/conftest.py), not by the script's converter: with two OpenMP threads beside the other
    # test worker the build took 461 s, 4-5x its time alone (a fresh-clone CI run with an empty cache)
    resolve_model_dir("default", warmup_steps=ModelConfig().warmup_steps)
    env = {**os.environ, "PYTHON": sys.executable, "XRPO_CACHE": str(cache_root())}
    proc = subprocess.run(
        ["bash", str(REPO / "examples/verl/cpu_dry_run.sh"), str(out)],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    check_dry_run(out, proc.stdout.strip().splitlines()[-1])


def test_docs_give_the_command_this_test_runs():
    # docs/verl.md's command (the line after the marker) is the script above, with the output directory last
    lines = (REPO / "docs" / "verl.md").read_text().splitlines()
    command = shlex.split(lines[lines.index("<!-- verl-cpu-command -->") + 1])
    assert command[:-1] == ["bash", "examples/verl/cpu_dry_run.sh"] and not command[-1].startswith("-")


def _groups(rows: list[dict]) -> dict[str, list[dict]]:
    groups = defaultdict(list)
    for r in rows:
        groups[r["xrpo_uid"]].append(r)
    return groups


def check_dry_run(out: Path, last_line: str) -> None:
    """What a user checks after ``cpu_dry_run.sh OUT``: ``out`` its directory, ``last_line`` its last line."""
    for launch in (1, 2):  # the task runner (a Ray worker) imported this checkout's xrpo
        assert f"xrpo from {REPO / 'xrpo'}" in (out / f"launch-{launch}.log").read_text()
    seed = [json.loads(line) for line in (out / "seed.jsonl").read_text().splitlines()]
    # the script leaves the advantage's knobs at xrpo_base.yaml's (the paper's) values
    algorithm = load_config().algorithm
    xcfg = xrpo_config(algorithm)
    assert algorithm.norm_adv_by_std_in_grpo and xcfg.sharpen

    # ---- the second launch continued at step 3 from the step-2 checkpoint, through verl's own resume
    steps, resumed_at = read_metrics(out / "run")
    assert sorted(steps) == list(STEPS) and resumed_at == 2
    assert f"Resuming from {out / 'run' / 'global_step_2'}" in (out / "launch-2.log").read_text()
    m = [steps[s] for s in STEPS]
    icl_rows = sum(x["icl/seeded_rollouts"] for x in m)
    assert last_line.startswith("verl-cpu: steps=3 resumed_at=2 ") and f" icl_rows={icl_rows:.0f} " in last_line

    # ---- each step's rollouts, as verl's actor trained on them (the rollout dump; padding rows left out)
    dumps = {}
    for step in STEPS:
        rows = [json.loads(line) for line in (out / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        dumps[step] = [r for r in rows if not r["xrpo_pad"]]
        assert len(dumps[step]) == ROLLOUTS_PER_STEP  # the step's budget, every row kept
    for x, rows in zip(m, dumps.values()):
        # rewards logged: the verifier's 0/1 per row, and the step's mean as the planner saw it
        scores = [r["score"] for r in rows]
        assert set(scores) <= {0.0, 1.0}
        assert x["rollout/reward_mean"] == pytest.approx(np.mean(scores), abs=1e-6)
    # some group with reward variance, so a learning signal: a non-zero policy loss and gradient
    varied = [s for s in STEPS if any(len({r["score"] for r in g}) == 2 for g in _groups(dumps[s]).values())]
    assert varied, "no group had both a correct and a wrong rollout in 3 steps"
    assert all(steps[s]["rollout/zero_variance_group_frac"] < 1 for s in varied)
    assert any(steps[s]["actor/pg_loss"] != 0 and steps[s]["actor/grad_norm"] > 0 for s in varied)
    assert all(math.isfinite(x["actor/pg_loss"]) and math.isfinite(x["actor/grad_norm"]) for x in m)
    # Algorithm 1: HRP gave some planning round a non-uniform allocation
    assert any(x["alloc/nonuniform_rounds"] > 0 for x in m)
    # ICL rows: routed by the planner (counted by the trainer), kept in the batch and trained under the plain prompt
    # (icl_train_prompt=original), i.e. with the same stored prompt as the group's unseeded rows
    assert icl_rows > 0
    assert sum(r["xrpo_seeded"] for rows in dumps.values() for r in rows) == icl_rows
    for rows in dumps.values():
        for g in _groups(rows).values():
            assert len({r["input"] for r in g}) == 1
            assert all(r["input"].startswith("Q: gcd(") and r["input"].endswith("\nA:") for r in g)
    # the reference worker ran: the k3 KL of the updated actor to the reference is finite and > 0 after an update
    assert all(math.isfinite(x["actor/kl_loss"]) and x["actor/kl_loss"] > 0 for x in m[1:])

    # ---- the corpus grows; step N's checkpoint holds the corpus after step N (its solutions included), and the
    # resumed launch continues from it (problems are never evicted, so step 3's corpus contains step 2's)
    emb = get_embedder("hash")
    saved = {s: ICLCorpus.load(out / "run" / f"global_step_{s}" / CORPUS_DIR, emb) for s in (2, 3)}
    for s, corpus in saved.items():
        assert steps[s]["icl/corpus_problems"] == len(corpus)
        assert steps[s]["icl/corpus_solutions"] == corpus.num_solutions
    assert {r["problem_id"] for r in seed} < set(saved[2].problem_ids()) <= set(saved[3].problem_ids())

    # ---- the advantages the actor trained on are xrpo.algo's on the same rows (Eqs. 4-6 after GRPO's A_i)
    for step, rows in dumps.items():
        _, gid = np.unique([r["xrpo_uid"] for r in rows], return_inverse=True)
        reward = torch.tensor([r["score"] for r in rows], dtype=torch.float64)
        adv = group_advantages(reward, gid, scale="std", eps=xcfg.epsilon)
        adv, _ = sharpen_advantages(
            adv,
            reward,
            np.array([r["xrpo_loglik"] for r in rows], dtype=np.float64),
            gid,
            lam_nov=xcfg.lam_nov,
            kappa_clip=xcfg.kappa_clip,
            full_reward=xcfg.full_reward,
        )
        trained = np.array([r["xrpo_advantage"] for r in rows])
        # verl's estimator runs xrpo.algo on float32 tensors: the functions compute in float64 and round their
        # outputs to float32, once for A_i and once for A_i^+ (whose bonus is at most kappa_clip * A_i, so A_i's
        # rounding reaches it scaled by kappa_clip): |error| <= (2 + kappa_clip) * 2**-24 * |A| per row
        tol = (2 + xcfg.kappa_clip) * 2.0**-24 * np.abs(adv)
        np.testing.assert_array_less(np.abs(trained - adv), tol + 1e-12, err_msg=f"step {step}")
        if step in varied:
            assert np.abs(trained).max() > 0
