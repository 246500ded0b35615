"""The driver-side pieces of Algorithm 1 on DataProto batches (xrpo.integrations.verl.phases)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("verl")

from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402

from xrpo.algo.allocation import allocate_round, split_budget  # noqa: E402
from xrpo.icl import Example  # noqa: E402
from xrpo.integrations.verl.config import XRPOConfig  # noqa: E402
from xrpo.integrations.verl.phases import (  # noqa: E402
    PAD_KEY,
    SEEDED_KEY,
    align_batch,
    chat_template_length,
    check_icl_prompts,
    finish_round,
    icl_messages,
    mark_padding,
    merge_rounds,
    problem_id,
    problem_text,
    rewards_by_prompt,
    round_counts,
    round_gen_batch,
    rows_sampled_as_trained,
    trained_rows,
)


def obj(items):
    out = np.empty(len(items), dtype=object)
    for i, v in enumerate(items):
        out[i] = v
    return out


def rollout_batch(groups: dict[str, list[float]], T: int = 4) -> DataProto:
    """Rows of a merged step: per uid its rewards, one token of response each with the reward on it."""
    uids = [u for u, rs in groups.items() for _ in rs]
    rewards = torch.tensor([r for rs in groups.values() for r in rs])
    n = len(uids)
    mask = torch.zeros(n, T, dtype=torch.int64)
    mask[:, :2] = 1
    rm = torch.zeros(n, T)
    rm[:, 1] = rewards
    td = TensorDict(
        {
            "response_mask": mask,
            "rm_scores": rm,
            "prompts": torch.arange(n).unsqueeze(-1).repeat(1, 3),
            "attention_mask": torch.ones(n, 7, dtype=torch.int64),
        },
        batch_size=n,
    )
    return DataProto(batch=td, non_tensor_batch={"uid": obj(uids), SEEDED_KEY: np.zeros(n, dtype=bool)})


def sizes(batch: DataProto) -> dict:
    u, c = np.unique(batch.non_tensor_batch["uid"], return_counts=True)
    return dict(zip(u.tolist(), c.tolist()))


# ------------------------------------------------------------------ align_batch


def test_pad_appends_rows_that_train_nothing():
    b = rollout_batch({"a": [1, 0, 1], "b": [0, 1], "c": [1, 1, 1, 1]})  # 9 rows
    out, info = align_batch(b, 4, "pad")
    assert len(out) == 12 and info == {
        "batch/pad_rows": 3.0,
        "batch/pad_frac": 0.25,
        "batch/trimmed_rows": 0.0,
        "batch/trimmed_groups": 0.0,
    }
    pad = out.non_tensor_batch[PAD_KEY]
    assert pad.tolist() == [False] * 9 + [True] * 3
    assert not out.batch["response_mask"][pad].any() and not out.batch["rm_scores"][pad].any()
    # each padding row is its own group: no real group gains a member
    assert len(set(out.non_tensor_batch["uid"][pad])) == 3
    assert {u: c for u, c in sizes(out).items() if not u.startswith("xrpo-pad")} == {"a": 3, "b": 2, "c": 4}
    assert torch.equal(out.batch["rm_scores"][:9], b.batch["rm_scores"])


def test_aligned_batch_is_untouched():
    b = rollout_batch({"a": [1, 0], "b": [0, 1]})
    out, info = align_batch(b, 4, "trim")
    assert len(out) == 4 and info["batch/pad_rows"] == 0 and info["batch/pad_frac"] == 0
    assert not out.non_tensor_batch[PAD_KEY].any()


def test_trim_drops_whole_zero_variance_groups_first():
    # 9 rows, multiple 4: excess 1. Zero-variance groups: "z3" (3 rows, all 0) and "z4" (4 rows, all 1); the
    # smaller one goes (3 rows >= the excess of 1), leaving 6 rows, padded to the multiple below: 8
    b = rollout_batch({"m": [1, 0], "z3": [0, 0, 0], "z4": [1, 1, 1, 1]})
    out, info = align_batch(b, 4, "trim")
    assert len(out) == 8
    assert info == {
        "batch/pad_rows": 2.0,
        "batch/pad_frac": 0.25,
        "batch/trimmed_rows": 3.0,
        "batch/trimmed_groups": 1.0,
    }
    real = {u: c for u, c in sizes(out).items() if not u.startswith("xrpo-pad")}
    assert real == {"m": 2, "z4": 4}  # no group lost a single rollout: kept whole or dropped whole


def test_trim_pads_when_no_zero_variance_group_covers_the_excess():
    b = rollout_batch({"m": [1, 0, 1], "n": [0, 1]})  # 5 rows, excess 1, no zero-variance group
    out, info = align_batch(b, 4, "trim")
    assert len(out) == 8 and info["batch/trimmed_rows"] == 0 and info["batch/pad_rows"] == 3
    # a batch below one multiple is padded, never emptied
    out, _ = align_batch(rollout_batch({"z": [0, 0, 0]}), 4, "trim")
    assert len(out) == 4 and sizes(out)["z"] == 3


def test_align_rejects_bad_arguments():
    b = rollout_batch({"a": [1, 0]})
    with pytest.raises(ValueError, match="mode"):
        align_batch(b, 4, "cut")
    with pytest.raises(ValueError, match="multiple"):
        align_batch(b, 0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_padding_rows_in_verls_loss_aggregation(mode):
    # verl's agg_loss as its actor calls it: global_batch_size = ppo_mini_batch_size * rollout.n (here the 16 rows
    # of the padded mini-batch), batch_num_tokens = the mini-batch's masked-in tokens. 14 real rows + 2 padding.
    from verl.trainer.ppo.core_algos import agg_loss

    b = rollout_batch({f"g{i}": [1, 0] for i in range(7)})  # 14 rows
    out, info = align_batch(b, 16, "pad")
    assert info["batch/pad_rows"] == 2 and info["batch/pad_frac"] == 2 / 16
    mask = out.batch["response_mask"].float()
    loss_mat = torch.rand(mask.shape, generator=torch.Generator().manual_seed(0))
    real = ~out.non_tensor_batch[PAD_KEY]
    padded = agg_loss(loss_mat, mask, mode, global_batch_size=len(out), batch_num_tokens=mask.sum())
    # the same loss over the real rows alone: what the step would get without padding
    alone = agg_loss(
        loss_mat[real], mask[real], mode, global_batch_size=int(real.sum()), batch_num_tokens=mask[real].sum()
    )
    if mode == "token-mean":
        torch.testing.assert_close(padded, alone)  # padding rows add no token: neutral
    else:
        # seq-mean divides by the fixed 16: the loss is scaled by 14 / 16 = 1 - pad_frac (docs/verl.md)
        torch.testing.assert_close(padded, alone * (1 - info["batch/pad_frac"]))


def test_rows_sampled_as_trained_leave_out_padding_and_icl_rows_trained_under_the_original_prompt():
    b = rollout_batch({"a": [1, 0, 1], "b": [0, 1]})
    b.non_tensor_batch[SEEDED_KEY] = np.array([False, False, True, False, True])
    out, _ = align_batch(b, 8, "pad")  # 3 padding rows
    assert rows_sampled_as_trained(out, "original").tolist() == [0, 1, 3]
    assert rows_sampled_as_trained(out, "icl").tolist() == [0, 1, 2, 3, 4]


def test_mark_padding_blanks_the_copied_reward_extras_in_a_dump():
    pad = np.array([False, False, True])
    extras = {"score": np.array([1.0, 0.0, 1.0]), "pred": np.array(["5", "x", "5"], dtype=object)}
    out = mark_padding(extras, pad)
    assert out == {"score": [1.0, 0.0, None], "pred": ["5", "x", None], PAD_KEY: [False, False, True]}
    assert extras["score"][2] == 1.0  # the batch's own arrays are untouched


# ------------------------------------------------------------------ allocation and generation batches


def test_round_counts_is_allocate_round_or_an_even_split():
    rng = np.random.default_rng(0)
    rewards = [rng.integers(0, 2, size=n).astype(float) for n in (4, 4, 6, 2)]
    x = XRPOConfig()
    assert np.array_equal(round_counts(rewards, 16, x), allocate_round(rewards, 16, alpha=0.05, lam=0.1))
    u = XRPOConfig(allocation="uniform", max_extra_per_prompt=5)
    assert np.array_equal(round_counts(rewards, 10, u), split_budget(np.zeros(4), 10, max_per_prompt=5))


def test_rewards_by_prompt_groups_rows_by_uid():
    got = rewards_by_prompt(["b", "a", "b", "c"], [1.0, 0.0, 0.5, 1.0], ["a", "b", "c"])
    assert [g.tolist() for g in got] == [[0.0], [1.0, 0.5], [1.0]]
    with pytest.raises(ValueError, match="'z' is not one of"):
        rewards_by_prompt(["z"], [1.0], ["a"])


def gen_batch(n=3):
    raws = [[{"role": "user", "content": f"Q{i}"}] for i in range(n)]
    return DataProto.from_dict(
        tensors={"dummy_tensor": torch.zeros(n, 1, dtype=torch.uint8)},
        non_tensors={"raw_prompt": obj(raws), "uid": obj([f"u{i}" for i in range(n)])},
    )


def test_round_gen_batch_repeats_prompts_and_routes_icl_rows():
    icl = {2: [{"role": "user", "content": "<task>ICL</task>"}]}
    out, prompt_of_row = round_gen_batch(gen_batch(), [2, 0, 3], icl, "original", "single_turn_agent")
    assert prompt_of_row.tolist() == [0, 0, 2, 2, 2] and out.non_tensor_batch["uid"].tolist() == ["u0"] * 2 + ["u2"] * 3
    assert out.non_tensor_batch["agent_name"].tolist() == ["single_turn_agent"] * 2 + ["xrpo_icl"] * 3
    assert out.non_tensor_batch["xrpo_icl_prompt"][4] == icl[2] and out.non_tensor_batch["xrpo_icl_prompt"][0] is None
    # raw_prompt stays the original messages (the xrpo_icl loop reads the ICL ones from their own field)
    assert out.non_tensor_batch["raw_prompt"][4] == [{"role": "user", "content": "Q2"}]
    plain, _ = round_gen_batch(gen_batch(), [1, 1, 1], {}, "original", "single_turn_agent")
    assert "agent_name" not in plain.non_tensor_batch
    with pytest.raises(ValueError, match="counts"):
        round_gen_batch(gen_batch(), [1, -1, 1], {}, "original", "single_turn_agent")


def fake_output(prompt_rows: DataProto, with_rm=True):
    """The tensor layout verl's agent loop returns for these rows (only the shape matters here)."""
    n = len(prompt_rows)
    td = {
        "prompts": torch.ones(n, 3, dtype=torch.int64),
        "responses": torch.ones(n, 2, dtype=torch.int64),
        "response_mask": torch.ones(n, 2, dtype=torch.int64),
    }
    if with_rm:
        td["rm_scores"] = torch.zeros(n, 2)
    nt = {"agent_name": obj(["x"] * n), "priority": np.arange(n), "score": np.zeros(n)}
    return DataProto(batch=TensorDict(td, batch_size=n), non_tensor_batch=nt, meta_info={"timing": {"t": 1.0}})


