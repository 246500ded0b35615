"""Building what the loop needs from a config: `start_run` sets a run up in one call (its directory, new or resumed,
and every part the loop steps: `RunParts`) from the builders below, which map the `TrainConfig` onto the ones that
take plain arguments (`xrpo.models.loading`, `xrpo.rollout.build`): model and tokenizer, data, rollout engine, ICL
corpus, the planner's config, the learning-rate schedule."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from xrpo.algo.config import (
    AdvantageConfig,
    AllocationConfig,
    ICLConfig,
    ICLPromptConfig,
    SharpenConfig,
    StreamConfig,
    section_values,
)
from xrpo.algo.losses import get_policy_loss
from xrpo.data import Problem, load_problems_with_layout
from xrpo.models import loading
from xrpo.rewards import get_verifier, raise_reference_errors
from xrpo.rollout.build import TRAINING_MODEL_ENGINES, build_renderer
from xrpo.rollout.build import build_engine as build_rollout_engine
from xrpo.rollout.records import PlanConfig
from xrpo.rollout.sources import SourceContext, build_source
from xrpo.rundir.checkpoints import (
    CheckpointError,
    find_resume_checkpoint,
    load_state,
    refuse_existing_run,
    resume_run_dir,
)
from xrpo.rundir.lock import RunLock
from xrpo.trainer.checkpoint import load_training_state
from xrpo.trainer.config import TrainConfig
from xrpo.trainer.config_loader import config_yaml, load_run_config
from xrpo.trainer.logging import RunLogger
from xrpo.trainer.memory import format_estimate
from xrpo.trainer.preflight import check_before_loading
from xrpo.trainer.update import Policy

if TYPE_CHECKING:
    from xrpo.icl import ICLCorpus
    from xrpo.rewards import Verifier
    from xrpo.rollout.engine import RolloutEngine
    from xrpo.rollout.prompts import PromptRenderer
    from xrpo.rollout.sources import BatchSource


def cache_root(cfg: TrainConfig) -> Path:
    return loading.cache_root(cfg.model.cache_dir)


def load_data(cfg: TrainConfig, log=print) -> tuple[list[Problem], list[Problem]]:
    d = cfg.data
    if d.train == "default":
        from xrpo.data.tasks import make_default_task

        train, heldout = make_default_task(
            n_train=d.n_train, n_heldout=d.n_heldout, seed=cfg.seed, families=d.families, levels=d.levels
        )
        if d.heldout:
            heldout = _load(d.heldout, d)[: d.n_heldout]
    else:
        train = _load(d.train, d)
        heldout = _load(d.heldout, d)[: d.n_heldout]
    if not train:
        raise ValueError(f"data.train {d.train!r} has no problems")
    if not heldout:
        raise ValueError(f"data.heldout {d.heldout!r} has no problems")
    log(f"data: {len(train)} training problems, {len(heldout)} held-out problems")
    return train, heldout


def _load(path: str, d) -> list[Problem]:
    problems, _ = load_problems_with_layout(
        path, prompt_key=d.prompt_key, answer_key=d.answer_key, id_key=d.id_key, spelling=_spelling
    )
    return problems


def _spelling(arg: str, value: str | None) -> str:
    """How a loader's error writes its arguments: as the config fields that set them (``data.answer_key=FIELD``);
    the format, which no field sets, as the file it takes."""
    if arg == "fmt":
        return (
            "a file of a known format"
            if value is None
            else ("a datasets directory" if value == "datasets" else f"a .{value} file")
        )
    return f"data.{arg}" if value is None else f"data.{arg}={value}"


def _model_source(cfg: TrainConfig) -> dict:
    """The `model.*` settings that say where the weights come from, as `xrpo.models.loading` takes them."""
    m = cfg.model
    return {"gguf_file": m.gguf_file, "cache_dir": m.cache_dir, "warmup_steps": m.warmup_steps}


def load_model(cfg: TrainConfig, *, path: str | None = None, log=print):
    """Returns (model, tokenizer, initial_model_path) of ``path or cfg.model.path`` (``path``: the KL reference), in
    `param_dtype`, through `xrpo.models.loading.load_model`; ``initial_model_path`` is the resolved directory (or hub
    id) the weights came from. The model to train comes from `load_policy`."""
    return loading.load_model(path or cfg.model.path, dtype=param_dtype(cfg), log=log, **_model_source(cfg))


def _trained_dtype(cfg: TrainConfig) -> str:
    """The dtype of the parameters the optimiser updates: model.master_dtype (None: float32); peft keeps LoRA's
    adapters in float32."""
    return "float32" if cfg.model.lora_rank > 0 else (cfg.model.master_dtype or "float32")


def param_dtype(cfg: TrainConfig) -> str:
    """The dtype the model is loaded in: the trained parameters' (`_trained_dtype`) for full fine-tuning; with LoRA
    the frozen base weights are held in model.dtype (no master copy is needed for weights that never update)."""
    return cfg.model.dtype if cfg.model.lora_rank > 0 else _trained_dtype(cfg)


def autocast_dtype(cfg: TrainConfig) -> str | None:
    """The dtype forward passes run in under `torch.autocast`, or None when the trained parameters already are in
    the compute dtype: bfloat16 compute over float32 master weights (or float32 adapters) is mixed precision."""
    return cfg.model.dtype if _trained_dtype(cfg) != cfg.model.dtype else None


def load_policy(cfg: TrainConfig, *, checkpoint_model: str | None = None, log=print):
    """Returns (model, tokenizer, initial_model_path): the model to train, in `param_dtype`, with the memory
    features of the config applied (LoRA adapters, gradient checkpointing). ``checkpoint_model``: a checkpoint's
    model directory to resume from (full weights, or with LoRA the adapter saved there on top of the base model)."""
    m = cfg.model
    lora_on = m.lora_rank > 0
    # full weights resume from the checkpoint; LoRA starts from the base model and puts the saved adapter on it
    src = checkpoint_model if checkpoint_model is not None and not lora_on else m.path
    model, tokenizer, init_path = loading.load_model(src, dtype=param_dtype(cfg), log=log, **_model_source(cfg))
    if src != m.path:  # the reference and vLLM start from the initial model, also on resume
        init_path = loading.resolve_model_dir(m.path, log=log, **_model_source(cfg))
    if lora_on:
        from xrpo.models import lora

        if checkpoint_model is not None:
            model = lora.load_adapter(model, checkpoint_model, trainable=True)
        else:
            model = lora.apply_lora(
                model,
                rank=m.lora_rank,
                alpha=m.lora_alpha,
                dropout=m.lora_dropout,
                target_modules=m.lora_target_modules,
                base_path=init_path,
            )
    if m.gradient_checkpointing:
        from xrpo.trainer.logprobs import unwrap_causal_lm

        # non-reentrant: no need for inputs that require grad (LoRA's frozen embeddings), and it composes with
        # the chunked log-probs' own checkpoints
        unwrap_causal_lm(model).gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, tokenizer, init_path


def build_engine(cfg: TrainConfig, model, tokenizer):
    """The rollout engine of `rollout.engine` (`xrpo.rollout.build.build_engine`). vLLM loads the resolved model
    directory (never `model.path` as written: "default" or "package:NAME" mean nothing to it) and then gets the
    training model's weights, which on resume are the checkpoint's."""
    r = cfg.rollout
    model_dir = None
    if r.engine == "vllm":
        model_dir = loading.resolve_model_dir(cfg.model.path, log=lambda *_: None, **_model_source(cfg))
    return build_rollout_engine(
        r.engine,
        tokenizer,
        model=model,
        model_dir=model_dir,
        dtype=cfg.model.dtype,
        seed=cfg.seed,
        max_batch_size=r.max_batch_size,
        max_seq_len=cfg.data.max_prompt_tokens + r.max_new_tokens,
        vllm_dtype=r.vllm_dtype,
        gpu_memory_utilization=r.vllm_gpu_memory_utilization,
        kv_cache_gib=r.vllm_kv_cache_gib,
        max_model_len=r.vllm_max_model_len,
        enforce_eager=r.vllm_enforce_eager,
        autocast_dtype=autocast_dtype(cfg),
    )


def new_corpus(cfg: TrainConfig):
    from xrpo.icl import ICLCorpus, get_embedder

    emb, keep = get_embedder(cfg.rollout.embedder), cfg.rollout.corpus_max_per_problem
    if cfg.rollout.icl_corpus:
        return ICLCorpus.from_jsonl(cfg.rollout.icl_corpus, emb, max_per_problem=keep)
    return ICLCorpus(emb, max_per_problem=keep)


def load_corpus(cfg: TrainConfig, path: Path):
    from xrpo.icl import ICLCorpus, get_embedder

    return ICLCorpus.load(path, get_embedder(cfg.rollout.embedder))


def make_renderer(cfg: TrainConfig, tokenizer):
    """The prompt renderer, with the "auto" choices resolved (see DataConfig.prompt_template, RolloutConfig)."""
    template = cfg.data.prompt_template or ("Q: {prompt}\nA:" if cfg.data.train == "default" else "{prompt}")
    return build_renderer(
        tokenizer,
        prompt_template=template,
        icl_style=cfg.rollout.icl_style,
        default_model=cfg.model.path == "default",
        use_chat_template=cfg.model.use_chat_template,
        system_prompt=cfg.model.system_prompt,
        max_prompt_tokens=cfg.data.max_prompt_tokens,
        fewshot_example=cfg.rollout.icl_fewshot_example,
        fewshot_position=cfg.rollout.icl_fewshot_position,
    )


def check_prompt_lengths(cfg: TrainConfig, tokenizer, renderer, problems: list[Problem]) -> int:
    """Every prompt, as the engine will receive it, fits ``data.max_prompt_tokens``; the error names the problem.
    Returns the longest prompt's token count."""
    encoded = tokenizer([renderer.render(p) for p in problems], add_special_tokens=False)["input_ids"]
    for p, ids in zip(problems, encoded):
        if len(ids) > cfg.data.max_prompt_tokens:
            raise ValueError(
                f"problem {p.id}: prompt has {len(ids)} tokens, more than data.max_prompt_tokens="
                f"{cfg.data.max_prompt_tokens}"
            )
    return max((len(ids) for ids in encoded), default=0)


