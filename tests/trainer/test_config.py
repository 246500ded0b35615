from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from xrpo.algo.presets import get_preset, list_presets
from xrpo.rundir.fields import field_docs
from xrpo.trainer.config import SECTIONS, MethodConfig, TrainConfig
from xrpo.trainer.config_loader import build_config, flatten, from_dict, help_text, load_config_file, to_dict

ROOT = Path(__file__).resolve().parents[2]


def test_every_field_has_a_docstring_in_help():
    text = help_text()
    for cls in [TrainConfig, *SECTIONS.values()]:
        docs = field_docs(cls)
        for f in fields(cls):
            if f.name in SECTIONS:
                continue
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring"
            assert f.name in text


def test_presets_set_every_method_knob_and_overrides_win():
    for name in list_presets():
        cfg = build_config(None, [f"method.name={name}"])
        for knob, value in get_preset(name).items():
            assert getattr(cfg.method, knob) == value, (name, knob)
    cfg = build_config(None, ["method.name=grpo", "method.kl_coef=0", "method.clip_high=0.3"])
    assert cfg.method.kl_coef == 0.0 and cfg.method.clip_high == 0.3
    assert cfg.method.allocation == get_preset("grpo")["allocation"]
    # every preset knob is a MethodConfig field
    knobs = {f.name for f in fields(MethodConfig)} - {"name"}
    assert set(get_preset("xrpo")) == knobs


def test_knobs_are_declared_once_and_embedded_as_they_are():
    # the trainer, the planner and TreePO's sampler hold the sections of xrpo.algo.config, not copies
    from xrpo.algo import config as knobs
    from xrpo.rollout.records import PlanConfig
    from xrpo.rollout.sources import SourceContext, TreeSource
    from xrpo.rollout.treepo import TreeConfig
    from xrpo.trainer.config import RolloutConfig
    from xrpo.trainer.loop import plan_config

    for section in knobs.METHOD_SECTIONS:
        assert issubclass(MethodConfig, section)
    assert issubclass(RolloutConfig, knobs.ICLPromptConfig) and issubclass(TreeConfig, knobs.TreePOConfig)
    assert issubclass(RolloutConfig, knobs.StreamConfig) and issubclass(PlanConfig, knobs.StreamConfig)
    for section in (
        knobs.AdvantageConfig,
        knobs.AllocationConfig,
        knobs.ICLConfig,
        knobs.ICLPromptConfig,
        knobs.SharpenConfig,
    ):
        assert issubclass(PlanConfig, section)
    # and every field the planner shares with the trainer reaches it: the cures preset with every knob changed
    cfg = build_config(
        None,
        [
            "method.name=cures",
            "method.lam_nov=3",
            "method.kappa_clip=0.25",
            "method.n_base=3",
            "method.max_extra_per_prompt=5",
            "method.full_reward=0.9",
            "rollout.icl_min_similarity=0.2",
            "rollout.icl_train_prompt=icl",
            "rollout.stream_quorum=0.75",
            "method.adv_scale=none",
            "method.tree_max_depth=3",
        ],
    )
    p = plan_config(cfg)
    assert (p.allocation, p.lam_nov, p.kappa_clip, p.n_base, p.max_extra_per_prompt, p.full_reward) == (
        "cures",
        3.0,
        0.25,
        3,
        5,
        0.9,
    )
    assert (p.icl_min_similarity, p.icl_train_prompt, p.adv_scale, p.icl) == (0.2, "icl", "none", False)
    assert (p.planner, p.stream_quorum) == ("rounds", 0.75)
    ctx = SourceContext(
        problems=[],
        engine=None,
        verifier=None,
        renderer=None,
        plan=p,
        prompts_per_step=1,
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=4,
        stop=(),
        seed=0,
    )
    tree = TreeSource(ctx, cfg.method).tree
    assert tree.tree_max_depth == 3 and tree.rollouts_per_step == cfg.rollout.rollouts_per_step


