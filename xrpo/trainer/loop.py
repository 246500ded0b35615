"""The single-machine XRPO / GRPO / DAPO / GSPO / TreePO / CurES training loop. Reads top to bottom:

    setup       config -> output dir, model + tokenizer (+ frozen reference when kl_coef > 0), data, verifier,
                ICL corpus, rollout engine, the method's batch source, optimizer; or all of it restored from a
                checkpoint (--resume)
    each step   1. rollouts   the batch source (xrpo.rollout.sources): XRPO's planner (Algorithm 1: base rollouts,
                              planning rounds, ICL seeding, verification), TreePO's tree sampler, CurES's posterior
                              draw; DAPO's dynamic sampling wraps the first two with its refill
                2. old log-probs recomputed by the training model under each rollout's training prompt
                3. advantages GRPO by group id + novelty sharpening (Eq. 6) scored on those log-probs;
                              or TreePO's tree advantage (method.tree_advantage)
                4. update     policy loss from the registry (+ beta * KL to the reference), micro-batches by token
                              budget with gradient accumulation, ppo_epochs x mini_batches optimizer steps
                5. corpus     correct rollouts join the ICL corpus (Algorithm 1 line 15)
                6. log / validate / checkpoint
    end         final validation, summary.json; or, after SIGTERM / SIGINT (xrpo.trainer.preempt), a checkpoint of the
                step just done and `TrainingStopped`, whose message names ``xrpo train --resume DIR``

One step, file by file, in the order it runs (XRPO's default job). Counting rule of this reading path: a file is
listed when a reader must open it to follow the step from this file down; not listed are what a listed file calls by
a name that says what it gives back: an equation of xrpo/algo (named beside its caller), a record type
(xrpo/rollout/records.py), the engine protocol (xrpo/rollout/engine.py), the verifier (xrpo/rewards), the ICL
corpus (xrpo/icl) and the run's logger (trainer/logging.py, trackers.py, records.py). 8 files:
    1. xrpo/trainer/loop.py           this file: the step's sections below
    2. xrpo/rollout/sources.py        the batch source: the step's prompts (epoch order), DAPO's refill, CurES
    3. xrpo/rollout/planner.py        Algorithm 1 lines 1-13: one batch, rounds or streaming waves, chosen there
    4. xrpo/rollout/step.py           a step's rollouts as they arrive: records, verification, ICL retrieval, metrics
    5. xrpo/algo/rounds.py            a round's decisions: the registered allocator (HRP: xrpo/algo/allocation.py),
                                      which prompts are ICL-seeded
    6. xrpo/trainer/update.py         old log-probs under the training prompts; the policy update
                                      (xrpo/algo/losses.py)
    7. xrpo/rollout/advantages.py     Algorithm 1 line 14: group advantages, novelty sharpening
                                      (xrpo/algo/advantages.py)
    8. xrpo/rollout/corpus.py         Algorithm 1 line 15: correct rollouts join the ICL corpus
Counted mechanically instead (every xrpo file with a Python function entered in the training process between the
end of step 1 and the end of step 2 of the default job, `sys.setprofile` from ``on_step``, plus this file), one step
runs 28 files: these 8, 3 more of xrpo/algo (advantages, allocation, losses), the floors below rollout (data/
problem; icl/ corpus, embedders, index; rewards/ registry, math, extract; sandbox/pool), rollout/ engine, hf_engine,
prompts, records, and trainer/ logging, trackers, records, logprobs, setup. The floors stay apart by the dependency
rule (CONTRIBUTING.md), so that count is not brought to 8 by merging files. (#30's last note counted 26 by a rule
it did not record; this rule gives 28 both before and after #30 part C.)

One process writes a run directory at a time: it holds the directory's lock (xrpo.rundir.lock) from setup to end.

Steps 2 and 4 live in `xrpo.trainer.update`; docs/methods.md ("The policy update") explains why the old log-probs, the
policy forward, the reference log-probs and s(y) are all taken under the training prompt at the sampling temperature
(as verl does), and why the model stays in eval mode (no dropout: the first mini-batch's ratio is exactly 1).

Deviations from the paper (see also the planner's docstring):
    - the loss of each step is normalised over the step's whole mini-batch (global token / sequence counts), so
      gradient accumulation over micro-batches gives exactly the full-batch gradient.
    - the default learning rate is 1e-4, not the paper's 2e-6: the built-in model has 1.1M parameters.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
import yaml

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
from xrpo.rewards import get_verifier, raise_reference_errors
from xrpo.rollout.corpus import update_corpus
from xrpo.rollout.engine import RolloutEngine, SamplingParams
from xrpo.rollout.records import PlanConfig, PlanResult
from xrpo.rollout.sources import SourceContext, batch_advantages, build_source
from xrpo.rollout.validate import sample_and_score
from xrpo.rundir.checkpoints import (
    CheckpointError,
    checkpoint_dir,
    find_resume_checkpoint,
    list_checkpoints,
    load_state,
    refuse_existing_run,
    update_state,
)
from xrpo.rundir.files import write_atomic
from xrpo.rundir.lock import RunLock
from xrpo.trainer.checkpoint import load_training_state, save_checkpoint
from xrpo.trainer.config import TrainConfig
from xrpo.trainer.config_loader import load_run_config, to_dict
from xrpo.trainer.logging import MechanismTotals, RunLogger
from xrpo.trainer.memory import format_estimate
from xrpo.trainer.preempt import StopSignals, TrainingStopped
from xrpo.trainer.preflight import check_before_loading
from xrpo.trainer.setup import (
    autocast_dtype,
    build_engine,
    check_prompt_lengths,
    load_corpus,
    load_data,
    load_model,
    load_policy,
    lr_scheduler,
    make_renderer,
    memory_estimate,
    new_corpus,
)
from xrpo.trainer.update import NonFiniteLossError, Policy, UpdateBatch, old_logprobs, policy_update, sample_logprobs

__all__ = ["NonFiniteLossError", "StepReport", "TrainingStopped", "plan_config", "train"]


@dataclass
class StepReport:
    """What one training step did, handed to ``train(on_step=...)`` after the step is logged. The objects are the
    loop's own (the corpus keeps changing in later steps): read them, copy what you keep."""

    step: int
    problems: list
    """The step's prompts; ``plan.records[i].problem_index`` indexes this list."""
    plan: PlanResult
    """Rollouts (records with prompts, completions, rewards, rounds, ICL seeding), group ids, the advantages the loss
    was given (``plan.advantages``; None for a step without rollouts) and the per-round allocations."""
    old_logprobs: list
    """Per rollout, the old log-probs of the PPO ratio (under the prompt it is trained under, at the sampling
    temperature)."""
    metrics: dict
    """The row written to metrics.jsonl for this step."""
    corpus: object | None
    """The ICL corpus after this step's update (None without ICL)."""


