"""Config composition with verl's hydra machinery, and validation (verl's validate_config + XRPO's checks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("verl")

from verl.utils.config import omega_conf_to_dataclass  # noqa: E402

from xrpo.algo.allocation import plan_phases  # noqa: E402
from xrpo.integrations.verl.config import XRPOConfig, rollouts_per_step, validate_xrpo_config  # noqa: E402
from xrpo.integrations.verl.main import check_config, load_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ROOT / "examples" / "verl"
# micro-batch sizes verl's validate_config insists on when dynamic batch sizes are off
CPU_VALID = (
    "data.train_batch_size=16",
    "actor_rollout_ref.actor.ppo_mini_batch_size=16",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "trainer.n_gpus_per_node=8",
)


def compose(*overrides: str):
    """xrpo_trainer.yaml composed by hydra (verl's config machinery) with the overrides."""
    return load_config(overrides=overrides)


def test_default_composition_switches_xrpo_on():
    cfg = compose()
    assert cfg.algorithm.adv_estimator == "xrpo"
    assert cfg.trainer.use_v1 is False and cfg.critic.enable is False
    assert cfg.reward.custom_reward_function.path == "pkg://xrpo.integrations.verl.reward"
    assert cfg.reward.custom_reward_function.reward_kwargs.verifier == "math"
    # the paper's loss settings (§4.1 and its GRPO baseline)
    a = cfg.actor_rollout_ref.actor
    assert (a.use_kl_loss, a.kl_loss_coef, a.kl_loss_type) == (True, 0.001, "low_var_kl")
    assert (a.clip_ratio_low, a.clip_ratio_high, a.loss_agg_mode) == (0.2, 0.28, "token-mean")
    # verl builds the block through its _target_ with verl's own helper
    x = omega_conf_to_dataclass(cfg.algorithm.xrpo)
    assert isinstance(x, XRPOConfig)
    assert (x.n_base, x.plan_rounds, x.icl_k, x.lam_nov, x.kappa_clip, x.alpha, x.lam) == (4, 2, 2, 2.5, 0.5, 0.05, 0.1)
    assert x.plan_config(128).rollouts_per_step == 128


def test_overrides_reach_the_block_and_bad_values_name_the_key():
    x = validate_xrpo_config(compose(*CPU_VALID, "algorithm.xrpo.n_base=3", "algorithm.xrpo.allocation=uniform"))
    assert (x.n_base, x.allocation) == (3, "uniform")
    for override, words in [
        ("algorithm.xrpo.n_base=1", "n_base must be >= 2"),
        ("algorithm.xrpo.allocation=greedy", "allocation must be one of hrp, uniform, knapsack, xrpo-plus"),
        ("algorithm.xrpo.alpha=1.5", "algorithm.xrpo.alpha=1.5: alpha is the significance level"),
        ("algorithm.xrpo.alpha=0.95", "must lie in (0, 0.5)"),
        ("algorithm.xrpo.batch_align=cut", "batch_align must be one of"),
        ("algorithm.xrpo.icl_train_prompt=both", "icl_train_prompt must be one of"),
        ("algorithm.xrpo.lam_nov=-1", "lam_nov must be a finite number >= 0"),
        ("algorithm.xrpo.lam=inf", "lam must be a finite number >= 0, got inf"),
        # the sections' checks that verl's block did not have before it embedded them
        ("algorithm.xrpo.icl_k=0", "algorithm.xrpo.icl_k must be >= 1"),
        # CurES chooses the step's prompts; verl's dataloader does on verl: refused with the reason
        ("algorithm.xrpo.allocation=cures", "cures chooses each step's prompts and their counts itself"),
        ("algorithm.xrpo.icl_novelty=sample", "algorithm.xrpo.icl_novelty must be train"),
        ("algorithm.xrpo.max_extra_per_prompt=-2", "max_extra_per_prompt must be >= 0 or null"),
        # found by a fuzz of the block (each accepted before, then failed inside the run or meant something else)
        ("algorithm.xrpo.epsilon=nan", "algorithm.xrpo.epsilon must be a finite number >= 0, got nan"),
        ("algorithm.xrpo.epsilon=abc", "algorithm.xrpo.epsilon must be a finite number >= 0, got 'abc'"),
        ("algorithm.xrpo.rollouts_per_step=200.5", "algorithm.xrpo.rollouts_per_step must be an int >= 1 or null"),
        ("algorithm.xrpo.rollouts_per_step=abc", "algorithm.xrpo.rollouts_per_step must be an int >= 1 or null"),
        ("algorithm.xrpo.sharpen=null", "algorithm.xrpo.sharpen must be true or false, got None"),
        ("algorithm.xrpo.icl='false'", "algorithm.xrpo.icl must be true or false, got 'false'"),
        ("algorithm.xrpo.corpus_init=1", "algorithm.xrpo.corpus_init must be null or the path of a JSONL"),
        ("algorithm.xrpo._target_=nosuch.Config", "its _target_ is 'nosuch.Config'; expected xrpo.integrations"),
        ("algorithm.xrpo._target_=null", "its _target_ is None; expected xrpo.integrations.verl.config.XRPOConfig"),
    ]:
        with pytest.raises(ValueError, match="algorithm.xrpo") as e:
            validate_xrpo_config(compose(*CPU_VALID, override))
        assert words in str(e.value), (override, str(e.value))
    with pytest.raises(Exception, match="nbase"):  # hydra refuses keys the block does not have (struct config)
        compose("algorithm.xrpo.nbase=3")


@pytest.mark.parametrize("allocation", ["knapsack", "xrpo-plus"])
def test_allocations_that_read_history_are_served(allocation):
    # (the driver keeps each prompt's last visit for them: test_history.py)
    x = validate_xrpo_config(compose(*CPU_VALID, f"algorithm.xrpo.allocation={allocation}"))
    assert x.allocation == allocation


def test_verl_and_xrpo_validation_pass_on_cpu():
    cfg = compose(*CPU_VALID)
    x = check_config(cfg)  # verl's validate_config, then validate_xrpo_config
    assert rollouts_per_step(cfg, x) == 16 * 8
    assert plan_phases(16, 128, x.n_base, x.plan_rounds) == (4, (32, 32))


@pytest.mark.parametrize(
    "overrides, words",
    [
        # 16 x 2 < 16 x n_base (4)
        (
            ("actor_rollout_ref.rollout.n=2",),
            "XRPO budget: 32 rollouts per step (data.train_batch_size x actor_rollout_ref.rollout.n = 16 x 2)",
        ),
        (
            ("algorithm.xrpo.rollouts_per_step=63",),
            "XRPO budget: 63 rollouts per step (algorithm.xrpo.rollouts_per_step) for data.train_batch_size=16",
        ),
        (("algorithm.xrpo.corpus_init=/no/such/seed.jsonl",), "corpus_init='/no/such/seed.jsonl' is not a file"),
        (("trainer.use_v1=true",), "trainer.use_v1 must be false"),
        (("algorithm.adv_estimator=grpo",), "needs 'xrpo'"),
        # settings RayXRPOTrainer.fit would drop silently: refused, naming the key
        (("algorithm.rollout_correction.bypass_mode=true",), "algorithm.rollout_correction.bypass_mode=true is not"),
        (
            ("algorithm.rollout_correction.bypass_mode=true", "algorithm.xrpo.icl_train_prompt=icl"),
            "algorithm.rollout_correction.bypass_mode=true is not",
        ),
        (("algorithm.rollout_correction.bypass_mode=true", "algorithm.xrpo.icl=false"), "bypass_mode=true is not"),
        (("algorithm.rollout_correction.rollout_is=token",), "algorithm.rollout_correction.rollout_is='token' is not"),
        (
            (
                "algorithm.rollout_correction.rollout_rs=seq_mean_k3",
                "algorithm.rollout_correction.rollout_rs_threshold=2.0",
            ),
            "algorithm.rollout_correction.rollout_rs='seq_mean_k3' is not",
        ),
        (("skip.rollout.enable=true",), "skip.rollout.enable=true (verl's rollout-skip replay) is not"),
        (("skip.async_rollout.enable=true",), "skip.async_rollout.enable=true"),
        (("trainer.critic_warmup=5",), "trainer.critic_warmup=5 needs a critic"),
        (("algorithm.filter_groups.enable=true",), "filter_groups"),
        (("reward.reward_model.enable=true",), "enable_resource_pool"),
        # a cap the planning rounds (32 each over 16 prompts) or knapsack's one batch (128) cannot hold
        (("algorithm.xrpo.max_extra_per_prompt=1",), "max_extra_per_prompt=1 caps 16 prompts at 1 rollouts each"),
        (
            (
                "algorithm.xrpo.max_extra_per_prompt=7",
                "algorithm.xrpo.allocation=knapsack",
                "algorithm.xrpo.knapsack_fallback=leftover",
                "algorithm.xrpo.icl=false",
            ),
            "fewer than 128, the step's budget, placed in one batch with allocation=knapsack: give at least 8",
        ),
        # the authors' Knapsack RL caps a prompt with its own knob, never with max_extra_per_prompt
        (
            ("algorithm.xrpo.max_extra_per_prompt=8", "algorithm.xrpo.allocation=knapsack", "algorithm.xrpo.icl=false"),
            "max_extra_per_prompt must be null with allocation=knapsack and knapsack_fallback=authors",
        ),
    ],
)
def test_cross_section_checks(overrides, words):
    with pytest.raises(ValueError) as e:
        validate_xrpo_config(compose(*CPU_VALID, *overrides))
    assert words in str(e.value)


def test_rollouts_per_step_override_and_icl_prompt_choice_relax_checks():
    cfg = compose(*CPU_VALID, "algorithm.xrpo.rollouts_per_step=100")
    assert rollouts_per_step(cfg, validate_xrpo_config(cfg)) == 100
    # verl's default rollout_correction block (metrics only: no IS, no RS, no bypass) and skip block pass
    cfg = compose(*CPU_VALID, "algorithm.xrpo.icl_train_prompt=icl")
    assert cfg.algorithm.rollout_correction.rollout_is is None and cfg.skip.rollout.enable is False
    assert validate_xrpo_config(cfg).icl_train_prompt == "icl"


@pytest.mark.parametrize(
    "name, prompts, budget, rounds, prompt_len, response_len",
    [
        ("xrpo_qwen3_1p7b", 16, 128, (32, 32), 8192, 16384),
        ("xrpo_qwen2p5_7b_instruct", 8, 64, (16, 16), 4096, 8192),
    ],
)
def test_paper_recipes_compose_and_validate(name, prompts, budget, rounds, prompt_len, response_len):
    cfg = load_config(EXAMPLES / f"{name}.yaml")
    x = check_config(cfg)
    assert cfg.data.train_batch_size == prompts and rollouts_per_step(cfg, x) == budget
    # §4.1: 4 base rollouts per prompt, then 2 planning rounds share the rest
    assert plan_phases(prompts, budget, x.n_base, x.plan_rounds) == (4, rounds)
    assert cfg.actor_rollout_ref.rollout.prompt_length == prompt_len
    assert cfg.actor_rollout_ref.rollout.response_length == response_len
    assert cfg.actor_rollout_ref.actor.optim.lr == 2e-6 and cfg.actor_rollout_ref.actor.kl_loss_coef == 0.001
    assert x.embedder == "Qwen/Qwen3-Embedding-8B" and (x.lam_nov, x.kappa_clip, x.icl_k) == (2.5, 0.5, 2)
    # the whole step is one on-policy mini-batch
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == prompts


@pytest.mark.parametrize("name", ["xrpo_qwen3_1p7b", "xrpo_qwen2p5_7b_instruct"])
def test_recipe_data_paths_resolve_to_files_verl_loads(name, tmp_path, monkeypatch, tiny_tokenizer):
    # verl expands no "~" (its create_rl_dataset raised FileNotFoundError for '.../~/data/xrpo/train.parquet'):
    # the recipes use ${oc.env:HOME}, which OmegaConf resolves where XRPOTaskRunner.run resolves the config
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import create_rl_dataset

    home = os.environ.get("HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    try:
        _check_recipe_data_paths(name, tmp_path, tiny_tokenizer, create_rl_dataset, OmegaConf)
    finally:
        # something this test imports for the first time replaces os.environ by a new mapping (measured: the object
        # differs after the test), so monkeypatch's undo restores the old one and later tests, and the processes they
        # start, would see this tmp HOME (the built-in model's cache missed)
        if home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = home


def _check_recipe_data_paths(name, tmp_path, tiny_tokenizer, create_rl_dataset, OmegaConf):
    from xrpo.data import Problem, save_problems_verl_parquet

    data = tmp_path / "data" / "xrpo"
    probs = [Problem(id=f"p{i}", prompt=f"What is {i} + 1?", answer=str(i + 1)) for i in range(3)]
    save_problems_verl_parquet(probs, data / "train.parquet")
    save_problems_verl_parquet(probs[:2], data / "val.parquet")
    cfg = load_config(EXAMPLES / f"{name}.yaml")
    OmegaConf.resolve(cfg)  # as XRPOTaskRunner.run does before building the datasets
    assert (cfg.data.train_files, cfg.data.val_files) == (str(data / "train.parquet"), str(data / "val.parquet"))
    train = create_rl_dataset(cfg.data.train_files, cfg.data, tiny_tokenizer, None, is_train=True)
    val = create_rl_dataset(cfg.data.val_files, cfg.data, tiny_tokenizer, None, is_train=False)
    assert len(train) == 3 and len(val) == 2
    assert train[0]["extra_info"]["index"] == "p0" and train[2]["reward_model"]["ground_truth"] == "3"


def test_docs_and_recipes_use_no_tilde_paths():
    # bash leaves "~" unexpanded after "key=", and verl does not expand it either
    for path in [ROOT / "docs" / "verl.md", *EXAMPLES.glob("*.yaml"), *EXAMPLES.glob("*.sh"), *EXAMPLES.glob("*.py")]:
        text = path.read_text()
        assert "=~/" not in text and " ~/" not in text and ": ~/" not in text, path


@pytest.mark.slow  # two `xrpo verl --check` processes, each importing verl
def test_cli_check_validates_without_starting_anything(tmp_path):
    for name in ("train.parquet", "val.parquet"):  # only their existence is checked
        (tmp_path / name).write_bytes(b"")
    cmd = [
        sys.executable,
        "-m",
        "xrpo.cli",
        "verl",
        "--config",
        str(EXAMPLES / "xrpo_qwen3_1p7b.yaml"),
        "--check",
        f"data.train_files={tmp_path / 'train.parquet'}",
        f"data.val_files={tmp_path / 'val.parquet'}",
        "algorithm.xrpo.n_base=3",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "n_base: 3" in out.stdout and "xrpo verl: config OK" in out.stdout
    bad = subprocess.run(cmd[:-1] + ["algorithm.xrpo.n_base=1"], capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2
    assert "xrpo verl: error: algorithm.xrpo is invalid: config field algorithm.xrpo.n_base must be >= 2" in bad.stderr


def test_cli_names_the_key_of_a_setting_verl_refuses(capsys):
    # verl's own checks assert inside hydra's instantiation of its dataclasses: one line naming the key, no traceback
    from xrpo.cli import main

    assert main(["verl", "--check", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        "xrpo verl: error: actor_rollout_ref.actor: [actor] Please set at least one of 'actor.ppo_micro_batch_size' "
        "or 'actor.ppo_micro_batch_size_per_gpu' if use_dynamic_bsz is not enabled."
    )
    assert not any(line.startswith("Traceback") for line in err)
    # an assertion of verl's validate_config without a message still reads as a config error
    from xrpo.integrations.verl.main import config_error

    assert config_error(AssertionError()) == "AssertionError in verl's config check"


def test_a_mistyped_key_gets_the_nearest_one(capsys):
    from xrpo.cli import main
    from xrpo.integrations.verl.main import config_error, nearest_key

    cfg = compose()
    assert nearest_key(cfg, "algorithm.xrpo.nbase") == "algorithm.xrpo.n_base"
    assert nearest_key(cfg, "algoritm.xrpo.n_base") == "algorithm"  # the first missing part is the one replaced
    assert nearest_key(cfg, "algorithm.xrpo.zzzzzz") is None
    with pytest.raises(Exception) as e:
        compose("algorithm.xrpo.nbase=3")
    assert "did you mean algorithm.xrpo.n_base?" in config_error(e.value, None, ["algorithm.xrpo.nbase=3"])
    assert main(["verl", "--check", *CPU_VALID, "algorithm.xrpo.nbase=3"]) == 2
    assert "did you mean algorithm.xrpo.n_base?" in capsys.readouterr().err


def test_check_refuses_missing_data_files_and_shows_the_whole_config_on_request(tmp_path, capsys):
    from xrpo.cli import main

    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    files = [f"data.train_files={train}", f"data.val_files={val}"]
    assert main(["verl", "--check", *CPU_VALID, *files]) == 2
    assert f"data.train_files: {train} does not exist" in capsys.readouterr().err
    train.write_bytes(b"")
    val.write_bytes(b"")
    assert main(["verl", "--check", *CPU_VALID, *files]) == 0
    out = capsys.readouterr().out
    assert "xrpo verl: config OK" in out and "add --full" in out and "actor_rollout_ref:" not in out
    assert main(["verl", "--check", "--full", *CPU_VALID, *files]) == 0
    out = capsys.readouterr().out
    assert "actor_rollout_ref:" in out and f"train_files: {train}" in out and "${" not in out  # resolved


def test_cpu_mode_needs_the_file_logger_before_it_starts():
    from xrpo.integrations.verl.cpu import CPU_OVERRIDES, check_cpu_config

    check_cpu_config(compose(*CPU_OVERRIDES))
    with pytest.raises(ValueError, match=r"trainer.logger=\['console'\] has no 'file'"):
        check_cpu_config(compose(*CPU_OVERRIDES, "trainer.logger=[console]"))


def test_docs_list_every_knob_of_the_block():
    from dataclasses import fields

    doc = (ROOT / "docs" / "verl.md").read_text()
    base = (ROOT / "xrpo" / "integrations" / "verl" / "config" / "xrpo_base.yaml").read_text()
    for f in fields(XRPOConfig):
        if f.name != "_target_":
            assert f"| `{f.name}` |" in doc, f.name
            assert f"    {f.name}: " in base, f.name  # and the YAML sets each one explicitly
