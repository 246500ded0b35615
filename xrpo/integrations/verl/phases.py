"""The driver-side pieces of Algorithm 1 on verl ``DataProto`` batches (used by `RayXRPOTrainer`; no GPU needed).

XRPO paper, Algorithm 1 and §3.2. Each function is a thin adapter: the allocation is `xrpo.algo.allocation`, the ICL
prompt `xrpo.icl.build_icl_prompt`, the metrics and the corpus update `xrpo.rollout`. What lives here is the
bookkeeping verl needs:

    round_counts        rewards so far (per uid) -> extra rollouts per prompt for one planning round
    icl_seed            a prompt's chat messages with its last user turn replaced by the paper's ICL template,
                        fitted to verl's prompt length (`icl_messages`: without the count of examples left out)
    round_gen_batch     the generation batch of a round: each prompt repeated by its count, ICL rows routed to the
                        ``xrpo_icl`` agent loop
    finish_round        one round's rollouts joined to their prompts' rows, tagged with round / seeded, stripped of
                        the per-round routing fields
    merge_rounds        the rounds of one step as one batch: every row keeps its prompt's uid (its group)
    check_icl_prompts   an ICL row trained under the original prompt carries exactly its base rows' prompt tokens
    align_batch         pad (rows with zero loss mask) or trim (whole zero-variance groups) to a size multiple
    rows_sampled_as_trained   the real rows whose rollout log-probs belong to the prompt they are trained on
    mark_padding        a rollout dump's reward extras with the padding rows blanked and flagged
    append_rounds       a step's rounds appended to rounds.jsonl, the trainer's rows (`xrpo simulate --rounds-file`)
    plan_result         the step as an `xrpo.rollout.records.PlanResult` for xrpo's metrics and corpus update
    VisitHistory        each prompt's last visit keyed by its problem id, for an allocator that reads history
                        (knapsack, xrpo-plus): the trainer's own history and update rule, saved with the checkpoint
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from xrpo.algo.rounds import PromptHistory, get_allocator
from xrpo.algo.visits import last_visit_state, visit_history
from xrpo.icl import build_icl_prompt
from xrpo.rollout.cures import observe_visit
from xrpo.rundir.files import write_atomic

__all__ = [
    "HISTORY_FILE",
    "PAD_KEY",
    "ROUND_KEY",
    "SEEDED_KEY",
    "VisitHistory",
    "align_batch",
    "append_rounds",
    "chat_template_length",
    "check_icl_prompts",
    "finish_round",
    "icl_messages",
    "icl_seed",
    "mark_padding",
    "merge_rounds",
    "plan_result",
    "problem_id",
    "problem_text",
    "rewards_by_prompt",
    "round_counts",
    "round_gen_batch",
    "rows_sampled_as_trained",
]

ROUND_KEY = "xrpo_round"
SEEDED_KEY = "xrpo_seeded"
PAD_KEY = "xrpo_pad"
# per-round routing fields (inputs of verl's agent loops) that must not reach the merged training batch
_TRANSIENT = ("agent_name", "priority", "xrpo_icl_prompt", "xrpo_train_prompt", "xrpo_gen_prompt_len")


def _obj_array(items: Sequence[Any]) -> np.ndarray:
    # np.array(list_of_lists, dtype=object) would build a 2-D array when the lists have equal lengths
    out = np.empty(len(items), dtype=object)
    for i, v in enumerate(items):
        out[i] = v
    return out


# ---------------------------------------------------------------------------------------------------------------
# prompts
# ---------------------------------------------------------------------------------------------------------------


def problem_text(raw_prompt: Sequence[dict]) -> str:
    """The problem as plain text: the content of the last user message (what retrieval embeds, as `Problem.text`)."""
    for msg in reversed(list(raw_prompt)):
        if msg.get("role") == "user":
            content = msg.get("content")
            if not isinstance(content, str):
                raise ValueError(
                    f"ICL seeding needs text prompts; the last user message holds {type(content).__name__}"
                )
            return content
    raise ValueError(f"raw_prompt has no user message: roles {[m.get('role') for m in raw_prompt]}")


def problem_id(extra_info: Any, raw_prompt: Sequence[dict]) -> str:
    """The ICL corpus key of a prompt: ``extra_info.index`` (what xrpo's parquet writer stores), else its text."""
    if isinstance(extra_info, dict) and extra_info.get("index") is not None:
        return str(extra_info["index"])
    return problem_text(raw_prompt)


def chat_template_length(tokenizer, messages: Sequence[dict], chat_template_kwargs: dict | None = None) -> int:
    """Tokens of ``messages`` under the chat template with the generation prompt (how verl's agent loop renders)."""
    out = tokenizer.apply_chat_template(
        list(messages), add_generation_prompt=True, tokenize=True, **dict(chat_template_kwargs or {})
    )
    # transformers 5 returns a BatchEncoding (a mapping) by default, 4.x a list of ids
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return len(ids)


def icl_seed(
    raw_prompt: Sequence[dict],
    examples: Sequence,
    tokenizer,
    max_prompt_tokens: int,
    chat_template_kwargs: dict | None = None,
) -> tuple[list[dict] | None, int, int]:
    """The ICL-seeded messages for a prompt (XRPO appendix template), or None when no example fits.

    The last user message's content becomes ``build_icl_prompt(content, examples)``; other messages (a system prompt)
    stay. The token budget is ``max_prompt_tokens`` (verl's ``rollout.prompt_length``, beyond which verl's agent loop
    would cut the prompt's start) minus what the chat template adds around the user text, measured on this prompt.

    Returns:
        (messages or None, number of example solutions cut to fit, number of examples left out to fit: the
        ``truncated`` and ``dropped`` of rounds.jsonl).
    """
    messages = [dict(m) for m in raw_prompt]
    last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    text = problem_text(messages)
    kwargs = dict(chat_template_kwargs or {})
    empty = [dict(m) for m in messages]
    empty[last]["content"] = ""
    budget = max_prompt_tokens - chat_template_length(tokenizer, empty, kwargs)
    if budget < 1:
        return None, 0, len(examples)

    def count(s: str) -> int:
        return len(tokenizer(s, add_special_tokens=False)["input_ids"])

    icl = build_icl_prompt(text, list(examples), count_tokens=count, max_tokens=budget)
    if icl.num_examples == 0:
        return None, 0, icl.dropped
    messages[last]["content"] = icl.text
    return messages, icl.truncated, icl.dropped


def icl_messages(
    raw_prompt: Sequence[dict],
    examples: Sequence,
    tokenizer,
    max_prompt_tokens: int,
    chat_template_kwargs: dict | None = None,
) -> tuple[list[dict] | None, int]:
    """`icl_seed` without the count of examples left out: (messages or None, example solutions cut to fit)."""
    messages, truncated, _ = icl_seed(raw_prompt, examples, tokenizer, max_prompt_tokens, chat_template_kwargs)
    return messages, truncated


# ---------------------------------------------------------------------------------------------------------------
# allocation
# ---------------------------------------------------------------------------------------------------------------


def rewards_by_prompt(row_uids: Sequence, row_rewards, prompt_uids: Sequence) -> list[np.ndarray]:
    """Per prompt (in ``prompt_uids`` order), the rewards of its rows so far."""
    pos = {u: i for i, u in enumerate(prompt_uids)}
    if len(pos) != len(prompt_uids):
        raise ValueError("prompt uids must be distinct")
    out: list[list[float]] = [[] for _ in prompt_uids]
    rewards = np.asarray(row_rewards, dtype=np.float64)
    for u, r in zip(row_uids, rewards):
        if u not in pos:
            raise ValueError(f"row uid {u!r} is not one of the step's prompts")
        out[pos[u]].append(float(r))
    return [np.asarray(v, dtype=np.float64) for v in out]


def round_counts(rewards: Sequence[np.ndarray], budget: int, xcfg, history: PromptHistory | None = None) -> np.ndarray:
    """Extra rollouts per prompt in one planning round (Algorithm 1 line 7): the allocator ``xcfg.allocation`` of
    `xrpo.algo.rounds` (HRP, Eqs. 1-3, an even split, ...), with the prompts' earlier visits ``history`` for an
    allocator that reads them (`VisitHistory.before`)."""
    return get_allocator(xcfg.allocation).fn(list(rewards), budget, xcfg, history)


def round_gen_batch(
    gen_batch, counts: Sequence[int], icl: dict[int, list[dict]], train_prompt: str, default_agent: str
):
    """The generation batch of one round: prompt q repeated ``counts[q]`` times (0 drops it); prompts in ``icl``
    (prompt index -> ICL messages) go to the ``xrpo_icl`` agent loop with their messages. Returns (batch, rows' prompt
    indices)."""
    from xrpo.integrations.verl.agent_loop import AGENT_NAME, ICL_PROMPT_KEY, TRAIN_PROMPT_KEY

    counts = np.asarray(counts, dtype=np.int64)
    if counts.shape != (len(gen_batch),) or (counts < 0).any():
        raise ValueError(f"counts must be {len(gen_batch)} integers >= 0, got {counts.tolist()}")
    prompt_of_row = np.repeat(np.arange(len(gen_batch)), counts)
    out = gen_batch.sample_level_repeat(counts.tolist())
    if icl:
        out.non_tensor_batch["agent_name"] = _obj_array(
            [AGENT_NAME if int(q) in icl else default_agent for q in prompt_of_row]
        )
        out.non_tensor_batch[ICL_PROMPT_KEY] = _obj_array([icl.get(int(q)) for q in prompt_of_row])
        out.non_tensor_batch[TRAIN_PROMPT_KEY] = _obj_array([train_prompt] * len(prompt_of_row))
    return out, prompt_of_row


def finish_round(batch, gen_output, counts: Sequence[int], rnd: int, seeded: set[int]):
    """One round's output joined to its prompts' rows (``batch``: one row per prompt, holding ``uid`` and the reward
    fields), tagged with ``xrpo_round`` / ``xrpo_seeded`` and stripped of the per-round routing fields."""
    counts = np.asarray(counts, dtype=np.int64)
    prompt_of_row = np.repeat(np.arange(len(batch)), counts)
    for key in _TRANSIENT:
        gen_output.non_tensor_batch.pop(key, None)
    if "rm_scores" not in gen_output.batch.keys():
        raise ValueError(
            "the rollout returned no rm_scores: XRPO needs every rollout's reward between planning rounds, which "
            "verl computes in its reward loop during generation (rule-based reward, or a reward model with "
            "reward.reward_model.enable_resource_pool=true)"
        )
    gen_output.meta_info = {k: v for k, v in gen_output.meta_info.items() if k != "timing"}
    rows = batch.sample_level_repeat(counts.tolist())
    rows.meta_info = dict(batch.meta_info)  # sample_level_repeat shares the dict; union would write into it
    rows = rows.union(gen_output)
    rows.non_tensor_batch[ROUND_KEY] = np.full(len(rows), rnd, dtype=np.int64)
    rows.non_tensor_batch[SEEDED_KEY] = np.array([int(q) in seeded for q in prompt_of_row], dtype=bool)
    return rows


def merge_rounds(parts: Sequence):
    """Concatenate the rounds of a step (all rows of a prompt keep its uid, so its group spans rounds)."""
    from verl import DataProto

    parts = [p for p in parts if len(p) > 0]
    if not parts:
        raise ValueError("no rollouts to merge")
    keys = set(parts[0].non_tensor_batch)
    tkeys = set(parts[0].batch.keys())
    for i, p in enumerate(parts[1:], start=1):
        if set(p.non_tensor_batch) != keys or set(p.batch.keys()) != tkeys:
            raise ValueError(
                f"round part {i} has other fields than part 0: non-tensor {sorted(set(p.non_tensor_batch) ^ keys)}, "
                f"tensor {sorted(set(p.batch.keys()) ^ tkeys)}"
            )
    return DataProto.concat(list(parts))


def check_icl_prompts(batch) -> None:
    """Raise if a seeded row carries other prompt tokens than its prompt's unseeded rows (for the "original"
    training prompt the ``xrpo_icl`` loop rebuilds the plain prompt: it must be the very same tokens)."""
    seeded = batch.non_tensor_batch[SEEDED_KEY]
    if not seeded.any():
        return
    uids = batch.non_tensor_batch["uid"]
    prompts = batch.batch["prompts"]
    ref: dict[Any, int] = {}
    for i in np.flatnonzero(~seeded):
        ref.setdefault(uids[i], int(i))
    for i in np.flatnonzero(seeded):
        j = ref.get(uids[i])
        if j is not None and not torch.equal(prompts[i], prompts[j]):
            raise ValueError(
                f"the ICL-seeded rollout of uid {uids[i]!r} is stored with other prompt tokens than the prompt's "
                "plain rollouts: verl's continuous-token builder rendered the original prompt differently inside "
                "the xrpo_icl agent loop; use algorithm.xrpo.icl_train_prompt=icl for this model"
            )


# ---------------------------------------------------------------------------------------------------------------
# fitting the batch to verl's multiples
# ---------------------------------------------------------------------------------------------------------------


def _pad_rows(batch, k: int):
    """k rows that train nothing: copies of row 0 with zero response mask, zero rewards and their own uid."""
    from verl import DataProto

    pad = batch.select_idxs([0] * k)
    pad = DataProto(
        batch=pad.batch.clone(),
        non_tensor_batch={key: v.copy() for key, v in pad.non_tensor_batch.items()},
        meta_info=pad.meta_info,
    )
    for key in ("response_mask", "rm_scores", "token_level_scores", "token_level_rewards"):
        if key in pad.batch.keys():
            pad.batch[key] = torch.zeros_like(pad.batch[key])
    if "response_mask" not in pad.batch.keys():
        raise ValueError("padding needs the batch's response_mask")
    pad.non_tensor_batch["uid"] = _obj_array([f"xrpo-pad-{i}" for i in range(k)])
    pad.non_tensor_batch[PAD_KEY] = np.ones(k, dtype=bool)
    return pad


def align_batch(batch, multiple: int, mode: str = "pad") -> tuple[Any, dict[str, float]]:
    """Fit a step's ragged batch to a size that is a multiple of ``multiple`` without splitting any group.

    "pad": append ``(-len) mod multiple`` padding rows (zero response mask, so zero loss; their own uid, so no group
    statistic sees them). "trim": drop whole zero-variance groups (all rewards equal: GRPO advantage 0 and no
    sharpening bonus, hence no policy-gradient term), fewest rows first, until the rows dropped cover the excess
    over the multiple below, then pad up to that multiple; if those groups do not cover it, pad instead. A batch
    smaller than ``multiple`` is always padded. Rows get ``xrpo_pad`` (False for real rows).

    Neither is free. A dropped group is not signal-free when the actor has a KL loss (``use_kl_loss``, on in
    xrpo_base.yaml): its tokens carry the KL gradient and count in the token-mean normaliser, so trimming changes
    both. Padding rows are neutral under verl's token-mean aggregation but not under its ``seq-mean-*`` modes, which
    divide by the fixed mini-batch size, padding rows included: ``batch/pad_frac`` reports the share (docs/verl.md).

    Returns:
        (batch, {"batch/pad_rows": ..., "batch/pad_frac": ..., "batch/trimmed_rows": ...,
        "batch/trimmed_groups": ...}); ``pad_frac`` = padding rows / rows of the returned batch.
    """
    from verl import DataProto

    if mode not in ("pad", "trim"):
        raise ValueError(f"mode must be 'pad' or 'trim', got {mode!r}")
    if int(multiple) < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    n = len(batch)
    batch.non_tensor_batch.setdefault(PAD_KEY, np.zeros(n, dtype=bool))
    info = {"batch/pad_rows": 0.0, "batch/pad_frac": 0.0, "batch/trimmed_rows": 0.0, "batch/trimmed_groups": 0.0}
    excess = n % multiple
    if excess == 0:
        return batch, info
    if mode == "trim" and n - excess > 0:
        rewards = batch.batch["rm_scores"].sum(-1).cpu().numpy()
        uids = batch.non_tensor_batch["uid"]
        gid = np.unique(uids, return_inverse=True)[1].reshape(-1)
        sizes = np.bincount(gid)
        lo = np.full(sizes.shape, np.inf)
        hi = np.full(sizes.shape, -np.inf)
        np.minimum.at(lo, gid, rewards)
        np.maximum.at(hi, gid, rewards)
        flat = np.flatnonzero(lo == hi)
        drop, covered = [], 0
        for g in flat[np.argsort(sizes[flat], kind="stable")]:
            if covered >= excess:
                break
            drop.append(int(g))
            covered += int(sizes[g])
        if covered >= excess:
            keep = np.flatnonzero(~np.isin(gid, drop))
            batch = batch.select_idxs(keep)
            info["batch/trimmed_rows"] = float(covered)
            info["batch/trimmed_groups"] = float(len(drop))
            excess = len(batch) % multiple
            if excess == 0:
                return batch, info
    k = multiple - excess
    info["batch/pad_rows"] = float(k)
    info["batch/pad_frac"] = k / (len(batch) + k)
    return DataProto.concat([batch, _pad_rows(batch, k)]), info


def rows_sampled_as_trained(batch, icl_train_prompt: str) -> np.ndarray:
    """Indices of the real rows whose ``rollout_log_probs`` were sampled under the prompt the row is trained on:
    not padding, and not ICL-seeded under ``icl_train_prompt="original"`` (sampled under the ICL prompt, stored
    with the plain one). Rollout-vs-actor log-prob comparisons are meaningful on these rows only."""
    nt = batch.non_tensor_batch
    n = len(batch)
    keep = ~np.asarray(nt.get(PAD_KEY, np.zeros(n, dtype=bool)), dtype=bool)
    if icl_train_prompt == "original":
        keep &= ~np.asarray(nt.get(SEEDED_KEY, np.zeros(n, dtype=bool)), dtype=bool)
    return np.flatnonzero(keep)


def mark_padding(reward_extra: dict, pad) -> dict:
    """A rollout dump's reward extras (verl's ``reward_extra_infos_dict``: key -> one value per row) with the
    padding rows' values set to None (they are row 0's copies) and an ``xrpo_pad`` column flagging those rows."""
    pad = np.asarray(pad, dtype=bool)
    out = {k: [None if p else v for v, p in zip(list(vals), pad, strict=True)] for k, vals in reward_extra.items()}
    out[PAD_KEY] = pad.tolist()
    return out


def trained_rows(batch) -> dict:
    """What the actor update trained each row on, for a rollout dump: ``xrpo_uid`` (the group), ``xrpo_advantage``
    (the row's advantage, broadcast over its response tokens; 0 for an empty row), ``xrpo_loglik`` (the row's
    length-normalised log-likelihood under the old policy, s(y) of Eq. 4; None for an empty row) and
    ``xrpo_seeded`` (an ICL-seeded rollout). With the rewards
    (verl's ``score``) they are the estimator's whole input, so a dump can be checked against `xrpo.algo`."""
    from xrpo.algo.advantages import length_normalized_loglik

    mask = batch.batch["response_mask"].detach().cpu() != 0
    valid = mask.any(dim=-1)
    adv = batch.batch["advantages"].detach().cpu()
    first = mask.float().argmax(dim=-1)  # the first response token (0 for an empty row, whose advantage is 0)
    row_adv = adv.gather(1, first.unsqueeze(1)).squeeze(1) * valid
    loglik = torch.zeros(len(valid), dtype=torch.float64)
    if valid.any():
        loglik[valid] = torch.as_tensor(
            length_normalized_loglik(batch.batch["old_log_probs"].detach().cpu()[valid], mask[valid]),
            dtype=torch.float64,
        )
    return {
        "xrpo_uid": [str(u) for u in batch.non_tensor_batch["uid"]],
        "xrpo_advantage": row_adv.tolist(),
        "xrpo_loglik": [float(v) if ok else None for v, ok in zip(loglik.tolist(), valid.tolist(), strict=True)],
        SEEDED_KEY: [bool(v) for v in batch.non_tensor_batch.get(SEEDED_KEY, np.zeros(len(valid), dtype=bool))],
    }


# ---------------------------------------------------------------------------------------------------------------
# xrpo's bookkeeping
# ---------------------------------------------------------------------------------------------------------------


def append_rounds(path: str, step: int, rounds: Sequence[dict]) -> None:
    """Append a step's rounds to ``path`` as `xrpo train` writes rounds.jsonl: one ``{"step": step, **round}`` row per
    round (`xrpo.rundir.rounds.round_entry`'s keys), so `xrpo simulate --rounds-file` and the study read a verl run's
    rounds as a trainer run's. A resumed run appends its redone steps; the readers keep a step's last block."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(json.dumps({"step": int(step), **r}) + "\n" for r in rounds))


def plan_result(batch, prompt_uids: Sequence, rounds: list[dict], tokenizer, full_reward: float):
    """The step's real rows as an `xrpo.rollout.records.PlanResult` plus its `Problem`s, for xrpo's
    ``rollout_metrics`` and ``xrpo.rollout.corpus.update_corpus``. Only correct rollouts are decoded (the corpus
    stores their text)."""
    from xrpo.data import Problem
    from xrpo.integrations.verl.reward import reference_answer
    from xrpo.rollout.records import PlanResult, RolloutRecord

    nt = batch.non_tensor_batch
    real = np.flatnonzero(~nt.get(PAD_KEY, np.zeros(len(batch), dtype=bool)))
    pos = {u: i for i, u in enumerate(prompt_uids)}
    problems: list = [None] * len(prompt_uids)
    mask = batch.batch["response_mask"]
    rewards = batch.batch["rm_scores"].sum(-1).cpu().numpy()
    resp_len = mask.shape[1]
    records = []
    for i in real:
        q = pos[nt["uid"][i]]
        if problems[q] is None:
            raw = list(nt["raw_prompt"][i])
            gt = nt["reward_model"][i].get("ground_truth") if isinstance(nt["reward_model"][i], dict) else None
            problems[q] = Problem(
                id=problem_id(nt["extra_info"][i], raw),
                prompt=copy.deepcopy(raw),
                answer=reference_answer(gt, nt["data_source"][i], nt["extra_info"][i]),
            )
        ids = batch.batch["responses"][i][mask[i].bool()].tolist()
        reward = float(rewards[i])
        text = tokenizer.decode(ids, skip_special_tokens=True) if reward >= full_reward else ""
        records.append(
            RolloutRecord(
                problem_index=q,
                group_id=q,
                round=int(nt[ROUND_KEY][i]),
                seeded=bool(nt[SEEDED_KEY][i]),
                gen_prompt_ids=[],
                train_prompt_ids=[],
                completion_ids=ids,
                logprobs=[],
                finish_reason="length" if len(ids) >= resp_len else "stop",
                text=text,
                reward=reward,
            )
        )
    return PlanResult(
        records=records,
        rewards=np.array([x.reward for x in records], dtype=np.float64),
        group_ids=np.array([x.group_id for x in records], dtype=np.int64),
        rounds=rounds,
    ), problems


# ---------------------------------------------------------------------------------------------------------------
# each prompt's last visit (knapsack, xrpo-plus)
# ---------------------------------------------------------------------------------------------------------------

HISTORY_FILE = "xrpo_history.json"


class VisitHistory:
    """Each training prompt's last visit, for an allocator that reads history (``uses_history``: knapsack,
    xrpo-plus), keyed by the prompt's problem id (`problem_id`: ``extra_info.index``, else its text).

    The state and its rule are the trainer's (`xrpo.algo.visits`, `xrpo.rollout.cures.observe_visit`): a
    `CuresState` with keep="last" over the training set (`last_visit_state`), each prompt's successes (reward >=
    full_reward) and rollouts of its latest step, ICL-seeded rollouts left out (`observe_visit`), and with a
    ``window`` (`xrpo.algo.rounds.history_window`: Knapsack RL's authors' rule) its latest outcomes across visits,
    handed to the planner with ``alloc/history_frac`` (`visit_history`). The trainer indexes it by training-set
    position; verl's dataloader hands the driver rows without one, so each problem id gets a slot the first time the
    driver meets it (``ids``: slot -> id).
    """

    def __init__(self, num_problems: int, window: int = 0):
        self.state = last_visit_state(num_problems, window)
        self.ids: list[str] = []
        self._slot: dict[str, int] = {}

    def slots(self, ids: Sequence[str]) -> np.ndarray:
        """The slots of ``ids``, giving a new one to each id not met before."""
        for pid in ids:
            if pid not in self._slot:
                if len(self.ids) == self.state.num_problems:
                    raise ValueError(
                        f"problem id {pid!r} is new, but the history already holds {len(self.ids)} distinct ids, as "
                        "many as the training set has rows: did the training data change during the run?"
                    )
                self._slot[pid] = len(self.ids)
                self.ids.append(pid)
        return np.array([self._slot[pid] for pid in ids], dtype=np.int64)

    def before(self, ids: Sequence[str]) -> tuple[PromptHistory, dict]:
        """The planner's ``history`` for a step over the prompts ``ids`` and ``alloc/history_frac``."""
        return visit_history(self.state, self.slots(ids))

    def observe(self, ids: Sequence[str], plan, full_reward: float) -> None:
        """The step's visit becomes the last visit of its prompts: ``plan`` is the step's `PlanResult`
        (`plan_result`), whose group q is the prompt ``ids[q]``."""
        observe_visit(self.state, self.slots(ids), plan, full_reward)

    def state_dict(self) -> dict:
        return {"ids": list(self.ids), **self.state.state_dict()}

    def load_state_dict(self, d: dict) -> None:
        ids = d.get("ids") if isinstance(d, dict) else None
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids) or len(set(ids)) != len(ids):
            raise ValueError("per-prompt history is malformed: expected 'ids', a list of distinct problem ids")
        if len(ids) > self.state.num_problems:
            raise ValueError(
                f"per-prompt history holds {len(ids)} problem ids, the training set has {self.state.num_problems} "
                "rows: was the run resumed with other training data?"
            )
        self.state.load_state_dict(d)
        self.ids = list(ids)
        self._slot = {pid: i for i, pid in enumerate(ids)}

    def save(self, path: str) -> None:
        """Write the history to ``path`` atomically (a reader, or a crash, sees the old file or the new one)."""
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        write_atomic(path, json.dumps(self.state_dict()))

    def load(self, path: str) -> None:
        try:
            with open(path, encoding="utf-8") as f:
                d = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: per-prompt history is not valid JSON ({e})") from None
        try:
            self.load_state_dict(d)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