def plan_config(cfg: TrainConfig) -> PlanConfig:
    """The planner's config: the method and rollout sections it embeds, and the step's budget."""
    return PlanConfig(
        rollouts_per_step=cfg.rollout.rollouts_per_step,
        **section_values(cfg.method, AdvantageConfig, AllocationConfig, ICLConfig, SharpenConfig),
        **section_values(cfg.rollout, ICLPromptConfig, StreamConfig),
    )


def train(
    cfg: TrainConfig,
    *,
    resume: str | None = None,
    log=print,
    on_step: Callable[[StepReport], None] | None = None,
    plots: Callable[[Path], dict[str, Path]] | None = None,
    engine_factory: Callable[..., RolloutEngine] | None = None,
) -> dict:
    """Run the configured training (or resume one) and return the summary (also in summary.json). ``on_step`` is
    called after every step with a `StepReport` (for tests, custom logging or early stopping by raising). ``plots``
    makes the report's PNGs from the run directory at the end, for the trackers of ``report_to`` (`xrpo train`
    passes `xrpo report`'s). ``engine_factory(cfg, model, tokenizer)`` builds the rollout engine in place of
    `xrpo.trainer.setup.build_engine` (e.g. a benchmark wrapping it to count engine steps). After SIGTERM / SIGINT it
    checkpoints the step under way once it ends and raises `TrainingStopped`."""
    # what the run holds (its directory's lock, the signal handlers, the trackers' runs) is given back however it ends
    with ExitStack() as held:
        return _train(cfg, resume, log, on_step, plots, held, engine_factory or build_engine)


