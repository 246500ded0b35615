"""The code verifier in the loop: `xrpo train` on a small code dataset, and held-out scoring through the real HF engine.

The tiny random model writes no code, so its rewards are 0: those tests check that a code dataset goes through the
whole pipeline (loader -> renderer -> engine -> sandboxed verifier -> logs) and that verdict reasons are recorded. A
second tiny model, fine-tuned to write a right or an off-by-one program, gives groups with both rewards, so training
with code rewards is checked with a learning signal too.
"""

from __future__ import annotations

import json

import pytest

from xrpo.data import Problem, load_problems
from xrpo.models.tiny import build_tiny_model, build_tiny_tokenizer
from xrpo.rewards import get_verifier
from xrpo.rollout.engine import SamplingParams
from xrpo.rollout.hf_engine import HFEngine
from xrpo.rollout.prompts import PromptRenderer
from xrpo.rollout.validate import sample_and_score
from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train

REASONS = {
    "no_code",
    "syntax_error",
    "wrong_answer",
    "runtime_error",
    "timeout",
    "memory",
    "output_limit",
    "sample_timeout",
    None,
}


def code_rows(n: int, prefix: str) -> list[dict]:
    rows = []
    for i in range(n):
        if i % 2:  # LiveCodeBench-style stdin tests, JSON-encoded in a string column
            tests = [{"input": f"{i} {k}\n", "output": f"{i + k}\n", "testtype": "stdin"} for k in range(3)]
            rows.append(
                {"id": f"{prefix}{i}", "question": f"Read a and b, print a+b. ({i})", "tests": json.dumps(tests)}
            )
        else:  # functional tests with the function name next to them
            tests = [{"input": f"{k}", "output": f"{k * i}", "testtype": "functional"} for k in range(3)]
            rows.append(
                {
                    "id": f"{prefix}{i}",
                    "question": f"Write times(k) returning k*{i}.",
                    "tests": json.dumps({"tests": tests, "fn_name": "times"}),
                }
            )
    return rows


