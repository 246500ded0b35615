"""Knapsack RL and xrpo-plus end to end: `xrpo train method.name=knapsack` / `xrpo-plus` on the tiny model. The
trainer keeps each training problem's last visit (plain rollouts only) and, for Knapsack RL's authors' rule, its
latest rewards across visits; the allocations it logs in rounds.jsonl are the library's allocators applied to that
history, rebuilt here from rounds.jsonl itself; a run killed after a checkpoint resumes with the same history and
plans what the uninterrupted run planned."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from xrpo.algo.knapsack_rl import authors_allocation, recent_rate
from xrpo.algo.posterior_alloc import posterior_allocation
from xrpo.rundir.checkpoints import list_checkpoints
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train

# 24 training problems, 4 prompts per step: steps 1-6 are the first epoch (no history), 7-8 revisit problems
STEPS = 8
BUDGET = 16
# a first visit has 4 rollouts here (16 over 4 prompts): Knapsack RL counts a rate from 4 rewards on (its recipe: 8)
KNAPSACK = ["method.knapsack_min_rewards=4"]


def overrides(env, out, method: str) -> list[str]:
    return env["overrides"](out, method, steps=STEPS) + (KNAPSACK if method == "knapsack" else [])


def quiet(*_):
    pass


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def by_step(rows: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in rows:
        out.setdefault(r["step"], []).append(r)
    return out


def last_visits(steps: dict[int, list[dict]], before: int) -> dict[str, tuple[int, int]]:
    """Each problem's (successes, rollouts) of its latest step before ``before``, ICL-seeded rounds left out."""
    last: dict[str, tuple[int, int]] = {}
    for s in sorted(steps):
        if s >= before:
            break
        visit: dict[str, list[int]] = {}
        for r in steps[s]:
            for q, pid in enumerate(r["problems"]):
                v = visit.setdefault(pid, [0, 0])
                if q not in r["seeded"]:
                    v[0] += r["successes"][q]
                    v[1] += r["alloc"][q]
        last.update({pid: (k, n) for pid, (k, n) in visit.items() if n > 0})
    return last


def history_of(rows: list[dict], last: dict) -> tuple[np.ndarray, np.ndarray]:
    pids = rows[0]["problems"]
    return np.array([last.get(p, (0, 0))[0] for p in pids]), np.array([last.get(p, (0, 0))[1] for p in pids])


def check_posterior_rounds(rows: list[dict], hk: np.ndarray, hn: np.ndarray) -> list[int]:
    """Each planning round of a step is ``posterior_allocation`` on the step's successes so far (ICL-seeded ones
    included: the planner counts every rollout of the step) and the last visits; returns the step's counts."""
    k, m = np.array(rows[0]["successes"]), np.array(rows[0]["alloc"])
    for r in rows[1:]:
        hist = {"history_successes": hk, "history_trials": hn} if hn.any() else {}
        assert r["alloc"] == posterior_allocation(k, m, sum(r["alloc"]), **hist).tolist(), (r["step"], r["round"])
        k, m = k + np.array(r["successes"]), m + np.array(r["alloc"])
    return m.tolist()


@pytest.mark.parametrize("method", ["knapsack", "xrpo-plus"])
def test_allocations_follow_the_last_visit_and_spend_the_budget(trainer_env, tmp_path, method):
    out = tmp_path / method
    summary = train(build_config(None, overrides(trainer_env, out, method)), log=quiet)
    metrics = jsonl(out / "metrics.jsonl")
    steps = by_step(jsonl(out / "rounds.jsonl"))
    assert sorted(steps) == list(range(1, STEPS + 1))
    nonuniform_with_history = 0
    for s, rows in steps.items():
        # every rollout of the budget generated, over the step's 4 prompts
        assert sum(sum(r["alloc"]) for r in rows) == BUDGET and metrics[s - 1]["rollout/count"] == BUDGET
        hk, hn = history_of(rows, last_visits(steps, s))
        assert metrics[s - 1]["alloc/history_frac"] == float(np.mean(hn > 0))
        assert (hn > 0).all() == (s > 6) and (hn == 0).all() == (s <= 6)
        if method == "knapsack":
            # one batch: the authors' counts of the whole budget from the prompts' rewards so far (one earlier visit
            # at most here, so the window is that visit; an even split without it)
            assert len(rows) == 1
            rate, valid = recent_rate(hk, hn, hk, hn, hn, min_rewards=4)
            assert rows[0]["alloc"] == authors_allocation(rate, valid, BUDGET).tolist()
            counts = rows[0]["alloc"]
        else:
            # a base round of n_base = 2 (the preset's), then each round the posterior planner
            assert rows[0]["alloc"] == [2, 2, 2, 2] and len(rows) == 3
            counts = check_posterior_rounds(rows, hk, hn)
        if s > 6 and max(counts) - min(counts) > 0:
            nonuniform_with_history += 1
    # once the history exists the counts are not an even split (the budget divides evenly: 4 each)
    assert nonuniform_with_history >= 1
    assert torch.isfinite(torch.tensor([r["loss/policy"] for r in metrics])).all()
    before = load_file(str(trainer_env["model"] / "model.safetensors"))
    after = load_file(str(Path(summary["final_checkpoint"]) / "model" / "model.safetensors"))
    assert [k for k in before if not torch.equal(before[k], after[k])]
    # the checkpoint holds the history: each problem's last visit, the 24 problems all seen by step 8
    st = json.loads((Path(summary["final_checkpoint"]) / "state.json").read_text())["history"]
    last = last_visits(steps, STEPS + 1)
    ids = [f"t{i}" for i in range(24)]
    assert st["successes"] == [last[p][0] for p in ids] and st["trials"] == [last[p][1] for p in ids]
    if method == "knapsack":
        # and each problem's latest rewards (window 16): every visit so far, here the last one (4 rollouts each)
        assert st["window"] == 16 and st["observed"] == [sum(n for _, n in visits_of(steps, p)) for p in ids]
        assert [w.count("1") for w in st["recent"]] == [sum(k for k, _ in visits_of(steps, p)) for p in ids]
    else:
        assert "recent" not in st  # xrpo-plus reads the last visit only


