"""examples/verl/prepare_data.py: xrpo's loaders in, verl's parquet out, read back by verl's RLHFDataset."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("verl")

from omegaconf import OmegaConf  # noqa: E402
from verl.trainer.ppo.utils import create_rl_dataset  # noqa: E402

from xrpo.data import load_problems  # noqa: E402
from xrpo.integrations.verl.main import check_config, load_config  # noqa: E402

from ..conftest import EXAMPLES, example  # noqa: E402


def prepare(argv):
    mod = example("prepare_data")
    assert mod.main(argv) == 0
    return mod


def verl_rows(path, tokenizer):
    cfg = OmegaConf.create(
        {
            "max_prompt_length": 512,
            "filter_overlong_prompts": False,
            "prompt_key": "prompt",
            "cache_dir": str(Path(path).parent / "cache"),
        }
    )
    ds = create_rl_dataset(str(path), cfg, tokenizer, None, is_train=True)
    return [ds[i] for i in range(len(ds))]


def test_files_with_sampling_and_the_answer_instruction(tmp_path, tiny_tokenizer):
    src = tmp_path / "train.jsonl"
    src.write_text(
        "\n".join(json.dumps({"id": f"q{i}", "question": f"What is {i}+1?", "answer": i + 1}) for i in range(10)) + "\n"
    )
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps({"id": "v0", "question": "What is 9+9?", "answer": "18"}) + "\n")
    mod = prepare(["--train", str(src), "--val", str(val), "--train-limit", "4", "--out", str(tmp_path / "out")])
    rows = verl_rows(tmp_path / "out" / "train.parquet", tiny_tokenizer)
    assert len(rows) == 4 and len({r["extra_info"]["index"] for r in rows}) == 4
    for r in rows:
        i = int(r["extra_info"]["index"][1:])
        assert r["raw_prompt"] == [{"role": "user", "content": f"What is {i}+1?\n{mod.BOXED}"}]
        assert r["reward_model"]["ground_truth"] == str(i + 1)
    # xrpo reads its own output back
    assert [p.id for p in load_problems(tmp_path / "out" / "val.parquet")] == ["v0"]


def test_builtin_task_offline(tmp_path, tiny_tokenizer):
    prepare(["--task", "default", "--n-train", "6", "--n-val", "2", "--out", str(tmp_path)])
    rows = verl_rows(tmp_path / "train.parquet", tiny_tokenizer)
    assert len(rows) == 6 and all(r["data_source"].startswith("reasoning_gym/") for r in rows)
    assert len(verl_rows(tmp_path / "val.parquet", tiny_tokenizer)) == 2


def test_builtin_task_families_and_levels(tmp_path):
    # the CPU dry run's data: the easiest gcd problems only, validation problems as the seed corpus
    seed = tmp_path / "seed.jsonl"
    argv = ["--task", "default", "--families", "gcd", "--levels", "0", "--n-train", "6", "--n-val", "2"]
    prepare([*argv, "--seed-corpus", str(seed), "--out", str(tmp_path)])
    for name, n in (("train", 6), ("val", 2)):
        problems = load_problems(tmp_path / f"{name}.parquet")
        assert len(problems) == n
        assert all(p.id.startswith("gcd-L0-") and p.text.startswith("gcd(") for p in problems)
    assert [json.loads(line)["problem_id"][:7] for line in seed.read_text().splitlines()] == ["gcd-L0-"] * 2
    with pytest.raises(ValueError, match="unknown family 'gdc'"):
        prepare(["--task", "default", "--families", "gdc", "--out", str(tmp_path / "bad")])
    with pytest.raises(SystemExit):  # argparse: --families chooses problems of --task default only
        prepare(
            [
                "--train",
                str(tmp_path / "train.parquet"),
                "--val",
                str(tmp_path / "val.parquet"),
                "--levels",
                "0",
                "--out",
                str(tmp_path / "bad"),
            ]
        )


def test_gpu_smoke_test_config_is_valid(tmp_path):
    # the overrides examples/verl/smoke_test.sh passes, composed and checked by verl's and xrpo's validation
    out = subprocess.run(
        [
            "bash",
            "-c",
            f'OUT={tmp_path}; source <(sed -n "/^ARGS=(/,/^)/p" {EXAMPLES / "smoke_test.sh"}); '
            'printf "%s\\n" "${ARGS[@]}"',
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    overrides = out.stdout.split()
    assert "trainer.total_training_steps=2" in overrides and len(overrides) > 20
    cfg = load_config(overrides=overrides)
    x = check_config(cfg)
    assert (x.n_base, cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n) == (2, 16)


def test_smoke_model_loads_where_verl_loads_it(tmp_path, tiny_tokenizer):
    from verl.utils.config import omega_conf_to_dataclass

    model = example("make_tiny_model").build_tiny_llama(tiny_tokenizer)
    model.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    mc = omega_conf_to_dataclass(
        load_config(overrides=[f"actor_rollout_ref.model.path={tmp_path}"]).actor_rollout_ref.model
    )
    assert mc.hf_config.model_type == "llama" and mc.hf_config.hidden_size // mc.hf_config.num_attention_heads == 64
    assert mc.tokenizer.eos_token_id == tiny_tokenizer.eos_token_id