def test_help_lists_inherited_knobs_with_their_docstrings():
    text = help_text()
    assert "method.lam_nov = 2.5" in text and "lambda_nov of Eq. (6)" in text
    assert "rollout.icl_train_prompt = 'original'" in text
    assert "method.max_gen_batches = 1" in text


def test_yaml_file_and_precedence(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("steps: 7\nmethod:\n  name: dapo\n  max_gen_batches: 5\noptim:\n  lr: 1.0e-5\n")
    cfg = build_config(str(p), ["optim.lr=3e-5"])
    assert cfg.steps == 7 and cfg.method.name == "dapo" and cfg.method.dynamic_sampling is True
    assert cfg.method.max_gen_batches == 5 and cfg.optim.lr == 3e-5


def test_round_trip():
    cfg = build_config(None, ["method.name=gspo", "eval_k=[1,2]", "data.prompt_template=Q: {prompt}\nA:"])
    assert from_dict(to_dict(cfg)) == cfg
    assert cfg.data.prompt_template == "Q: {prompt}\nA:"


@pytest.mark.parametrize(
    "override, match",
    [
        ("stepz=3", "unknown config key 'stepz'"),
        ("optim.lrr=3", r"optim has fields \[.*'lr'"),
        ("foo.bar=1", "SECTION.FIELD"),
        ("steps=abc", "config field steps expects int"),
        ("method.icl=maybe", "expects true/false"),
        ("method.n_base=1", "method.n_base must be >= 2"),
        ("method.alpha=1.5", r"method.alpha=1.5: alpha is the significance level"),
        # the paper's sensitivity table writes the confidence level as alpha: 0.95 means alpha = 0.05
        ("method.alpha=0.95", r"must lie in \(0, 0.5\).*alpha = 0.95 there is alpha = 0.05 here"),
        ("method.alpha=0.5", r"must lie in \(0, 0.5\)"),
        ("rollout.temperature=0", r"rollout.temperature must be a finite number > 0"),
        ("rollout.temperature=0.7 & optim.old_logprobs=reuse", "optim.old_logprobs must be auto or recompute"),
        ("method.icl_novelty=both", "method.icl_novelty must be one of train, sample or exclude"),
        ("method.lam=true", "config field method.lam expects float, got True"),
        ("eval_k=[1,a]", r"config field eval_k expects list\[int\]"),
        ("method.max_extra_per_prompt=-1", "method.max_extra_per_prompt must be >= 0 or null"),
        ("method.alloc_mode=random", "method.alloc_mode must be one of proportional or greedy"),
        ("method.allocation=cures & method.icl=true", "method.icl must be false with allocation=cures"),
        ("rollout.icl_train_prompt=both", "rollout.icl_train_prompt must be one of original or icl"),
        ("method.sampler=tree", "method.allocation must be uniform with method.sampler=tree"),
        ("rollout.rollouts_per_step=10", "must be >= method.n_base x rollout.prompts_per_step = 64"),
        ("method.name=nope", "unknown"),
        ("eval_k=[1,64]", "every k must be in"),
        ("optim.schedule=linear", "optim.schedule must be constant or cosine"),
        ("data.prompt_template=no placeholder", "must contain {prompt}"),
        ("novalue", "not of the form key=value"),
        ("rollout.planner=stream", "rollout.planner must be one of rounds or streaming"),
        (
            "rollout.planner=streaming",
            r"rollout.planner must be rounds with rollout.engine=hf .*use rollout.engine=vllm",
        ),
        ("data.families=[gcd, fractions]", r"data.families: unknown family 'fractions'; valid families: \["),
        ("data.levels={gcd: [2]}", r"data.levels\['gcd'\]: expected distinct level indices in 0..1, got \[2\]"),
        ("data.families=[gcd] & data.levels={lcm: [0]}", r"data.levels: family 'lcm' is not among the chosen"),
        ("data.train=x.jsonl & data.families=[gcd]", "data.families / data.levels choose the built-in task's"),
        ("rollout.icl_fewshot_position=end", "rollout.icl_fewshot_position must be start or question"),
        ("rollout.stream_quorum=0", "rollout.stream_quorum must be a finite number > 0"),
        ("rollout.stream_quorum=1.5", r"rollout.stream_quorum must be in \(0, 1\]"),
        (
            "rollout.planner=streaming & rollout.engine=vllm & method.name=treepo",
            "rollout.planner must be rounds with method.sampler=tree",
        ),
        # accepted until a config fuzz (every field at edge values, 2 steps each) found them failing inside the run
        # (clip_low, eval_temperature, warmup_steps, n_train, n_heldout, max_prompt_tokens) or read as 0 (the every's)
        ("method.clip_low=1.0", r"method.clip_low must be < 1 \(the ratio is clipped below at 1 - clip_low\)"),
        ("eval_temperature=-0.5", "config field eval_temperature must be a finite number >= 0"),
        ("eval_every=-1", r"config field eval_every must be >= 0 \(0: never\), got -1"),
        ("save_every=-40", "config field save_every must be >= 0"),
        ("log_samples_every=-1", "config field log_samples_every must be >= 0"),
        ("model.warmup_steps=0", "config field model.warmup_steps must be >= 1, got 0"),
        ("data.n_train=0", "config field data.n_train must be >= 1, got 0"),
        ("data.n_heldout=-1", "config field data.n_heldout must be >= 1, got -1"),
        ("data.max_prompt_tokens=0", "config field data.max_prompt_tokens must be >= 1, got 0"),
        ("seed=-1", r"config field seed must be an int in \[0, 2\*\*32\)"),
        ("optim.weight_decay=-0.5", "config field optim.weight_decay must be a finite number >= 0, got -0.5"),
        ("optim.warmup_steps=-1", "config field optim.warmup_steps must be >= 0, got -1"),
        ("optim.grad_clip=-0.5", r"config field optim.grad_clip must be a finite number >= 0 \(0: no clip\), got -0.5"),
        ("optim.grad_clip=inf", r"config field optim.grad_clip must be a finite number >= 0 \(0: no clip\), got inf"),
        ("optim.lr=inf", "config field optim.lr must be a finite number > 0, got inf"),
        ("optim.weight_decay=nan", "config field optim.weight_decay must be a finite number >= 0, got nan"),
        ("model.lora_alpha=inf", "config field model.lora_alpha must be a finite number > 0, got inf"),
        ("time_limit=nan", "config field time_limit must be a finite number > 0 \\(seconds\\) or null, got nan"),
        ("time_limit=-inf", "config field time_limit must be a finite number > 0 \\(seconds\\) or null, got -inf"),
        ("time_limit=0", "config field time_limit must be a finite number > 0 \\(seconds\\) or null, got 0"),
        ("rollout.vllm_kv_cache_gib=inf", "rollout.vllm_kv_cache_gib must be a finite number of GiB > 0 or null"),
        ("method.kappa_clip=inf", "config field method.kappa_clip must be a finite number >= 0, got inf"),
        (
            "rollout.engine=vllm & rollout.temperature=2.5",
            "config field rollout.temperature must be <= 2 with the vllm engine",
        ),
        ("rollout.max_batch_size=0", "config field rollout.max_batch_size must be >= 1, got 0"),
        (
            "method.plan_rounds=0",
            r"config field method.plan_rounds cannot split rollout.rollouts_per_step \(rounds=0 leaves 64 of "
            r"total_budget=128 unallocated after the base phase \(64\)\), got 0",
        ),
    ],
)
def test_bad_values_name_the_field(override, match):
    with pytest.raises(ValueError, match=match):
        build_config(None, override.split(" & "))


def test_alpha_below_one_half_is_accepted_everywhere_it_is_configured():
    from xrpo.rollout.records import PlanConfig

    assert build_config(None, ["method.alpha=0.49"]).method.alpha == 0.49
    assert PlanConfig(alpha=0.1).alpha == 0.1
    with pytest.raises(ValueError, match=r"alpha=0.95: alpha is the significance level"):
        PlanConfig(alpha=0.95)


def test_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_config(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize(
    "text, match",
    [
        ("optim:\n  lr: [1, 2\n", r"cfg\.yaml: not valid YAML \(expected ',' or ']'.* at line 3, column 1\)"),
        ("optim:\n\tlr: 1\n", r"cfg\.yaml: not valid YAML \(found character '\\t'.* at line 2, column 1\)"),
        (b"steps: 1\n# caf\xe9\n", r"cfg\.yaml line 2: not valid UTF-8"),
        ("steps: 1\nsteps: 2\n", r"cfg\.yaml: not valid YAML \(key 'steps' is given twice \(first on line 1\)"),
        ("optim: {lr: 0.1}\noptim: {warmup_steps: 2}\n", r"key 'optim' is given twice .* at line 2, column 1"),
        ("- steps\n", r"cfg\.yaml: expected a mapping at the top level, got list"),
        ("optim: 5\n", r"config section 'optim' must be a mapping of its fields .*got int 5"),
    ],
)
def test_a_config_file_that_cannot_be_read_names_the_file_and_line(tmp_path, text, match):
    path = tmp_path / "cfg.yaml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError, match=match):
        build_config(str(path))


def test_a_config_directory_or_an_empty_section(tmp_path):
    with pytest.raises(ValueError, match=rf"config file {tmp_path} is not a file; expected a YAML file"):
        build_config(str(tmp_path))
    (tmp_path / "cfg.yaml").write_text("steps: 3\noptim:\n#  lr: 0.1\n")  # every field of optim commented out
    assert build_config(str(tmp_path / "cfg.yaml")).optim == TrainConfig().optim


def test_a_runs_saved_config_that_cannot_be_read_names_the_file(tmp_path):
    from xrpo.trainer.config_loader import load_run_config

    path = tmp_path / "config.yaml"
    with pytest.raises(FileNotFoundError, match=r"config\.yaml does not exist: not an xrpo run directory"):
        load_run_config(path)
    for text, match in [
        ("model: [\n", r"config\.yaml: not valid YAML"),
        ("- 1\n", r"config\.yaml: expected a mapping of config sections and fields, got list"),
        ("optim:\n  lr: abc\n", r"config\.yaml: config field optim\.lr expects float, got str 'abc'"),
    ]:
        path.write_text(text)
        with pytest.raises(ValueError, match=match):
            load_run_config(path)
    path.write_text("steps: 3\n")
    assert load_run_config(path).steps == 3


@pytest.mark.parametrize(
    "path",
    sorted(
        p.relative_to(ROOT).as_posix() for p in [*(ROOT / "configs").glob("*.yaml"), *(ROOT / "study").glob("*.yaml")]
    ),
)
def test_every_shipped_config_builds(path):
    """The YAML configs the repository ships (configs/, study/) stay valid as knobs change: each builds and
    validates (a renamed or removed field would fail here, naming it)."""
    loaded = flatten(to_dict(build_config(str(ROOT / path))))
    # every value the file sets, itself or through its base, is the value the run gets (none dropped or renamed on
    # the way); keys as the config loader reads them (section.field)
    values, own = load_config_file(ROOT / path)
    assert own.items() <= values.items()
    for key, value in values.items():
        assert loaded[key] == value, (path, key, loaded[key], value)


def test_a_config_file_builds_on_its_base(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "root.yaml").write_text("steps: 7\nseed: 3\nrollout: {temperature: 0.5, top_p: 0.9}\n")
    (tmp_path / "sub" / "mid.yaml").write_text("base: ../root.yaml\nseed: 4\nrollout: {top_p: 0.8}\n")
    (tmp_path / "leaf.yaml").write_text("base: sub/mid.yaml\nrollout: {max_new_tokens: 9}\n")
    values, own = load_config_file(tmp_path / "leaf.yaml")
    # paths relative to the file naming them; the nearer file wins field by field, sections merge
    assert values == {
        "steps": 7,
        "seed": 4,
        "rollout.temperature": 0.5,
        "rollout.top_p": 0.8,
        "rollout.max_new_tokens": 9,
    }
    assert own == {"rollout.max_new_tokens": 9}
    cfg = build_config(str(tmp_path / "leaf.yaml"), ["seed=5"])
    assert (cfg.steps, cfg.seed, cfg.rollout.temperature, cfg.rollout.top_p, cfg.rollout.max_new_tokens) == (
        7,
        5,
        0.5,
        0.8,
        9,
    )
    (tmp_path / "loop.yaml").write_text("base: loop2.yaml\n")
    (tmp_path / "loop2.yaml").write_text("base: loop.yaml\nsteps: 2\n")
    with pytest.raises(ValueError, match=r"loop.yaml: its base chain loops: .*loop.yaml -> .*loop2.yaml -> .*loop"):
        build_config(str(tmp_path / "loop.yaml"))
    (tmp_path / "gone.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(FileNotFoundError, match=r"nowhere.yaml does not exist \(the base named in .*gone.yaml\)"):
        build_config(str(tmp_path / "gone.yaml"))
    (tmp_path / "bad.yaml").write_text("base: [a.yaml]\n")
    with pytest.raises(ValueError, match=r"bad.yaml: base must be the path of another config file"):
        build_config(str(tmp_path / "bad.yaml"))


def test_icl_fewshot_position_reaches_the_trainers_renderer():
    from xrpo.data import Problem
    from xrpo.icl import Example
    from xrpo.trainer.setup import make_renderer

    class Tok:
        chat_template = None

        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": list(text.encode())}

    over = [
        "data.prompt_template=Q: 1+1\nA: 2\n\nQ: {prompt}\nA:",
        "rollout.icl_fewshot_example=Q: {problem}\nA:{solution}\n",
    ]
    ex = [Example("a", "3+3", " 6", 0.9)]
    p = Problem("q", "5+5", "10")
    near = make_renderer(build_config(None, [*over, "rollout.icl_fewshot_position=question"]), Tok())
    assert near.render_icl(p, ex).text == "Q: 1+1\nA: 2\n\nQ: 3+3\nA: 6\n\nQ: 5+5\nA:"
    start = make_renderer(build_config(None, over), Tok())
    assert start.render_icl(p, ex).text == "Q: 3+3\nA: 6\n\nQ: 1+1\nA: 2\n\nQ: 5+5\nA:"


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["method.max_extra_per_prompt=1"], "caps 16 prompts at 1 rollouts each (16 in all), fewer than 32"),
        (
            ["method.name=knapsack", "method.knapsack_fallback=leftover", "method.max_extra_per_prompt=7"],
            "fewer than 128, the step's budget",
        ),
    ],
)
def test_a_cap_the_step_cannot_hold_is_refused_before_training(overrides, words):
    # without the check the first step failed inside split_budget / knapsack_allocation; the rule is
    # xrpo.algo.rounds.cap_error (tests/algo/test_rounds.py: exactly when planning the step would fail)
    with pytest.raises(ValueError, match="config field method.max_extra_per_prompt") as e:
        build_config(None, overrides)
    assert words in str(e.value)
    build_config(None, [*overrides[:-1], "method.max_extra_per_prompt=8"])


def test_the_knapsack_authors_rule_takes_its_own_cap():
    # Knapsack RL's authors' rule caps a prompt with method.knapsack_max_n (their MAX_N); a round cap would be ignored
    with pytest.raises(ValueError, match="config field method.max_extra_per_prompt must be null with allocation=knap"):
        build_config(None, ["method.name=knapsack", "method.max_extra_per_prompt=8"])
    cfg = build_config(None, ["method.name=knapsack", "method.knapsack_max_n=64"])
    assert (cfg.method.knapsack_fallback, cfg.method.knapsack_max_n, cfg.method.knapsack_window) == ("authors", 64, 16)