def lr_scheduler(optimizer, o, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up over ``o.warmup_steps``, then constant or (``o.schedule == "cosine"``) cosine decay to 0 at
    ``steps``."""

    def lr_lambda(step: int) -> float:
        if step < o.warmup_steps:
            return (step + 1) / o.warmup_steps
        if o.schedule == "cosine":
            frac = (step - o.warmup_steps) / max(1, steps - o.warmup_steps)
            return 0.5 * (1 + math.cos(math.pi * min(frac, 1.0)))
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


def memory_estimate(cfg: TrainConfig, model, longest_prompt: int | None = None):
    """(`xrpo.trainer.memory.MemoryEstimate`, device capacity in bytes or None) of this config with this model.
    ``longest_prompt``: the longest training prompt in tokens (`check_prompt_lengths`; None: data.max_prompt_tokens).
    """
    from xrpo.trainer import memory

    r, o, m = cfg.rollout, cfg.optim, cfg.method
    device = next(model.parameters()).device
    capacity = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    shape = memory.model_shape(model)
    vllm = 0
    if r.engine == "vllm":
        if capacity is not None:
            vllm = int(r.vllm_gpu_memory_utilization * capacity)
        else:
            vllm = int(r.vllm_kv_cache_gib * memory.GIB) + shape.n_params * memory.DTYPE_BYTES[cfg.model.dtype]
    # the largest micro-batch: completions max_new_tokens long after the longest prompt (ICL prompts, trained on with
    # icl_train_prompt=icl, fill up to max_prompt_tokens), as many rows as the budget and a mini-batch hold
    icl_prompts = m.icl and r.icl_train_prompt == "icl"
    prompt = cfg.data.max_prompt_tokens if longest_prompt is None or icl_prompts else longest_prompt
    rows = math.ceil(r.rollouts_per_step / o.mini_batches)
    tokens, completion = memory.largest_micro_batch(o.micro_batch_tokens, rows, prompt, r.max_new_tokens)
    est = memory.estimate_memory(
        shape,
        dtype=cfg.model.dtype,
        param_dtype=param_dtype(cfg),
        lora=cfg.model.lora_rank > 0,
        kl=cfg.method.kl_coef > 0,
        micro_batch_tokens=tokens,
        completion_tokens=completion,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        logprob_chunk_tokens=o.logprob_chunk_tokens,
        vllm_bytes=vllm,
    )
    return est, capacity


def open_run(
    cfg: TrainConfig, resume: str | None, held: ExitStack, *, log=print
) -> tuple[TrainConfig, Path, Path | None, dict]:
    """The run directory, held by this process (its lock entered in ``held``): a new run's (``cfg`` validated and
    checked before anything is loaded, the directory refused if it holds another run's checkpoints, config.yaml
    written) or, with ``resume``, the one of that run or checkpoint directory. Returns (the run's config, its
    directory, the checkpoint resumed from or None, that checkpoint's state.json or {})."""
    state: dict = {}
    ckpt_path = None
    if resume:
        output = resume_run_dir(resume)
        lock = held.enter_context(RunLock(output, "xrpo train --resume", log=log))  # a live run: refused first
        ckpt_path = find_resume_checkpoint(resume)
        state = load_state(ckpt_path)
        cfg = load_run_config(output / "config.yaml")
        check_before_loading(cfg)
        log(f"resuming {output} from {ckpt_path.name}")
    else:
        cfg.validate()
        check_before_loading(cfg)  # every check that needs no model or data: a bad config fails in a second
        output = Path(cfg.output or Path("runs") / datetime.now().strftime("%Y%m%d-%H%M%S"))
        lock = held.enter_context(RunLock(output, "xrpo train", log=log))  # a live run there: refused, untouched
        refuse_existing_run(output)
        cfg.output = str(output)
        (output / "config.yaml").write_text(config_yaml(cfg))
    lock.claim()
    return cfg, output, ckpt_path, state


@dataclass
class RunParts:
    """A run as `start_run` sets it up: what the loop steps, validates with and checkpoints."""

    cfg: TrainConfig
    """The run's config (on resume, its saved config.yaml)."""
    output: Path
    """The run directory, held by this process (its lock) until the run ends."""
    logger: RunLogger
    """The run's records and trackers."""
    heldout: list[Problem]
    """The held-out problems validation samples."""
    verifier: Verifier
    """Scores rollouts and validation samples."""
    model: torch.nn.Module
    """The policy being trained (with LoRA: the adapted model)."""
    tokenizer: object
    renderer: PromptRenderer
    corpus: ICLCorpus | None
    """The ICL corpus (None without ICL); on resume, the checkpoint's."""
    engine: RolloutEngine
    plan: PlanConfig
    """The planner's config (`plan_config`)."""
    source: BatchSource
    """The method's batch source (`xrpo.rollout.sources.build_source`); on resume, restored from the checkpoint."""
    policy: Policy
    """What the update trains: the model, its optimiser, the policy loss, the KL reference."""
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    state: dict
    """The checkpoint's state.json on resume, else empty; the loop adds the validation before training to it."""
    start_step: int
    """The last step done: 0 for a new run, the checkpoint's step on resume."""
    history: list[dict]
    """The validations so far (the checkpoint's ``eval_history`` on resume); the loop appends to it."""
    t_start: float
    """`time.perf_counter()` when the setup began (``time_limit`` counts from it)."""


def start_run(
    cfg: TrainConfig,
    resume: str | None,
    held: ExitStack,
    *,
    log=print,
    plots: Callable[[Path], dict[str, Path]] | None = None,
    engine_factory: Callable[..., RolloutEngine] = build_engine,
) -> RunParts:
    """Set up a run: its directory (`open_run`: a new run from ``cfg``, or with ``resume`` (a run or checkpoint
    directory) the run saved there); then, in this order, the logger, the random seeds, the data and its verifier,
    the model (and the frozen KL reference), the renderer, the ICL corpus, the rollout engine
    (``engine_factory(cfg, model, tokenizer)``), the batch source, the optimiser and its schedule, and on resume
    their state from the checkpoint. The lock and the logger are entered in ``held``, which gives them back however
    the run ends."""
    t_start = time.perf_counter()
    cfg, output, ckpt_path, state = open_run(cfg, resume, held, log=log)
    # on resume the records are first brought back to the checkpoint's step (the killed run may have logged later
    # ones); the trackers' runs start (or continue) here, before anything is loaded: one that cannot start fails now
    logger = held.enter_context(
        RunLogger(
            output, cfg, resume_state=state if ckpt_path is not None else None, t_start=t_start, log=log, plots=plots
        )
    )
    m, r, o = cfg.method, cfg.rollout, cfg.optim
    threads = cfg.threads or (1 if cfg.model.path == "default" else None)
    if threads:
        torch.set_num_threads(threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    train_problems, heldout = load_data(cfg, log=log)
    # a reference the verifier cannot grade would score every rollout 0: refused before the model is loaded
    verifier = get_verifier(cfg.data.verifier, **cfg.data.verifier_args)
    raise_reference_errors(verifier, train_problems, f"data.train ({cfg.data.train})")
    raise_reference_errors(verifier, heldout, f"data.heldout ({cfg.data.heldout})")
    model, tokenizer, init_path = load_policy(
        cfg, checkpoint_model=str(ckpt_path / "model") if ckpt_path is not None else None, log=log
    )
    ref_model = None
    if m.kl_coef > 0 and cfg.model.lora_rank == 0:
        # the reference is the initial policy, also on resume (with LoRA: the policy with its adapters disabled)
        ref_model, _, _ = load_model(cfg, path=init_path, log=lambda *_: None)
        ref_model.eval().requires_grad_(False)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    renderer = make_renderer(cfg, tokenizer)
    longest_prompt = check_prompt_lengths(cfg, tokenizer, renderer, train_problems)
    check_prompt_lengths(cfg, tokenizer, renderer, heldout)
    corpus = None
    if m.icl:
        corpus = load_corpus(cfg, ckpt_path / "corpus") if ckpt_path is not None else new_corpus(cfg)
    engine = engine_factory(cfg, model, tokenizer)
    pcfg = plan_config(cfg)
    source = build_source(
        SourceContext(
            problems=train_problems,
            engine=engine,
            verifier=verifier,
            renderer=renderer,
            plan=pcfg,
            prompts_per_step=r.prompts_per_step,
            temperature=r.temperature,
            top_p=r.top_p,
            max_new_tokens=r.max_new_tokens,
            stop=tuple(r.stop),
            seed=cfg.seed,
            corpus=corpus,
        ),
        m,
    )
    # the hf and hf-cb engines sample with the training model itself, so their temperature-1 log-probs are the old
    # log-probs at temperature 1; at any other temperature they are not the sampling distribution's (validate refuses
    # "reuse" there). bfloat16 compute: a KV-cached decode and a full forward differ by bfloat16 rounding (up to ~0.1
    # per log-prob on a GPU, docs/benchmarks.md "## GPU"), so "auto" recomputes there
    auto_reuse = r.engine in TRAINING_MODEL_ENGINES and cfg.model.dtype == "float32"
    reuse_lp = (o.old_logprobs == "reuse" or (o.old_logprobs == "auto" and auto_reuse)) and r.temperature == 1.0
    trained = [p for p in model.parameters() if p.requires_grad]  # all of them, or LoRA's adapters
    optimizer = torch.optim.AdamW(trained, lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay)
    compute_dtype = autocast_dtype(cfg)
    policy = Policy(
        model=model,
        optimizer=optimizer,
        loss_fn=get_policy_loss(m.policy_loss),
        pad_id=pad_id,
        ref_model=ref_model,
        reuse_logprobs=reuse_lp,
        reference_is_base=m.kl_coef > 0 and cfg.model.lora_rank > 0,
        autocast_dtype=getattr(torch, compute_dtype) if compute_dtype else None,
        logprob_chunk_tokens=o.logprob_chunk_tokens,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
    )
    est, capacity = memory_estimate(cfg, model, longest_prompt)
    log(format_estimate(est, device_bytes=capacity))
    scheduler = lr_scheduler(optimizer, o, cfg.steps)
    start_step = 0
    history: list[dict] = []
    if ckpt_path is not None:
        load_training_state(ckpt_path, optimizer, scheduler)
        try:
            source.load_state_dict(state)
        except (KeyError, ValueError) as e:
            raise CheckpointError(
                f"checkpoint {ckpt_path} does not hold this method's batch source state: {e}"
            ) from None
        start_step = state["step"]
        history = state.get("eval_history", [])
    return RunParts(
        cfg=cfg,
        output=output,
        logger=logger,
        heldout=heldout,
        verifier=verifier,
        model=model,
        tokenizer=tokenizer,
        renderer=renderer,
        corpus=corpus,
        engine=engine,
        plan=pcfg,
        source=source,
        policy=policy,
        optimizer=optimizer,
        scheduler=scheduler,
        state=state,
        start_step=start_step,
        history=history,
        t_start=t_start,
    )


def plan_config(cfg: TrainConfig) -> PlanConfig:
    """The planner's config: the method and rollout sections it embeds, and the step's budget."""
    return PlanConfig(
        rollouts_per_step=cfg.rollout.rollouts_per_step,
        **section_values(cfg.method, AdvantageConfig, AllocationConfig, ICLConfig, SharpenConfig),
        **section_values(cfg.rollout, ICLPromptConfig, StreamConfig),
    )
