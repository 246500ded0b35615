"""The single-machine XRPO / GRPO / DAPO / GSPO / TreePO / CurES training loop. Reads top to bottom:

    setup       one call, `xrpo.trainer.setup.start_run`: config -> output dir, data, verifier, model + tokenizer
                (+ frozen reference when kl_coef > 0), ICL corpus, rollout engine, the method's batch source,
                optimizer; or all of it restored from a checkpoint (--resume). It returns the run's parts
                (`RunParts`)
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
A step runs more files than these (the floors below the rollouts: data, icl, rewards, sandbox; the engine; the
logger), which the dependency rule (CONTRIBUTING.md) keeps apart rather than merged into the listed ones.

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
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import torch

from xrpo.rollout.corpus import update_corpus
from xrpo.rollout.engine import RolloutEngine, SamplingParams
from xrpo.rollout.records import PlanResult
from xrpo.rollout.sources import batch_advantages
from xrpo.rollout.validate import sample_and_score
from xrpo.rundir.checkpoints import checkpoint_dir, list_checkpoints, update_state
from xrpo.rundir.files import write_atomic
from xrpo.trainer.checkpoint import save_checkpoint
from xrpo.trainer.config import TrainConfig
from xrpo.trainer.logging import MechanismTotals
from xrpo.trainer.preempt import StopSignals, TrainingStopped
from xrpo.trainer.setup import build_engine, start_run
from xrpo.trainer.update import NonFiniteLossError, UpdateBatch, old_logprobs, policy_update, sample_logprobs
from xrpo.trainer.zero_signal import NoLearningSignal, ZeroSignalWatch

__all__ = ["NoLearningSignal", "NonFiniteLossError", "StepReport", "TrainingStopped", "train"]


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
    run = start_run(cfg, resume, held, log=log, plots=plots, engine_factory=engine_factory)
    cfg, output, logger, source, engine = run.cfg, run.output, run.logger, run.source, run.engine
    model, tokenizer, optimizer, scheduler, policy = run.model, run.tokenizer, run.optimizer, run.scheduler, run.policy
    heldout, verifier, renderer, corpus, pcfg = run.heldout, run.verifier, run.renderer, run.corpus, run.plan
    state, history, start_step, t_start = run.state, run.history, run.start_step, run.t_start
    m, r = cfg.method, cfg.rollout

    eval_sampling = SamplingParams(
        temperature=cfg.eval_temperature,
        top_p=1.0,
        max_new_tokens=r.max_new_tokens,
        stop=tuple(r.stop),
        seed=cfg.seed + 7,
    )

    def validate(step: int) -> dict:
        t0 = time.perf_counter()
        vm, per_problem = sample_and_score(
            heldout,
            engine,
            verifier,
            renderer,
            n=cfg.eval_samples,
            sampling=eval_sampling,
            ks=cfg.eval_k,
            keep_text=cfg.save_eval_completions,
            progress=logger.validation_progress(step),
        )
        vm["time/validate"] = time.perf_counter() - t0
        if cfg.save_eval_completions:
            logger.log_eval_completions(step, per_problem)
        history.append({"step": step, **vm})
        return vm

    def save(step: int) -> None:
        st = {
            **source.state_dict(),
            "before": state.get("before", {}),
            "eval_history": history,
            "totals": totals.state(),
            "steps_without_signal": watch.count,
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
    watch = ZeroSignalWatch(cfg, state.get("steps_without_signal", 0), log=logger.note)
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
            # the next step samples from the updated policy: a no-op for the hf and hf-cb engines (they hold this
            # very model), a weight load for vLLM
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
        if logger.samples_due(step):
            logger.log_samples(step, problems, records)
        watch.observe(step, metrics, records)  # says once that a step had no signal; stops after several in a row
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