def _train(cfg: TrainConfig, resume: str | None, log, on_step, plots, held: ExitStack, engine_factory) -> dict:
    # ================================================================ setup
    t_start = time.perf_counter()
    state: dict = {}
    ckpt_path = None
    if resume:
        ckpt_path = find_resume_checkpoint(resume)
        output = ckpt_path.parent.parent
        lock = held.enter_context(RunLock(output, "xrpo train --resume", log=log))
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
        (output / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    lock.claim()
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
    check_prompt_lengths(cfg, tokenizer, renderer, train_problems + heldout)
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
    # the hf engine samples with the training model itself, so its temperature-1 log-probs are the old log-probs at
    # temperature 1; at any other temperature they are not the sampling distribution's (validate refuses "reuse" there).
    # bfloat16 compute: a KV-cached decode and a full forward differ by bfloat16 rounding (up to ~0.1 per log-prob on
    # a GPU, docs/benchmarks.md "## GPU"), so "auto" recomputes there
    auto_reuse = r.engine == "hf" and cfg.model.dtype == "float32"
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
    est, capacity = memory_estimate(cfg, model)
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

    eval_sampling = SamplingParams(
        temperature=cfg.eval_temperature,
        top_p=1.0,
        max_new_tokens=r.max_new_tokens,
        stop=tuple(r.stop),
        seed=cfg.seed + 7,
    )

    def validate(step: int) -> dict:
        t0 = time.perf_counter()
        vm, _ = sample_and_score(
            heldout, engine, verifier, renderer, n=cfg.eval_samples, sampling=eval_sampling, ks=cfg.eval_k
        )
        vm["time/validate"] = time.perf_counter() - t0
        history.append({"step": step, **vm})
        return vm

    def save(step: int) -> None:
        st = {
            **source.state_dict(),
            "before": state.get("before", {}),
            "eval_history": history,
            "totals": totals.state(),
            **logger.checkpoint_state(step),
        }
        save_checkpoint(
            output,
            step,
            model=model,
            tokenizer=tokenizer,
            optimizer=optimizer,
            scheduler=scheduler,
            state=st,
            corpus=corpus,
            keep_last=cfg.keep_last,
        )

    if start_step == 0:
        before = validate(0)
        state["before"] = before
        logger.log_eval(0, before)
        source.warmup(log)  # CurES's precompute stage; nothing for the other sources
    before = state.get("before", {})

    # ================================================================ training steps
    stop = held.enter_context(StopSignals())  # SIGTERM / SIGINT from here on: this step ends, is checkpointed
    step = start_step
    totals = MechanismTotals(state.get("totals", {}))
    for step in range(start_step + 1, cfg.steps + 1):
        if cfg.time_limit is not None and time.perf_counter() - t_start > cfg.time_limit:
            log(f"time limit of {cfg.time_limit:.0f}s reached after step {step - 1}")
            step -= 1
            break
        t_step = time.perf_counter()
        model.eval()
        # -------- 1. rollouts (Algorithm 1 lines 1-13, or the method's own batch source)
        batch = source.next_batch(step)
        problems, plan = batch.problems, batch.plan
        records = plan.records
        metrics = dict(plan.metrics)

        if records:
            # -------- 2. old log-probs under the training prompts
            t0 = time.perf_counter()
            old_lp, ref_lp, metrics["loss/recomputed_old_logprobs"] = old_logprobs(policy, records, cfg, step)
            metrics["time/old_logprobs"] = time.perf_counter() - t0

            # -------- 3. advantages (Algorithm 1 line 14)
            sample_lp = sample_logprobs(policy, records, cfg)
            advantages, adv_metrics = batch_advantages(batch, pcfg, token_logprobs=old_lp, sample_logprobs=sample_lp)
            metrics.update(adv_metrics)
            plan.advantages = advantages  # kept with the step's rollouts for StepReport: what the loss was given

            # -------- 4. policy update
            t0 = time.perf_counter()
            # the model stays in eval mode (module docstring: dropout would break the ratio of the first mini-batch)
            adv = torch.tensor(advantages, dtype=torch.float32)
            metrics.update(policy_update(policy, UpdateBatch(records, adv, old_lp, ref_lp), cfg, step))
            scheduler.step()
            metrics["time/update"] = time.perf_counter() - t0
            # the next step samples from the updated policy: a no-op for the hf engine (it holds this very model),
            # a weight load for vLLM
            engine.sync_weights(model)
        else:
            metrics["loss/skipped_empty_batch"] = 1.0

        # -------- 5. corpus update (Algorithm 1 line 15)
        if corpus is not None:
            metrics.update(update_corpus(plan, problems, corpus, pcfg, step))
            metrics["icl/corpus_problems"] = float(len(corpus))
            metrics["icl/corpus_solutions"] = float(corpus.num_solutions)

        # -------- 6. log / validate / checkpoint
        metrics["optim/lr"] = scheduler.get_last_lr()[0]
        metrics["time/step"] = time.perf_counter() - t_step
        logger.log_step(step, metrics)
        logger.log_rounds(step, plan.rounds)
        if on_step is not None:
            on_step(StepReport(step, problems, plan, old_lp if records else [], metrics, corpus))
        totals.add(metrics)
        if cfg.log_samples_every and step % cfg.log_samples_every == 0:
            logger.log_samples(step, problems, records)
        if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
            logger.log_eval(step, validate(step))
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps:
            save(step)
        if stop.signum is not None and step < cfg.steps:
            # -------- preempted (SIGTERM / SIGINT): this step is done; its checkpoint lets the next segment go on
            if list_checkpoints(output)[-1:] != [checkpoint_dir(output, step)]:
                save(step)
            logger.close_segment(step)
            raise TrainingStopped(
                f"stopped by {stop.name} after step {step} of {cfg.steps}; checkpoint "
                f"{checkpoint_dir(output, step)}. Continue with: xrpo train --resume {output}",
                signum=stop.signum,
                step=step,
                checkpoint=str(checkpoint_dir(output, step)),
            )

    # ================================================================ end
    model.eval()
    final_step = step
    if history and history[-1]["step"] == final_step:
        # this model is validated already (stopped by time_limit after an eval_every step, or a finished run resumed)
        after = {k: v for k, v in history[-1].items() if k != "step"}
    else:
        after = validate(final_step)
        logger.log_eval(final_step, after)
    if not list_checkpoints(output) or list_checkpoints(output)[-1].name != f"step-{final_step:08d}":
        save(final_step)
    else:
        # the final checkpoint was written before the final validation: it learns it (a resumed run then keeps its
        # row) and this segment's end, after the row is logged (a kill in between: the row is set aside, redone)
        update_state(list_checkpoints(output)[-1], eval_history=history, **logger.checkpoint_state(final_step))
    key = "eval/pass@1"
    summary = {
        "method": m.name,
        "steps": final_step,
        "heldout_problems": len(heldout),
        "heldout_samples_per_problem": cfg.eval_samples,
        "heldout_before": before,
        "heldout_after": after,
        "pass@1_before": before.get(key),
        "pass@1_after": after.get(key),
        "eval_history": history,
        "xrpo": totals.summary(),
        **source.summary(),  # CurES: its warm-up and how much of the training set its posterior saw
        **logger.run_totals(final_step),  # wall time, rollouts, tokens over every segment of a resumed run
        "output": str(output),
        "final_checkpoint": str(list_checkpoints(output)[-1]),
    }
    write_atomic(output / "summary.json", json.dumps(summary, indent=1))
    logger.close(summary)
    return summary