@pytest.fixture(scope="module")
def code_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("code_env")
    texts = ["```python\nprint(sum(map(int, input().split())))\n```", "def times(k):\n    return k * 3\n"] * 10
    texts += [r["question"] for r in code_rows(12, "t")]
    tok = build_tiny_tokenizer(texts)
    model = build_tiny_model(tok, d_model=32, layers=2, heads=2, ffn=64, seed=0)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    for name, rows in (("train", code_rows(12, "t")), ("heldout", code_rows(4, "h"))):
        (root / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def code_train_config(env, out, *overrides):
    """Two XRPO steps on `env`'s code dataset (train.jsonl / heldout.jsonl with a tests column), code verifier."""
    return build_config(
        None,
        [
            f"output={out}",
            "steps=2",
            "method.name=xrpo",
            f"model.path={env / 'model'}",
            f"data.train={env / 'train.jsonl'}",
            f"data.heldout={env / 'heldout.jsonl'}",
            "data.answer_key=tests",
            "data.verifier=code",
            "data.verifier_args={timeout: 2, sample_timeout: 10, memory_mb: 256, workers: 2}",
            "rollout.prompts_per_step=4",
            "rollout.embedder=hash",
            "eval_every=0",
            "save_every=0",
            "log_samples_every=1",
            "progress=false",
            "tensorboard=false",
            "data.prompt_template=Q: {prompt}\nA:",
            "data.max_prompt_tokens=128",
            *overrides,
        ],
    )


def test_code_dataset_loads_with_answer_key(code_env):
    problems = load_problems(code_env / "train.jsonl", answer_key="tests")
    verifier = get_verifier("code", workers=2, timeout=2, memory_mb=256)
    good = [
        "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
        if i % 2
        else f"```python\ndef times(k):\n    return k * {i}\n```"
        for i in range(len(problems))
    ]
    results = verifier.verify_batch(good, [p.answer for p in problems])
    assert [r.score for r in results] == [1.0] * len(problems)


def test_train_two_steps_on_code(code_env, tmp_path):
    out = tmp_path / "run"
    cfg = code_train_config(
        code_env,
        out,
        "rollout.rollouts_per_step=16",
        "method.n_base=2",
        "rollout.max_new_tokens=8",
        "eval_samples=2",
        "eval_k=[1,2]",
        "optim.lr=1e-2",
        "optim.micro_batch_tokens=64",
    )
    summary = train(cfg, log=lambda *_: None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    assert all("time/verify" in r and r["time/verify"] > 0 for r in rows)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["reason"] in REASONS for s in samples)
    assert all((s["reward"] == 1.0) == (s["reason"] is None) for s in samples)
    assert 0.0 <= summary["pass@1_before"] <= 1.0 and 0.0 <= summary["pass@1_after"] <= 1.0


def test_sample_and_score_with_the_hf_engine(code_env):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(code_env / "model")
    model = AutoModelForCausalLM.from_pretrained(code_env / "model")
    problems = load_problems(code_env / "heldout.jsonl", answer_key="tests")
    engine = HFEngine(model, tok)
    renderer = PromptRenderer(tok, use_chat_template=False, prompt_template="Q: {prompt}\nA:")
    verifier = get_verifier("code", workers=2, timeout=2, memory_mb=256)
    metrics, per = sample_and_score(
        problems, engine, verifier, renderer, n=3, ks=(1, 3), sampling=SamplingParams(max_new_tokens=12, seed=0)
    )
    assert set(metrics) >= {"eval/pass@1", "eval/pass@3", "eval/cons@3"}
    assert 0.0 <= metrics["eval/pass@1"] <= metrics["eval/pass@3"] <= 1.0
    assert [d["n"] for d in per] == [3] * len(problems)
    # the random model writes no fenced code: every sample is graded 0 with no program
    assert all(a is None for d in per for a in d["answers"])
    assert metrics["eval/pass@1"] == 0.0


def test_problem_answer_is_the_json_test_column(code_env):
    p = load_problems(code_env / "train.jsonl", answer_key="tests")[0]
    assert isinstance(p, Problem) and json.loads(p.answer)["fn_name"] == "times"


def test_xrpo_eval_on_a_code_dataset(code_env, tmp_path):
    # `xrpo eval` with the code verifier: the tests column is the reference, the sandboxed verifier scores every sample
    from xrpo.cli import main

    out = tmp_path / "eval"
    rc = main(
        [
            "eval",
            str(code_env / "model"),
            f"{code_env / 'heldout.jsonl'}:name=code,answer=tests",
            "--verifier",
            "code",
            "--verifier-args",
            "{timeout: 2, sample_timeout: 10, memory_mb: 256, workers: 2}",
            "--n",
            "2",
            "--k",
            "1",
            "2",
            "--max-new-tokens",
            "8",
            "--prompt-template",
            "Q: {prompt}\nA:",
            "--output",
            str(out),
        ]
    )
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    settings = json.loads((out / "settings.json").read_text())
    assert settings["verifier"] == "code" and settings["verifier_args"]["memory_mb"] == 256
    recs = res["per_problem"]["code"]
    assert [r["id"] for r in recs] == [f"h{i}" for i in range(4)]
    for r, row in zip(recs, code_rows(4, "h")):
        assert r["n"] == 2 and r["reference"] == row["tests"]
        assert r["c"] == sum(r["correct"]) == 0  # the random model writes no code block
    # the figures are those of the per-problem counts: nothing solved
    m = res["datasets"]["code"]["metrics"]
    assert m["pass@1"] == 0.0 and m["pass@2"] == 0.0 and m["no_answer_rate"] == 1.0


def test_xrpo_eval_rejects_bad_verifier_args(code_env, tmp_path, capsys):
    from xrpo.cli import main

    rc = main(
        [
            "eval",
            str(code_env / "model"),
            f"{code_env / 'heldout.jsonl'}:answer=tests",
            "--verifier",
            "code",
            "--verifier-args",
            "[1, 2]",
            "--n",
            "1",
            "--output",
            str(tmp_path / "e"),
        ]
    )
    assert rc == 2 and "--verifier-args must be a YAML mapping" in capsys.readouterr().err


def test_train_refuses_a_malformed_reference_before_the_first_step(code_env, tmp_path):
    rows = code_rows(6, "t")
    rows[3]["tests"] = json.dumps({"tests": "not a list"})
    rows[4]["tests"] = json.dumps({"test": "def check(c):\n    assert helper(c(1))\n", "entry_point": "f"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    cfg = build_config(
        None,
        [
            f"output={out}",
            "steps=2",
            "method.name=grpo",
            f"model.path={code_env / 'model'}",
            f"data.train={bad}",
            f"data.heldout={code_env / 'heldout.jsonl'}",
            "data.answer_key=tests",
            "data.verifier=code",
            "rollout.prompts_per_step=2",
            "rollout.rollouts_per_step=8",
            "rollout.max_new_tokens=8",
            "eval_every=0",
            "progress=false",
            "tensorboard=false",
            "data.prompt_template=Q: {prompt}\nA:",
            "data.max_prompt_tokens=128",
        ],
    )
    with pytest.raises(ValueError) as e:
        train(cfg, log=lambda *_: None)
    msg = str(e.value)
    assert msg.startswith(f"data.train ({bad}): 2 of 6 reference answers cannot be graded by the 'code' verifier")
    assert "problem 't3' (row 3)" in msg and "problem 't4' (row 4)" in msg and "helper" in msg
    # no step ran: the run logger (opened before loading, so that trackers fail early) logged no row
    metrics = out / "metrics.jsonl"
    assert not metrics.exists() or metrics.read_text() == ""


def test_xrpo_eval_refuses_a_malformed_reference_before_loading_the_model(code_env, tmp_path, capsys):
    from xrpo.cli import main

    rows = code_rows(4, "h")
    rows[2]["tests"] = '[{"input": "1"}]'  # a test case without its expected output
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "e"
    (tmp_path / "not-a-model").mkdir()  # a directory, so the model's own checks pass; loading it would fail
    rc = main(
        [
            "eval",
            str(tmp_path / "not-a-model"),
            f"{bad}:name=B,answer=tests",
            "--verifier",
            "code",
            "--n",
            "1",
            "--output",
            str(out),
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"data B ({bad}): 1 of 4 reference answers cannot be graded by the 'code' verifier" in err
    assert "problem 'h2' (row 2)" in err and not out.exists()


SUM_OK = "```python\nprint(sum(map(int, input().split())))\n```"
SUM_WRONG = "```python\nprint(sum(map(int, input().split())) + 1)\n```"


@pytest.fixture(scope="module")
def coder_env(tmp_path_factory):
    """A tiny model fine-tuned to answer the stdin a+b problems with a correct or an off-by-one program, half each: its
    rollouts earn rewards of 1 and 0 within one group, so GRPO, ICL and sharpening have signal to work on."""
    import torch

    root = tmp_path_factory.mktemp("coder_env")
    rows = [r for r in code_rows(16, "t") if r["id"][1:].isdigit() and int(r["id"][1:]) % 2]  # stdin problems
    tok = build_tiny_tokenizer([SUM_OK, SUM_WRONG] * 10 + [r["question"] for r in rows] + ["Q: A:"])
    model = build_tiny_model(tok, d_model=32, layers=2, heads=2, ffn=64, seed=0)
    seqs = []
    for r in rows:
        p = tok(f"Q: {r['question']}\nA:", add_special_tokens=False)["input_ids"]
        for sol in (SUM_OK, SUM_WRONG):
            a = tok(" " + sol, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            seqs.append((p + a, [-100] * len(p) + a))
    width = max(len(i) for i, _ in seqs)
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    labels = torch.full((len(seqs), width), -100)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for b, (i, lab) in enumerate(seqs):
        ids[b, : len(i)], labels[b, : len(lab)], mask[b, : len(i)] = torch.tensor(i), torch.tensor(lab), 1
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(80):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    (root / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:6]))
    (root / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[6:]))
    return root


def test_train_on_code_with_rewards_that_vary(coder_env, tmp_path):
    """`xrpo train` with the code verifier where the model writes programs: passing and failing rollouts in the same
    group, so the step has non-zero advantages, the corpus keeps the verified programs, the sandbox's verdicts are
    logged, and the held-out pass@1 is that of the programs' verdicts."""
    out = tmp_path / "run"
    cfg = code_train_config(
        coder_env,
        out,
        "rollout.rollouts_per_step=24",
        "method.n_base=4",
        "rollout.max_new_tokens=40",
        "eval_samples=4",
        "eval_k=[1,4]",
        "optim.lr=1e-3",
        "optim.micro_batch_tokens=512",
    )
    summary = train(cfg, log=lambda *_: None)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    # the model's two programs, graded by running them: the right one passes, the off-by-one fails its tests
    graded = {(s["completion"].strip(), s["reward"], s["reason"]) for s in samples}
    assert (SUM_OK, 1.0, None) in graded and (SUM_WRONG, 0.0, "wrong_answer") in graded
    for r in rows:
        assert 0.0 < r["rollout/reward_mean"] < 1.0 and r["adv/abs_mean"] > 0.0
        assert r["rollout/zero_variance_group_frac"] < 1.0
    # verified programs join the ICL corpus (Alg. 1 line 15)
    assert rows[-1]["icl/corpus_solutions"] > 0
    assert 0.0 < summary["pass@1_before"] < 1.0 and 0.0 < summary["pass@1_after"] < 1.0