def visits_of(steps: dict[int, list[dict]], pid: str) -> list[tuple[int, int]]:
    """(successes, rollouts) of each visit of problem ``pid`` (no ICL here: every rollout counts)."""
    out = []
    for s in sorted(steps):
        k = n = 0
        for r in steps[s]:
            if pid in r["problems"]:
                q = r["problems"].index(pid)
                k, n = k + r["successes"][q], n + r["alloc"][q]
        if n:
            out.append((k, n))
    return out


def test_xrpo_plus_history_leaves_icl_seeded_rollouts_out(trainer_env, tmp_path):
    # the learning task (8 prompts x 64 rollouts, 24 problems: steps 4-5 revisit steps 1-2's problems), where the
    # planner seeds unsolved prompts from the ICL corpus: the last visit counts only the plain rollouts
    out = tmp_path / "learn"
    ov = trainer_env["learn_overrides"](out, "xrpo-plus", 5) + ["method.n_base=2"]
    train(build_config(None, ov), log=quiet)
    steps = by_step(jsonl(out / "rounds.jsonl"))
    seeded = 0
    for s, rows in steps.items():
        hk, hn = history_of(rows, last_visits(steps, s))
        assert (hn > 0).all() == (s > 3)
        assert sum(check_posterior_rounds(rows, hk, hn)) == 64
        seeded += sum(len(r["seeded"]) for r in rows)
    assert seeded > 0  # the seeded rounds were there to leave out
    st = json.loads((out / "checkpoints" / "step-00000005" / "state.json").read_text())["history"]
    last = last_visits(steps, 6)
    ids = [f"t{i}" for i in range(24)]
    assert st["trials"] == [last[p][1] for p in ids] and st["successes"] == [last[p][0] for p in ids]


@pytest.mark.parametrize("method", ["knapsack", "xrpo-plus"])
def test_killed_and_resumed_keeps_the_history(trainer_env, tmp_path, method):
    ov = [o for o in overrides(trainer_env, None, method) if not o.startswith("output=")]
    ov += ["save_every=2", "keep_last=10", "threads=1"]
    straight = tmp_path / "straight"
    ref = train(build_config(None, [f"output={straight}", *ov]), log=quiet)
    # the killed run: the straight run as it was right after its step-6 checkpoint (later files removed), so the
    # resumed steps 7-8 plan from a history that only the checkpoint carries
    stopped = tmp_path / "stopped"
    shutil.copytree(straight, stopped)
    shutil.rmtree(stopped / "checkpoints" / "step-00000008")
    for name in ("metrics.jsonl", "rounds.jsonl"):
        keep = [r for r in jsonl(stopped / name) if r["step"] <= 6]
        (stopped / name).write_text("".join(json.dumps(r) + "\n" for r in keep))
    assert list_checkpoints(stopped)[-1].name == "step-00000006"
    resumed = train(None, resume=str(stopped), log=quiet)
    assert resumed["steps"] == STEPS
    a = json.loads((stopped / "checkpoints" / "step-00000008" / "state.json").read_text())["history"]
    b = json.loads((straight / "checkpoints" / "step-00000008" / "state.json").read_text())["history"]
    assert a == b and sum(a["trials"]) > 0
    if method == "knapsack":
        # the window came through the checkpoint: steps 7-8 planned from it (a rate counts from 4 rewards here)
        assert a["observed"] == [len(w) for w in a["recent"]] and sum(a["observed"]) > sum(a["trials"])
    ra, rb = jsonl(stopped / "rounds.jsonl"), jsonl(straight / "rounds.jsonl")
    assert [(r["step"], r["problems"], r["alloc"]) for r in ra] == [(r["step"], r["problems"], r["alloc"]) for r in rb]
    wa = load_file(str(Path(resumed["final_checkpoint"]) / "model" / "model.safetensors"))
    wb = load_file(str(Path(ref["final_checkpoint"]) / "model" / "model.safetensors"))
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=0, msg=k)
