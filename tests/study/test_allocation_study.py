"""study/allocation_study.py (allocation in training): first-visit and revisit steps from rounds.jsonl, paired ratios
against GRPO by hand, and the prediction as `xrpo simulate` on GRPO's rounds mixed by the share of revisits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from xrpo.trainer.config_loader import build_config, to_dict

STUDY = Path(__file__).resolve().parents[2] / "study"


@pytest.fixture(scope="module")
def alloc_study():
    sys.path.insert(0, str(STUDY))
    import allocation_study

    yield allocation_study
    sys.path.remove(str(STUDY))


def _run(root: Path, method: str, seed: int, rounds: list[dict], pass1: float) -> None:
    d = root / method / f"seed{seed}"
    d.mkdir(parents=True)
    ov = [f"method.name={method}", f"seed={seed}", "rollout.prompts_per_step=2", "rollout.rollouts_per_step=8"]
    (d / "config.yaml").write_text(yaml.safe_dump(to_dict(build_config(None, [*ov, f"output={d}"]))))
    ev = {"eval/pass@1": pass1}
    summary = {"heldout_after": ev, "heldout_before": ev, "eval_history": [], "pass@1_after": pass1}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": r["step"]}) + "\n" for r in rounds))
    (d / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rounds))


def _step(s, problems, alloc, succ):
    return {"step": s, "round": 0, "alloc": alloc, "seeded": [], "flips": 0, "problems": problems, "successes": succ}


def test_visits_and_paired_ratios_by_hand(alloc_study, tmp_path):
    # 4 problems, 2 per step: steps 1-2 first visits, step 3 revisits a and b, step 4 mixes c with the new e
    probs = [["a", "b"], ["c", "d"], ["a", "b"], ["c", "e"]]
    # GRPO: 4 + 4 each; knapsack moves rollouts. Informative (mixed) groups marked *:
    #   grpo seed 0: step1 a 2/4* b 0/4 | step2 c 4/4 d 1/4* | step3 a 1/4* b 0/4 | step4 c 2/4* e 0/4
    g = [([4, 4], [2, 0]), ([4, 4], [4, 1]), ([4, 4], [1, 0]), ([4, 4], [2, 0])]
    #   knapsack seed 0: step1 as GRPO | step2 as GRPO | step3 a 6 (3/6*) b 2 (0/2) | step4 c 2/4* e 4 (1/4*)
    k = [([4, 4], [2, 0]), ([4, 4], [4, 1]), ([6, 2], [3, 0]), ([4, 4], [2, 1])]
    for seed in (0, 1):
        _run(tmp_path, "grpo", seed, [_step(s + 1, p, *x) for s, (p, x) in enumerate(zip(probs, g))], 0.30)
        _run(tmp_path, "knapsack", seed, [_step(s + 1, p, *x) for s, (p, x) in enumerate(zip(probs, k))], 0.32)
    rep = alloc_study.report
    runs = rep.load_runs(tmp_path, ["grpo", "knapsack"], [0, 1])
    assert alloc_study.visits(runs["grpo"][0].rounds) == {1: (0, 2), 2: (0, 2), 3: (2, 2), 4: (1, 2)}
    res = alloc_study.paired(runs)
    kn = res["knapsack"]
    assert kn["steps"] == {"first": 2, "revisit": 1, "all": 4}
    # history share: 3 of the 8 (step, prompt) draws had an earlier visit
    assert kn["history_share"] == pytest.approx(3 / 8)
    # all steps: GRPO 16 of 32 informative, knapsack (4 + 4 + 6 + 8) = 22 of 32: ratio 22/16, the same both seeds
    assert res["grpo"]["all"]["share"]["mean"] == pytest.approx(0.5)
    assert kn["all"]["vs_grpo"]["mean"] == pytest.approx(22 / 16) and kn["all"]["vs_grpo"]["ci95"] == 0.0
    # first-visit steps 1-2 alike (ratio 1); the revisit step 3: 6/8 against 4/8
    assert kn["first"]["vs_grpo"]["mean"] == pytest.approx(1.0)
    assert kn["revisit"]["vs_grpo"]["mean"] == pytest.approx(1.5)
    # zero-variance groups: GRPO 4 of 8, knapsack 2 of 8; pass@1 +0.02
    assert kn["all"]["zero_variance_diff"]["mean"] == pytest.approx(3 / 8 - 4 / 8)
    assert kn["pass@1_diff"]["mean"] == pytest.approx(0.02)
    assert "| knapsack | 2 | 0.688 ± 0.000 | 1.375 ± 0.000 |" in alloc_study.markdown({"paired": res})
    # xrpo-plus is also paired with Knapsack RL: here the knapsack runs copied, so its ratio is 1
    for seed in (0, 1):
        _run(tmp_path, "xrpo-plus", seed, [_step(s + 1, p, *x) for s, (p, x) in enumerate(zip(probs, k))], 0.32)
    res = alloc_study.paired(rep.load_runs(tmp_path, ["grpo", "knapsack", "xrpo-plus"], [0, 1]))
    assert res["xrpo-plus"]["all"]["vs_knapsack"]["mean"] == pytest.approx(1.0)
    assert res["xrpo-plus"]["all"]["vs_grpo"]["mean"] == pytest.approx(22 / 16)


def test_prediction_is_the_simulator_on_grpos_rounds_mixed_by_history(alloc_study, tmp_path):
    from xrpo.sim.runner import SimConfig, simulate

    probs = [[f"p{(2 * s + j) % 6}" for j in range(2)] for s in range(9)]  # 3 steps an epoch
    succ = [[1, 3], [0, 4], [2, 2]]
    rounds = [_step(s + 1, p, [4, 4], succ[s % 3]) for s, p in enumerate(probs)]
    _run(tmp_path, "grpo", 0, rounds, 0.3)
    runs = alloc_study.report.load_runs(tmp_path, ["grpo"], [0])
    pred = alloc_study.prediction(runs, steps=30)
    f = alloc_study.run_signal(runs["grpo"][0])["history_share"]
    assert f == pytest.approx(12 / 18)
    share = {}
    for lv in (0, 4):
        cfg = SimConfig(
            rounds_file=str(tmp_path / "grpo" / "seed0" / "rounds.jsonl"),
            methods=["uniform", "knapsack", "xrpo-plus"],
            prompts=2,
            rollouts=8,
            steps=30,
            seed=0,
            n_base=4,
            rounds=2,
            last_visit=lv,
        )
        share[lv] = {m: v["informative_share"]["mean"] for m, v in simulate(cfg, latency=False)["methods"].items()}
    for m in ("knapsack", "xrpo-plus"):
        want = ((1 - f) * share[0][m] + f * share[4][m]) / ((1 - f) * share[0]["uniform"] + f * share[4]["uniform"])
        assert pred["methods"][m]["all"]["mean"] == pytest.approx(want, rel=1e-12)
        assert pred["methods"][m]["revisit"]["mean"] == pytest.approx(share[4][m] / share[4]["uniform"], rel=1e-12)
