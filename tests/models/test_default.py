"""xrpo.models.default: the warm-start's problems (default task or a chosen one) and a model built into a directory."""

from __future__ import annotations

import json

from xrpo.data.tasks import make_default_task
from xrpo.models import loading
from xrpo.models.default import WarmupTask, _warmup_examples, build_model_dir


def _targets(seqs):
    # the last segment of a sequence is the problem it teaches; the ones before it are its shots
    return [s[-1][0] for s in seqs]


def test_a_chosen_task_warms_up_on_its_families_without_the_held_out_questions_of_the_given_seeds():
    task = WarmupTask(
        families=("gcd", "products"), levels={"products": (2,)}, problems=400, heldout=60, heldout_seeds=(0, 3)
    )
    seqs = _warmup_examples(task)
    banned = {
        f"Q: {p.text}\nA:"
        for s in (0, 3)
        for p in make_default_task(n_train=0, n_heldout=60, seed=s, families=["gcd", "products"], levels=task.levels)[1]
    }
    prompts = [seg[0] for s in seqs for seg in s]
    assert len(seqs) > 300 and not banned & set(_targets(seqs))
    assert all(p.startswith(("Q: gcd(", "Q: ")) for p in prompts)
    assert {p.startswith("Q: gcd(") for p in prompts} == {True, False}
    # products at level 2 only: three factors
    assert all(p.count("*") == 2 for p in prompts if not p.startswith("Q: gcd("))
    # a 2-shot sequence's shots are of its target's family
    shot = [s for s in seqs if len(s) == 3]
    assert shot and all(len({seg[0].startswith("Q: gcd(") for seg in s}) == 1 for s in shot)


def test_the_default_task_bans_the_default_runs_held_out_questions():
    seqs = _warmup_examples(WarmupTask(problems=600))
    heldout = {f"Q: {p.text}\nA:" for p in make_default_task(n_train=0, n_heldout=200, seed=0)[1]}
    pool = {f"Q: {p.text}\nA:" for p in make_default_task(n_train=600, n_heldout=0, seed=1234)[0]}
    assert heldout & pool  # the draw does contain held-out questions ...
    assert not heldout & set(_targets(seqs))  # ... and the warm-start leaves them out


def test_build_model_dir_writes_a_loadable_model_with_its_task(tmp_path):
    task = WarmupTask(families=("gcd",), problems=80, heldout=10)
    out = build_model_dir(tmp_path / "m", warmup_steps=2, task=task, log=lambda *_: None)
    assert (out / "COMPLETE").exists() and not list(tmp_path.glob("m.tmp*"))
    stats = json.loads((out / "warmup.json").read_text())
    assert stats["warmup_steps"] == 2 and stats["task"]["families"] == ["gcd"] and stats["task"]["heldout"] == 10
    model, tokenizer, path = loading.load_model(str(out), log=lambda *_: None)
    assert path == str(out) and model.config.model_type == "qwen2"
    assert tokenizer("Q: gcd(4, 6) = ?\nA:")["input_ids"]
