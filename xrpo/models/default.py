"""The built-in default model: a ~1.1M-parameter Qwen2 with a tokenizer built for the default task, warm-started
briefly by supervised learning, cached on disk, and loaded afterwards through the same `from_pretrained` code path as
any real model.

Warm-start data (why it looks like this):
    - problems of the default task's families and levels, drawn with their own seed, with every held-out question
      of the default run (seed 0) removed, so held-out accuracy measures generalisation;
    - a quarter of the sequences are 2-shot: two solved problems of the same family, then the target, in the same
      "Q: ...\\nA: \\boxed{...}" format. A model that was never shown a few-shot sequence cannot read an ICL prompt
      (instruction-tuned models learnt this in pre-training); these teach the format, not the answers, since the
      examples are other problems. The loss covers every answer span, never the questions.
    - a fixed number of steps rather than a time budget, so the cached model is the same on every machine.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from xrpo.models.cache import build_once

CACHE_VERSION = "tiny-qwen2-v1"
WARMUP_SEED = 1234
WARMUP_PROBLEMS = 12000
FEWSHOT_FRACTION = 0.25


def default_model_dir(root: Path) -> Path:
    return Path(root) / CACHE_VERSION


@dataclass(frozen=True)
class WarmupTask:
    """Which problems of the built-in task the warm-start learns from (the default: the default task's families).

    Attributes:
        families, levels: as `xrpo.data.tasks.make_default_task` takes them (None: the default task's).
        problems: training problems drawn (with ``WARMUP_SEED``) before the held-out ones are removed.
        heldout, heldout_seeds: the held-out splits (``heldout`` problems, drawn with each seed, same families and
            levels) whose questions are removed, so that validation of runs with those seeds measures unseen
            questions.
    """

    families: tuple[str, ...] | None = None
    levels: Mapping[str, Sequence[int]] | None = None
    problems: int = WARMUP_PROBLEMS
    heldout: int = 200
    heldout_seeds: tuple[int, ...] = (0,)

    def as_dict(self) -> dict:
        return {
            "families": list(self.families) if self.families else None,
            "levels": {k: list(v) for k, v in self.levels.items()} if self.levels else None,
            "problems": self.problems,
            "heldout": self.heldout,
            "heldout_seeds": list(self.heldout_seeds),
        }


def ensure_default_model(root: Path, *, warmup_steps: int = 300, log=print) -> Path:
    """Return the cached default model directory, building it first if needed (once, however many processes ask at
    the same time: `xrpo.models.cache.build_once`)."""
    final = default_model_dir(root) / f"warmup-{warmup_steps}"
    return build_model_dir(final, warmup_steps=warmup_steps, log=log, rebuild=False)


def build_model_dir(
    final: Path, *, warmup_steps: int, task: WarmupTask | None = None, log=print, rebuild: bool = True
) -> Path:
    """Build the tiny model warm-started on ``task`` into the directory ``final`` (a temporary directory renamed
    into place, so a killed build leaves no half-written model); a model directory any `model.path` can name.
    ``rebuild=False``: keep ``final`` if it is complete when this process's turn to build comes."""

    def build(tmp: Path) -> None:
        log(f"building the default model (once; cached in {final}) ...")
        t0 = time.perf_counter()
        model, tokenizer, stats = build_default_model(warmup_steps=warmup_steps, task=task, log=log)
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        stats["build_seconds"] = time.perf_counter() - t0
        (tmp / "warmup.json").write_text(json.dumps(stats, indent=1))
        log(f"model ready in {stats['build_seconds']:.0f}s (warm-start loss {stats['final_loss']:.3f})")

    return build_once(Path(final), build, rebuild=rebuild)


def _warmup_examples(task: WarmupTask) -> list[list[tuple[str, str]]]:
    """Sequences of (prompt, answer) segments: single problems and 2-shot groups of the same family."""
    from xrpo.data.tasks import format_prompt, make_default_task

    banned: set[str] = set()
    for seed in task.heldout_seeds:
        _, heldout = make_default_task(
            n_train=0, n_heldout=task.heldout, seed=seed, families=task.families, levels=task.levels
        )
        banned |= {p.text for p in heldout}
    pool, _ = make_default_task(
        n_train=task.problems, n_heldout=0, seed=WARMUP_SEED, families=task.families, levels=task.levels
    )
    pool = [p for p in pool if p.text not in banned]
    rng = random.Random(WARMUP_SEED)
    by_family: dict[str, list] = {}
    for p in pool:
        by_family.setdefault(p.metadata.get("family", ""), []).append(p)
    seqs = []
    for p in pool:
        segs = [(format_prompt(p), f" \\boxed{{{p.answer}}}")]
        if rng.random() < FEWSHOT_FRACTION:
            fam = by_family[p.metadata.get("family", "")]
            shots = [q for q in rng.sample(fam, min(3, len(fam))) if q.id != p.id][:2]
            segs = [(format_prompt(q), f" \\boxed{{{q.answer}}}") for q in shots] + segs
        seqs.append(segs)
    return seqs


def _length_buckets(encoded: list, batch_size: int, steps: int, rng: random.Random) -> list[list]:
    """``steps`` batches drawn without replacement (reshuffled each epoch), each of sequences of similar length.

    A quarter of the sequences are 2-shot (about 70 tokens against about 25), so a random batch almost always pads to
    the longest; sorting a window of 32 batches by length before cutting it roughly halves the padded tokens.
    """
    out: list[list] = []
    order: list[int] = []
    window = batch_size * 32
    while len(out) < steps:
        while len(order) < window:  # a pool smaller than a window is repeated within it
            fresh = list(range(len(encoded)))
            rng.shuffle(fresh)
            order += fresh
        chunk, order = order[:window], order[window:]
        chunk.sort(key=lambda i: len(encoded[i][0]))
        cut = [[encoded[i] for i in chunk[j : j + batch_size]] for j in range(0, window, batch_size)]
        rng.shuffle(cut)
        out.extend(cut)
    return out[:steps]


def build_default_model(
    *,
    warmup_steps: int,
    batch_size: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
    task: WarmupTask | None = None,
    log=print,
):
    from xrpo.models.tiny import build_tiny_model, build_tiny_tokenizer

    task = task or WarmupTask()
    seqs = _warmup_examples(task)
    texts = ["".join(p + a for p, a in s) for s in seqs]
    tokenizer = build_tiny_tokenizer(texts)
    torch.manual_seed(seed)
    model = build_tiny_model(tokenizer, seed=seed)
    eos = tokenizer.eos_token_id
    # tokenise segment by segment so that labels cover answers only; separators between shots are "\n"
    encoded = []
    nl = tokenizer("\n", add_special_tokens=False)["input_ids"]
    for segs in seqs:
        ids, labels = [], []
        for j, (prompt, answer) in enumerate(segs):
            if j:
                ids += nl
                labels += [-100] * len(nl)
            p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            a = tokenizer(answer, add_special_tokens=False)["input_ids"]
            if j == len(segs) - 1:
                a = a + [eos]
            ids += p + a
            labels += [-100] * len(p) + a
        encoded.append((ids, labels))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s / warmup_steps, 1.0)))
    )
    rng = random.Random(seed)
    batches = _length_buckets(encoded, batch_size, warmup_steps, rng)
    model.train()
    losses = []
    t0 = time.perf_counter()
    pad = tokenizer.pad_token_id
    for step, batch in enumerate(batches):
        L = max(len(i) for i, _ in batch)
        ids = torch.full((batch_size, L), pad, dtype=torch.long)
        lab = torch.full((batch_size, L), -100, dtype=torch.long)
        att = torch.zeros((batch_size, L), dtype=torch.long)
        for b, (i, labels) in enumerate(batch):
            ids[b, : len(i)] = torch.tensor(i)
            lab[b, : len(labels)] = torch.tensor(labels)
            att[b, : len(i)] = 1
        loss = model(input_ids=ids, attention_mask=att, labels=lab).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if (step + 1) % 100 == 0:
            log(f"  warm-start step {step + 1}/{warmup_steps}: loss {sum(losses[-100:]) / 100:.3f}")
    model.eval()
    stats = {
        "cache_version": CACHE_VERSION,
        "warmup_steps": warmup_steps,
        "batch_size": batch_size,
        "lr": lr,
        "sequences": len(encoded),
        "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
        "train_seconds": time.perf_counter() - t0,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if task != WarmupTask():
        stats["task"] = task.as_dict()
    return model, tokenizer, stats