def test_finish_and_merge_rounds_keep_groups_and_drop_routing_fields():
    prompts = DataProto.from_dict(
        tensors={"dummy_tensor": torch.zeros(3, 1)}, non_tensors={"uid": obj(["u0", "u1", "u2"])}
    )
    parts = []
    for rnd, counts, seeded in [(0, [2, 2, 2], set()), (1, [0, 3, 1], {2})]:
        gen, _ = round_gen_batch(gen_batch(), counts, {}, "original", "a")
        parts.append(finish_round(prompts, fake_output(gen), counts, rnd, seeded))
    merged = merge_rounds(parts)
    assert merged.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u1", "u1", "u2", "u2", "u1", "u1", "u1", "u2"]
    assert merged.non_tensor_batch["xrpo_round"].tolist() == [0] * 6 + [1] * 4
    assert merged.non_tensor_batch[SEEDED_KEY].tolist() == [False] * 9 + [True]
    assert "agent_name" not in merged.non_tensor_batch and "priority" not in merged.non_tensor_batch
    assert "timing" not in merged.meta_info and len(prompts.meta_info) == 0
    with pytest.raises(ValueError, match="rm_scores"):
        gen, _ = round_gen_batch(gen_batch(), [1, 1, 1], {}, "original", "a")
        finish_round(prompts, fake_output(gen, with_rm=False), [1, 1, 1], 0, set())
    odd = parts[1]
    odd.non_tensor_batch["extra"] = np.zeros(len(odd))
    with pytest.raises(ValueError, match="extra"):
        merge_rounds(parts)


