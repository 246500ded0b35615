"""`xrpo.eval.evaluate` end to end on a tiny model: figures consistent with the per-problem counts, resume after an
interruption (no problem sampled twice, same results as one uninterrupted run), settings, prompts and references that
changed, damaged files, greedy, test-time ICL, run and checkpoint directories as the model, data specs."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from xrpo.algo.passk import majority_vote, mean_pass_at_k
from xrpo.data import DataError
from xrpo.eval.config import EvalConfig
from xrpo.eval.evaluate import evaluate


class Interrupt(Exception):
    pass


def quiet(*_):
    pass


def cfg_for(env, out, **kw) -> EvalConfig:
    base = dict(
        model=str(env["model"]),
        data=[str(env["data"])],
        n=4,
        max_new_tokens=6,
        verifier=env["verifier"],
        output=str(out),
        chunk_size=2,
        seed=3,
    )
    base.update(kw)
    return EvalConfig(**base)


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def check_consistent(results: dict) -> None:
    """Every figure of results.json recomputed from its per-problem counts."""
    for name, recs in results["per_problem"].items():
        m = results["datasets"][name]["metrics"]
        ns, cs = [r["n"] for r in recs], [r["c"] for r in recs]
        for k in results["ks"]:
            assert m[f"pass@{k}"] == pytest.approx(mean_pass_at_k(ns, cs, k), abs=1e-12)
        n = results["n"]
        if n > 1:
            votes = [majority_vote(r["answers"], r["correct"]) for r in recs]
            assert m[f"cons@{n}"] == pytest.approx(sum(votes) / len(recs), abs=1e-12)
        lengths = [x for r in recs for x in r["lengths"]]
        assert m["response_length_mean"] == pytest.approx(sum(lengths) / len(lengths), abs=1e-9)
        assert all(r["c"] == sum(r["correct"]) and r["n"] == len(r["answers"]) == n for r in recs)
    for key, avg in results["average"].items():
        if key != "unsampled_problems":
            vals = [d["metrics"][key] for d in results["datasets"].values()]
            assert avg == pytest.approx(sum(vals) / len(vals), abs=1e-12)


def test_figures_match_counts_and_files(eval_env, tmp_path):
    res = evaluate(cfg_for(eval_env, tmp_path / "e", k=[1, 2, 4]), log=quiet)
    check_consistent(res)
    (name,) = res["datasets"]
    assert name == "small" and res["datasets"][name]["num_problems"] == 7
    m = res["datasets"][name]["metrics"]
    assert 0 < m["pass@1"] < m["pass@4"] < 1  # the parity verifier gives mixed verdicts
    assert [r["id"] for r in lines(tmp_path / "e" / "per_problem" / "small.jsonl")] == [f"q{i}" for i in range(7)]
    saved = json.loads((tmp_path / "e" / "results.json").read_text())
    assert saved["per_problem"] == res["per_problem"] and saved["settings"]["prompt_template"] == "{prompt}"


def _records(problem_rows):
    # per-problem records as sample_and_score writes them: (answers, correct, lengths)
    return [
        {"id": i, "n": len(a), "c": sum(c), "answers": a, "correct": c, "lengths": ln, "truncated": 0}
        for i, (a, c, ln) in enumerate(problem_rows)
    ]


def test_make_results_averages_datasets_and_counts_unsampled_problems():
    from types import SimpleNamespace

    from xrpo.eval.results import make_results
    from xrpo.rollout.validate import unscored_record

    spec = SimpleNamespace(source="x")
    # dataset a: pass@1 = (2/2 + 0/2) / 2 = 0.5, cons@2 = (right, wrong) -> 0.5, lengths 3
    a = _records([(["1", "1"], [True, True], [3, 3]), (["2", None], [False, False], [3, 3])])
    # dataset b: pass@1 = 1/2, cons@2: "7" first of a 1-1 tie, right -> 1
    b = _records([(["7", "8"], [True, False], [1, 5])])
    datasets = [("a", spec, None, "a.jsonl"), ("b", spec, None, "b.jsonl")]
    res = make_results(SimpleNamespace(model="m"), {}, datasets, {"a": a, "b": b}, 2, [1, 2])
    assert res["datasets"]["a"]["num_problems"] == 2 and res["datasets"]["a"]["num_samples"] == 4
    avg = res["average"]
    # the mean over datasets (not over problems): pass@1 (0.5 + 0.5) / 2, pass@2 (1/2 + 1) / 2, cons@2 (0.5 + 1) / 2
    assert avg["pass@1"] == 0.5 and avg["pass@2"] == 0.75 and avg["cons@2"] == 0.75
    assert avg["response_length_mean"] == 3.0  # (3 + 3) / 2 of the two datasets' means
    # nothing skipped: no unsampled_problems figure anywhere
    assert "unsampled_problems" not in avg and all(
        "unsampled_problems" not in d["metrics"] for d in res["datasets"].values()
    )
    # one problem of b unsampled: a total (1, not a mean), and 0 in the datasets without any
    b2 = b + [unscored_record(SimpleNamespace(id="z", answer="1"), 2, "too long")]
    res = make_results(SimpleNamespace(model="m"), {}, datasets, {"a": a, "b": b2}, 2, [1])
    assert res["average"]["unsampled_problems"] == 1.0
    assert res["datasets"]["a"]["metrics"]["unsampled_problems"] == 0.0
    assert res["datasets"]["b"]["metrics"]["unsampled_problems"] == 1.0


def test_resume_after_interruption_equals_one_run(eval_env, tmp_path):
    one = evaluate(cfg_for(eval_env, tmp_path / "one"), log=quiet)

    calls = []

    def stop_after_two_chunks(name, recs):
        calls.append(recs)
        if len(calls) == 2:
            raise Interrupt

    with pytest.raises(Interrupt):
        evaluate(cfg_for(eval_env, tmp_path / "two"), log=quiet, on_chunk=stop_after_two_chunks)
    per = tmp_path / "two" / "per_problem" / "small.jsonl"
    assert [r["id"] for r in lines(per)] == ["q0", "q1", "q2", "q3"]
    assert not (tmp_path / "two" / "results.json").exists()

    sampled = []
    logs = []
    again = evaluate(
        cfg_for(eval_env, tmp_path / "two"),
        log=logs.append,
        on_chunk=lambda name, recs: sampled.extend(r["id"] for r in recs),
    )
    assert sampled == ["q4", "q5", "q6"]  # nothing sampled twice
    assert any("4 problems already scored, 3 to go" in x for x in logs)
    assert [r["id"] for r in lines(per)] == [f"q{i}" for i in range(7)]
    # same seed, same chunks: the resumed run is the uninterrupted one
    assert again["per_problem"] == one["per_problem"] and again["datasets"] == one["datasets"]
    # a third run samples nothing
    third = evaluate(
        cfg_for(eval_env, tmp_path / "two"), log=quiet, on_chunk=lambda *a: pytest.fail("sampled a finished problem")
    )
    assert third["average"] == one["average"]


def test_raising_the_limit_extends_a_run(eval_env, tmp_path):
    evaluate(cfg_for(eval_env, tmp_path / "e", limit=3), log=quiet)
    sampled = []
    res = evaluate(
        cfg_for(eval_env, tmp_path / "e", limit=5),
        log=quiet,
        on_chunk=lambda name, recs: sampled.extend(r["id"] for r in recs),
    )
    assert sampled == ["q3", "q4"] and res["datasets"]["small"]["num_problems"] == 5
    # a smaller limit reports the first problems only; the file keeps the rest
    res = evaluate(cfg_for(eval_env, tmp_path / "e", limit=2), log=quiet)
    assert [r["id"] for r in res["per_problem"]["small"]] == ["q0", "q1"]
    assert len(lines(tmp_path / "e" / "per_problem" / "small.jsonl")) == 5


def test_changed_settings_are_refused(eval_env, tmp_path):
    evaluate(cfg_for(eval_env, tmp_path / "e", limit=2), log=quiet)
    with pytest.raises(ValueError, match=r"other settings \(temperature: saved 1\.0, now 0\.7\)"):
        evaluate(cfg_for(eval_env, tmp_path / "e", limit=2, temperature=0.7), log=quiet)
    with pytest.raises(ValueError, match=r"n: saved 4, now 2"):
        evaluate(cfg_for(eval_env, tmp_path / "e", limit=2, n=2), log=quiet)
    # grading: records graded without arguments are not mixed with ones graded with them
    with pytest.raises(
        ValueError,
        match=r"other settings \(verifier_args: saved \{\}, now \{'timeout': 0\.5, "
        r"'workers': 1\}\)",
    ):
        evaluate(cfg_for(eval_env, tmp_path / "e", limit=2, verifier_args="{timeout: 0.5, workers: 1}"), log=quiet)
    # the seed stream: chunk c samples with a seed of (seed, dataset, c), so the chunk size decides a problem's seed
    with pytest.raises(ValueError, match=r"other settings \(chunk_size: saved 2, now 1\)"):
        evaluate(cfg_for(eval_env, tmp_path / "e", limit=3, chunk_size=1), log=quiet)
    # another sampler; refused before vllm is needed (not installed here)
    with pytest.raises(ValueError, match=r"other settings \(engine: saved 'hf', now 'vllm'\)"):
        evaluate(cfg_for(eval_env, tmp_path / "e", limit=2, engine="vllm"), log=quiet)
    # execution settings may change
    evaluate(cfg_for(eval_env, tmp_path / "e", limit=3, batch_size=8), log=quiet)
    saved = json.loads((tmp_path / "e" / "settings.json").read_text())
    assert (saved["verifier_args"], saved["chunk_size"], saved["engine"], saved["batch_size"]) == ({}, 2, "hf", 8)


def test_default_chunk_size_is_recorded_and_checked(eval_env, tmp_path):
    evaluate(cfg_for(eval_env, tmp_path / "e", limit=1, chunk_size=None), log=quiet)
    assert json.loads((tmp_path / "e" / "settings.json").read_text())["chunk_size"] == 128  # 512 // n=4
    # naming the default is the same setting
    evaluate(cfg_for(eval_env, tmp_path / "e", limit=2, chunk_size=128), log=quiet)
    with pytest.raises(ValueError, match=r"chunk_size: saved 128, now 3"):
        evaluate(cfg_for(eval_env, tmp_path / "e", limit=2, chunk_size=3), log=quiet)


def test_settings_of_version_1_are_read(eval_env, tmp_path):
    """A settings.json written before version 2: chunk_size None meant the default; no ICL corpus hash."""
    evaluate(cfg_for(eval_env, tmp_path / "e", limit=2, chunk_size=None), log=quiet)
    path = tmp_path / "e" / "settings.json"
    v1 = json.loads(path.read_text())
    v1.update(version=1, chunk_size=None)
    del v1["icl_corpus_sha"]
    path.write_text(json.dumps(v1))
    sampled = []
    evaluate(
        cfg_for(eval_env, tmp_path / "e", limit=3, chunk_size=None),
        log=quiet,
        on_chunk=lambda name, recs: sampled.extend(r["id"] for r in recs),
    )
    assert sampled == ["q2"] and json.loads(path.read_text())["version"] == 2
    path.write_text(json.dumps(dict(v1, verifier_args={"timeout": 2})))
    with pytest.raises(ValueError, match=r"verifier_args: saved \{'timeout': 2\}, now \{\}"):
        evaluate(cfg_for(eval_env, tmp_path / "e", limit=3, chunk_size=None), log=quiet)


def test_changed_prompts_are_refused(eval_env, tmp_path):
    two = tmp_path / "two.jsonl"
    two.write_text(
        "".join(
            json.dumps({"id": r["id"], "Q": r["problem"], "Q2": "Compute " + r["problem"], "A": r["answer"]}) + "\n"
            for r in eval_env["rows"]
        )
    )
    res = evaluate(cfg_for(eval_env, tmp_path / "e", data=[f"{two}:name=Two,prompt=Q,answer=A"], limit=2), log=quiet)
    recs = res["per_problem"]["Two"]
    # the dataset's prompt text, hashed: what a record was sampled from
    assert [r["prompt_sha"] for r in recs] == [
        hashlib.sha256(r["problem"].encode()).hexdigest()[:16] for r in eval_env["rows"][:2]
    ]
    assert lines(tmp_path / "e" / "per_problem" / "Two.jsonl") == recs
    with pytest.raises(
        ValueError,
        match=r"Two\.jsonl: problem 'q0' of dataset Two was sampled from another prompt "
        r"than the one .*two\.jsonl now gives \(prompt_sha saved '[0-9a-f]{16}', now",
    ):
        evaluate(cfg_for(eval_env, tmp_path / "e", data=[f"{two}:name=Two,prompt=Q2,answer=A"], limit=3), log=quiet)
    # records of an older xrpo carry no hash: read as unknown, with a note, and the run goes on
    per = tmp_path / "e" / "per_problem" / "Two.jsonl"
    per.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "prompt_sha"}) + "\n" for r in recs))
    logs = []
    res = evaluate(
        cfg_for(eval_env, tmp_path / "e", data=[f"{two}:name=Two,prompt=Q2,answer=A"], limit=3), log=logs.append
    )
    assert any("Two.jsonl: 2 saved problems have no prompt_sha" in x for x in logs)
    assert ["prompt_sha" in r for r in res["per_problem"]["Two"]] == [False, False, True]


def test_incomplete_last_line_is_dropped_and_resampled(eval_env, tmp_path):
    with pytest.raises(Interrupt):
        evaluate(cfg_for(eval_env, tmp_path / "e"), log=quiet, on_chunk=lambda *a: (_ for _ in ()).throw(Interrupt()))
    per = tmp_path / "e" / "per_problem" / "small.jsonl"
    text = per.read_text()
    per.write_text(text + text.splitlines()[0][:30])  # a write cut short mid-line
    logs = []
    res = evaluate(cfg_for(eval_env, tmp_path / "e"), log=logs.append)
    assert any("dropping an incomplete last record (line 3)" in x for x in logs)
    assert [r["id"] for r in lines(per)] == [f"q{i}" for i in range(7)]
    check_consistent(res)


def test_damaged_file_and_changed_reference_name_the_problem(eval_env, tmp_path):
    evaluate(cfg_for(eval_env, tmp_path / "e", limit=4), log=quiet)
    per = tmp_path / "e" / "per_problem" / "small.jsonl"
    rows = per.read_text().splitlines()
    per.write_text("\n".join([rows[0], "{oops", *rows[1:]]) + "\n")
    with pytest.raises(DataError, match=r"small\.jsonl line 2: not a per-problem record"):
        evaluate(cfg_for(eval_env, tmp_path / "e", limit=4), log=quiet)
    data = tmp_path / "small.jsonl"
    changed = [dict(r, answer="999") if r["id"] == "q1" else r for r in eval_env["rows"]]
    data.write_text("".join(json.dumps(r) + "\n" for r in changed))
    evaluate(cfg_for(eval_env, tmp_path / "f", data=[str(data)], limit=2), log=quiet)
    data.write_text("".join(json.dumps(r) + "\n" for r in eval_env["rows"]))
    with pytest.raises(ValueError, match=r"problem 'q1' was graded against reference '999' but .* now gives '4'"):
        evaluate(cfg_for(eval_env, tmp_path / "f", data=[str(data)], limit=2), log=quiet)


def test_greedy(eval_env, tmp_path):
    a = evaluate(cfg_for(eval_env, tmp_path / "a", n=None, greedy=True, chunk_size=3), log=quiet)
    b = evaluate(cfg_for(eval_env, tmp_path / "b", n=None, greedy=True, chunk_size=7, seed=99), log=quiet)
    assert a["n"] == 1 and a["ks"] == [1] and "cons@1" not in a["average"]
    # greedy decoding ignores seeds and chunking
    assert [r["lengths"] for r in a["per_problem"]["small"]] == [r["lengths"] for r in b["per_problem"]["small"]]
    assert a["settings"]["temperature"] == 0.0
    with pytest.raises(ValueError, match="--greedy draws one sample"):
        evaluate(cfg_for(eval_env, tmp_path / "c", greedy=True), log=quiet)


def test_test_time_icl_records_its_examples(eval_env, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"problem_id": "s1", "problem": "1 + 3 = ?", "solution": " \\boxed{4}"},
                {"problem_id": "s2", "problem": "2 + 4 = ?", "solution": " \\boxed{6}"},
                {"problem_id": "q0", "problem": "0 + 2 = ?", "solution": " \\boxed{2}"},  # q0 itself: never shown to q0
            ]
        )
    )
    res = evaluate(
        cfg_for(
            eval_env,
            tmp_path / "e",
            icl_corpus=str(corpus),
            embedder="hash",
            limit=3,
            icl_style="fewshot",
            prompt_template="Q: {prompt}\nA:",
        ),
        log=quiet,
    )
    recs = res["per_problem"]["small"]
    assert all(len(r["icl_examples"]) == 2 for r in recs)
    assert "q0" not in recs[0]["icl_examples"] and "q0" in recs[1]["icl_examples"]
    assert res["settings"]["icl_k"] == 2 and res["settings"]["embedder"] == "hash"
    # the paper's template does not fit the tiny model's 256-token context: the examples are cut, the prompt is plain
    res = evaluate(
        cfg_for(eval_env, tmp_path / "p", icl_corpus=str(corpus), embedder="hash", limit=1, icl_style="paper"),
        log=quiet,
    )
    assert res["per_problem"]["small"][0]["icl_examples"] == []
    assert lines(tmp_path / "e" / "per_problem" / "small.jsonl")[0]["icl_examples"] == recs[0]["icl_examples"]
    check_consistent(res)
    # another corpus under the same path shows other examples: its content is a setting
    with corpus.open("a") as f:
        f.write(json.dumps({"problem_id": "s3", "problem": "3 + 5 = ?", "solution": " \\boxed{8}"}) + "\n")
    with pytest.raises(ValueError, match=r"other settings \(icl_corpus_sha: saved '\w{16}', now '\w{16}'\)"):
        evaluate(
            cfg_for(
                eval_env,
                tmp_path / "e",
                icl_corpus=str(corpus),
                embedder="hash",
                limit=3,
                icl_style="fewshot",
                prompt_template="Q: {prompt}\nA:",
            ),
            log=quiet,
        )


def test_run_and_checkpoint_directories(eval_env, tiny_run, tmp_path):
    res = evaluate(EvalConfig(model=str(tiny_run), data=["default"], n=2, output=str(tmp_path / "r")), log=quiet)
    s = res["settings"]
    # from the run: its held-out file, prompt template, verifier, max_new_tokens; its latest checkpoint
    assert s["checkpoint"].endswith("step-00000003") and s["model"].endswith("step-00000003/model")
    assert s["prompt_template"] == "Q: {prompt}\nA:" and s["verifier"] == eval_env["verifier"]
    assert s["max_new_tokens"] == 6 and res["datasets"]["default"]["num_problems"] == 7
    check_consistent(res)
    ckpt = res["settings"]["checkpoint"]
    res2 = evaluate(EvalConfig(model=ckpt, data=["default"], n=2, output=str(tmp_path / "c")), log=quiet)
    assert res2["per_problem"] == res["per_problem"]
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        empty = tmp_path / "run"
        (empty / "checkpoints").mkdir(parents=True)
        (empty / "config.yaml").write_text("steps: 1\n")
        evaluate(EvalConfig(model=str(empty), output=str(tmp_path / "x")), log=quiet)


def test_per_problem_rows_carry_the_verifiers_reasons(eval_env, tmp_path):
    # each sample's reason, as the math verifier gives it for the saved completion
    from xrpo.rewards import MathVerifier

    res = evaluate(cfg_for(eval_env, tmp_path / "e", verifier="math", save_completions=True), log=quiet)
    rows = lines(tmp_path / "e" / "per_problem" / "small.jsonl")
    assert rows == res["per_problem"]["small"]
    grader = MathVerifier(in_process=True)
    for row in rows:
        assert len(row["reasons"]) == row["n"] == 4
        assert row["reasons"] == [grader(c, row["reference"]).reason for c in row["completions"]]
        assert all((why is None) == ok for why, ok in zip(row["reasons"], row["correct"]))


def test_a_completion_budget_the_context_cannot_hold_is_refused(eval_env, tmp_path):
    # the tiny model's context is 256 tokens: 256 new tokens leave no room for a prompt, and every problem would be
    # skipped as too long and counted unsolved (pass@k 0 without an error)
    with pytest.raises(ValueError, match=r"--max-new-tokens 256 leaves no room for a prompt in the model's context "):
        evaluate(
            EvalConfig(
                model=str(eval_env["model"]),
                data=[str(eval_env["data"])],
                n=1,
                max_new_tokens=256,
                output=str(tmp_path / "r"),
                verifier=eval_env["verifier"],
            ),
            log=quiet,
        )
    assert not list((tmp_path / "r").glob("*.jsonl"))  # refused before sampling
    # vLLM's context set below the completion budget: refused before vLLM starts
    with pytest.raises(ValueError, match="--vllm-max-model-len 8 leaves no room for a prompt with --max-new-tokens 8"):
        evaluate(
            EvalConfig(
                model=str(eval_env["model"]),
                data=[str(eval_env["data"])],
                n=1,
                max_new_tokens=8,
                engine="vllm",
                vllm_max_model_len=8,
                output=str(tmp_path / "v"),
                verifier=eval_env["verifier"],
            ),
            log=quiet,
        )


def test_data_specs(eval_env, tmp_path):
    upper = tmp_path / "upper.jsonl"
    upper.write_text(
        "".join(json.dumps({"Q": r["problem"], "A": r["answer"], "key": r["id"]}) + "\n" for r in eval_env["rows"][:3])
    )
    res = evaluate(
        cfg_for(
            eval_env,
            tmp_path / "e",
            data=[f"{upper}:name=Mine,prompt=Q,answer=A,id=key", str(eval_env["data"])],
            limit=2,
        ),
        log=quiet,
    )
    assert list(res["datasets"]) == ["Mine", "small"]
    assert res["datasets"]["Mine"]["loaded_as"]["prompt"] == "Q"
    assert [r["id"] for r in res["per_problem"]["Mine"]] == ["q0", "q1"]
    assert (tmp_path / "e" / "per_problem" / "Mine.jsonl").exists()
    res = evaluate(
        cfg_for(eval_env, tmp_path / "f", data=[str(upper)], column_map="prompt=Q,answer=A", limit=1), log=quiet
    )
    assert res["datasets"]["upper"]["num_problems"] == 1
    # the column map applies to a dataset with options of its own too; those override it key by key
    res = evaluate(
        cfg_for(eval_env, tmp_path / "h", data=[f"{upper}:name=U,id=key"], column_map="prompt=Q,answer=A", limit=2),
        log=quiet,
    )
    assert {k: res["datasets"]["U"]["loaded_as"][k] for k in ("prompt", "answer", "id")} == {
        "prompt": "Q",
        "answer": "A",
        "id": "key",
    }
    with pytest.raises(ValueError, match="two datasets are named 'small'"):
        evaluate(cfg_for(eval_env, tmp_path / "g", data=[str(eval_env["data"])] * 2), log=quiet)


def test_an_output_another_evaluation_holds_is_refused(eval_env, tmp_path):
    from xrpo.rundir.lock import RunLock, RunLockedError

    out = tmp_path / "e"
    with RunLock(out, "xrpo eval") as lock:  # another open file description: held, as by another process
        lock.claim()
        with pytest.raises(RunLockedError, match=rf"{out} is in use by xrpo eval \(pid {os.getpid()} on host "):
            evaluate(cfg_for(eval_env, out, limit=2), log=quiet)
        assert not (out / "settings.json").exists() and not (out / "per_problem").exists()
    res = evaluate(cfg_for(eval_env, out, limit=2), log=quiet)  # released: the same command runs
    assert res["sampled_problems_this_run"] == 2