def test_check_icl_prompts_catches_a_prompt_rendered_differently():
    b = rollout_batch({"a": [0, 0, 1]})
    b.batch["prompts"][:] = 5
    b.non_tensor_batch[SEEDED_KEY][2] = True
    check_icl_prompts(b)  # same tokens: fine
    b.batch["prompts"][2, 0] = 6
    with pytest.raises(ValueError, match="icl_train_prompt=icl"):
        check_icl_prompts(b)


# ------------------------------------------------------------------ prompts


def test_problem_text_and_id():
    raw = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "What is 2+2?"},
    ]
    assert problem_text(raw) == "What is 2+2?"
    assert problem_id({"index": 17}, raw) == "17" and problem_id({}, raw) == "What is 2+2?"
    with pytest.raises(ValueError, match="no user message"):
        problem_text([{"role": "system", "content": "x"}])


def test_icl_messages_fit_the_prompt_length(tiny_tokenizer):
    raw = [{"role": "system", "content": "Answer in a box."}, {"role": "user", "content": "Q: 3 + 4\nA:"}]
    examples = [
        Example("s1", "Q: 1 + 2", "The sum is \\boxed{3}. " * 20, 0.9),
        Example("s2", "Q: 2 + 2", "\\boxed{4}", 0.8),
    ]
    msgs, cut = icl_messages(raw, examples, tiny_tokenizer, 2000)
    assert msgs[0] == raw[0] and "<new_problem>Q: 3 + 4\nA:</new_problem>" in msgs[1]["content"] and cut == 0
    assert "<problem>Q: 1 + 2</problem>" in msgs[1]["content"]
    # a tighter budget cuts the long solution; the whole chat-templated prompt still fits
    full = chat_template_length(tiny_tokenizer, msgs)
    budget = full - 100
    tight, cut = icl_messages(raw, examples, tiny_tokenizer, budget)
    n = chat_template_length(tiny_tokenizer, tight)
    assert cut == 1 and n <= budget
    # no room for any example: no ICL prompt (the prompt stays zero-shot)
    assert icl_messages(raw, examples, tiny_tokenizer, 30) == (None, 0)


def test_trained_rows_gives_each_rows_uid_advantage_and_old_loglik():
    # 3 rows: two with responses (2 and 1 tokens, starting at different positions), one empty (padding)
    mask = torch.tensor([[1, 1, 0], [0, 1, 0], [0, 0, 0]])
    old = torch.tensor([[-1.0, -3.0, -9.0], [-9.0, -0.5, -9.0], [-9.0, -9.0, -9.0]])
    adv = torch.tensor([0.75, -0.25, 0.0]).unsqueeze(-1) * mask  # an advantage broadcast over the response tokens
    batch = DataProto.from_dict(
        tensors={"response_mask": mask, "old_log_probs": old, "advantages": adv},
        non_tensors={"uid": obj(["a", "a", "pad"]), SEEDED_KEY: np.array([False, True, False])},
    )
    got = trained_rows(batch)
    assert got == {
        "xrpo_uid": ["a", "a", "pad"],
        "xrpo_advantage": [0.75, -0.25, 0.0],
        # s(y) = mean of the masked old log-probs: (-1 - 3) / 2 = -2; -0.5 / 1; none for the empty row
        "xrpo_loglik": [-2.0, -0.5, None],
        SEEDED_KEY: [False, True, False],
    }
