"""Tests for xrpo.algo.losses: hand-computed cases, gradients, clipping, GSPO, micro-batching, masking, a loop twin."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch

from xrpo.algo.losses import (
    AGG_MODES,
    POLICY_LOSSES,
    aggregate_loss,
    get_policy_loss,
    kl_penalty,
    register_policy_loss,
)

LOSS_NAMES = ("vanilla", "gspo", "gspo_token")
NAN = float("nan")


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def _grad(loss: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss, x)
    return g


# ----------------------------------------------------------------------------------------------------------------
# A hand-computed batch for "vanilla" (old_logprobs = 0, so logprobs = log ratio)
#   row 0: A = +1, ratios [1.0, 1.5, 0.5], mask [1, 1, 1]
#   row 1: A = -1, ratios [1.0, 1.5, 0.5], mask [1, 1, 1]
#   row 2: A = +2, ratios [1.2, -, -],     mask [1, 0, 0]  (masked positions hold NaN / inf)
# eps_low = 0.2, eps_high = 0.28 -> clip range [0.8, 1.28]; loss_t = -min(r A, clip(r) A)
#   row 0: r=1   -> -1;  r=1.5 -> -min(1.5, 1.28) = -1.28 (high clip binds);  r=0.5 -> -min(0.5, 0.8) = -0.5
#          sum -2.78
#   row 1: r=1   -> 1;   r=1.5 -> max(1.5, 1.28) = 1.5;   r=0.5 -> max(0.5, 0.8) = 0.8 (low clip binds)
#          sum 3.3
#   row 2: r=1.2 -> -min(2.4, 2.4) = -2.4
# ----------------------------------------------------------------------------------------------------------------


def _hand_batch():
    ratios = [[1.0, 1.5, 0.5], [1.0, 1.5, 0.5], [1.2, 1.0, 1.0]]
    logp = _t([[math.log(r) for r in row] for row in ratios])
    logp[2, 1] = NAN
    logp[2, 2] = float("inf")
    logp.requires_grad_(True)
    old = torch.zeros(3, 3, dtype=torch.float64)
    old[2, 2] = NAN
    adv = _t([1.0, -1.0, 2.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [1, 0, 0]])
    return logp, old, adv, mask


@pytest.mark.parametrize(
    ("agg_mode", "expected"),
    [
        # (-2.78 + 3.3 - 2.4) / 7 tokens
        ("token-mean", -1.88 / 7),
        # mean over 3 sequences of (-2.78/3, 3.3/3, -2.4/1)
        ("seq-mean-token-mean", (-2.78 / 3 + 3.3 / 3 - 2.4) / 3),
        # mean over 3 sequences of (-2.78/4, 3.3/4, -2.4/4), max_tokens = 4
        ("seq-mean-token-sum-norm", (-2.78 + 3.3 - 2.4) / 4 / 3),
    ],
)
def test_vanilla_hand_computed(agg_mode, expected):
    logp, old, adv, mask = _hand_batch()
    loss, m = get_policy_loss("vanilla")(
        logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg_mode=agg_mode, max_tokens=4
    )
    torch.testing.assert_close(loss, _t(expected))
    # high clip binds on row 0 token 1 only, low clip on row 1 token 2 only: 1 of 7 valid tokens each
    assert m["loss/clipfrac_high"] == pytest.approx(1 / 7, abs=1e-15)
    assert m["loss/clipfrac_low"] == pytest.approx(1 / 7, abs=1e-15)
    # ratio stats over the 7 valid tokens: (1 + 1.5 + 0.5) * 2 + 1.2 = 7.2
    assert m["loss/ratio_mean"] == pytest.approx(7.2 / 7, rel=1e-14)
    assert m["loss/ratio_max"] == pytest.approx(1.5, rel=1e-14)
    assert m["loss/ratio_min"] == pytest.approx(0.5, rel=1e-14)
    # approx_kl = mean of k3 = r - 1 - log r
    k3 = [r - 1 - math.log(r) for r in (1.0, 1.5, 0.5, 1.0, 1.5, 0.5, 1.2)]
    assert m["loss/approx_kl"] == pytest.approx(sum(k3) / 7, rel=1e-12)
    assert all(isinstance(v, float) for v in m.values())


def test_vanilla_hand_computed_gradient():
    logp, old, adv, mask = _hand_batch()
    loss, _ = get_policy_loss("vanilla")(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, agg_mode="token-mean")
    g = _grad(loss, logp)
    # d(-r A)/d logp = -A r on unclipped tokens, 0 where a clip binds or the token is masked; token-mean divides by 7
    expected = (
        _t(
            [
                [-1.0 * 1.0, 0.0, -1.0 * 0.5],  # r=1.5, A>0: clipped
                [1.0 * 1.0, 1.0 * 1.5, 0.0],  # r=0.5, A<0: clipped
                [-2.0 * 1.2, 0.0, 0.0],  # masked tokens
            ]
        )
        / 7
    )
    torch.testing.assert_close(g, expected)


@pytest.mark.parametrize(
    ("adv", "ratio", "loss", "grad"),
    [
        # A > 0: the high side clips (r > 1 + 0.28), the low side never binds (min keeps r A)
        (1.0, 1.5, -1.28, 0.0),
        (1.0, 1.1, -1.1, -1.1),
        (1.0, 0.5, -0.5, -0.5),
        # A < 0: the low side clips (r < 1 - 0.2), the high side never binds
        (-1.0, 0.5, 0.8, 0.0),
        (-1.0, 0.9, 0.9, 0.9),
        (-1.0, 1.5, 1.5, 1.5),
        # A = 0: no loss, no gradient and no clip counted, whatever the ratio
        (0.0, 3.0, 0.0, 0.0),
        (0.0, 0.5, 0.0, 0.0),
    ],
)
def test_vanilla_clip_both_sides(adv, ratio, loss, grad):
    logp = _t([[math.log(ratio)]]).requires_grad_(True)
    out, m = get_policy_loss("vanilla")(
        logp, _t([[0.0]]), _t([adv]), torch.ones(1, 1), clip_low=0.2, clip_high=0.28, agg_mode="token-mean"
    )
    torch.testing.assert_close(out, _t(loss))
    torch.testing.assert_close(_grad(out, logp), _t([[grad]]))
    assert m["loss/clipfrac_high"] == (1.0 if adv > 0 and ratio > 1.28 else 0.0)
    assert m["loss/clipfrac_low"] == (1.0 if adv < 0 and ratio < 0.8 else 0.0)


def test_vanilla_zero_clip_range():
    # eps_low = eps_high = 0 is legal (eps_low in [0, 1), eps_high >= 0): clip(r, 1, 1) = 1, so
    # loss_t = -min(r A, A).  row 0: A = +1, r = [1.5, 1] -> [-1, -1];  row 1: A = -2, r = [0.5, 1] -> [2, 2]
    logp = _t([[math.log(1.5), 0.0], [math.log(0.5), 0.0]])
    loss, m = get_policy_loss("vanilla")(
        logp,
        torch.zeros(2, 2, dtype=torch.float64),
        _t([1.0, -2.0]),
        torch.ones(2, 2),
        clip_low=0.0,
        clip_high=0.0,
        agg_mode="token-mean",
    )
    # (-1 - 1 + 2 + 2) / 4 tokens
    assert loss.item() == 0.5
    # r = 1.5 > 1 with A > 0 (high clip), r = 0.5 < 1 with A < 0 (low clip): 1 of 4 tokens each
    assert m["loss/clipfrac_high"] == 0.25
    assert m["loss/clipfrac_low"] == 0.25


def test_validation_messages_state_the_accepted_range():
    lp, mask = torch.zeros(1, 2), torch.ones(1, 2)
    fn = get_policy_loss("vanilla")
    with pytest.raises(ValueError, match=r"^clip_low: expected a finite number >= 0\.0 and < 1\.0, got 1\.0$"):
        fn(lp, lp, torch.zeros(1), mask, clip_low=1.0, clip_high=0.2, agg_mode="token-mean")
    with pytest.raises(ValueError, match=r"^clip_high: expected a finite number >= 0\.0, got -0\.1$"):
        fn(lp, lp, torch.zeros(1), mask, clip_low=0.2, clip_high=-0.1, agg_mode="token-mean")
    with pytest.raises(ValueError, match=r"^max_tokens: expected a finite number > 0\.0, got 0$"):
        aggregate_loss(lp, mask, "seq-mean-token-sum-norm", max_tokens=0)
    # the advantage shapes each loss accepts: "vanilla" also per token, "gspo" one per sequence only
    kw = dict(clip_low=0.2, clip_high=0.2, agg_mode="token-mean")
    with pytest.raises(ValueError, match=r"^advantages: expected shape \(1,\) or \(1, 2\), got \(3,\)$"):
        fn(lp, lp, torch.zeros(3), mask, **kw)
    with pytest.raises(
        ValueError, match=r"^advantages: expected shape \(1,\) \(one advantage per sequence\), got \(1, 2\)$"
    ):
        get_policy_loss("gspo")(lp, lp, torch.zeros(1, 2), mask, **kw)


@pytest.mark.parametrize("agg_mode", AGG_MODES)
def test_vanilla_gradient_at_ratio_one(agg_mode):
    # at r = 1 the surrogate's gradient is -A per token, divided by the aggregation's denominator:
    # token-mean: N valid tokens; seq-mean-token-mean: G * |o_i|; seq-mean-token-sum-norm: G * max_tokens
    rng = np.random.default_rng(0)
    old = _t(rng.normal(-1.0, 0.5, (4, 6)))
    logp = old.clone().requires_grad_(True)
    adv = _t([0.7, -1.3, 2.0, -0.4])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]])
    loss, _ = get_policy_loss("vanilla")(
        logp, old, adv, mask, clip_low=0.2, clip_high=0.2, agg_mode=agg_mode, max_tokens=8
    )
    lengths = mask.sum(-1, keepdim=True).double()
    denom = {
        "token-mean": mask.sum().double(),
        "seq-mean-token-mean": 4 * lengths,
        "seq-mean-token-sum-norm": torch.full_like(lengths, 4 * 8.0),
    }[agg_mode]
    expected = -adv[:, None] / denom * mask
    torch.testing.assert_close(_grad(loss, logp), expected)


# ----------------------------------------------------------------------------------------------------------------
# GSPO
#   row 0: log ratios [0.1, -0.2, 0.4], mask [1, 1, 1] -> mean 0.1 -> s0 = e^0.1 = 1.105171
#   row 1: log ratios [0.3, 0.1, NaN],  mask [1, 1, 0] -> mean 0.2 -> s1 = e^0.2 = 1.221403
#   A = [+1, -1]
# ----------------------------------------------------------------------------------------------------------------


def _gspo_batch():
    old = _t([[-1.0, -2.0, -0.5], [-1.5, -0.3, -0.7]])
    logp = (old + _t([[0.1, -0.2, 0.4], [0.3, 0.1, NAN]])).requires_grad_(True)
    return logp, old, _t([1.0, -1.0]), torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_gspo_ratio_is_exp_of_mean_log_ratio():
    logp, old, adv, mask = _gspo_batch()
    _, m = get_policy_loss("gspo")(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, agg_mode="seq-mean-token-mean")
    s0, s1 = math.exp(0.1), math.exp(0.2)
    assert m["loss/ratio_min"] == pytest.approx(s0, rel=1e-14)
    assert m["loss/ratio_max"] == pytest.approx(s1, rel=1e-14)
    # each sequence ratio counted once per valid token: (3 s0 + 2 s1) / 5
    assert m["loss/ratio_mean"] == pytest.approx((3 * s0 + 2 * s1) / 5, rel=1e-14)


def test_gspo_hand_computed_paper_clip():
    logp, old, adv, mask = _gspo_batch()
    loss, m = get_policy_loss("gspo")(
        logp, old, adv, mask, clip_low=3e-4, clip_high=4e-4, agg_mode="seq-mean-token-mean"
    )
    # row 0: A > 0, s0 = 1.105 > 1.0004 -> clipped: -1.0004
    # row 1: A < 0, s1 = 1.221 > 1.0004 -> the high clip does not bind for A < 0: max(s1, 1.0004) = s1
    # seq-mean-token-mean: (-1.0004 + s1) / 2
    torch.testing.assert_close(loss, _t((-1.0004 + math.exp(0.2)) / 2))
    assert m["loss/clipfrac_high"] == pytest.approx(3 / 5)  # the 3 tokens of row 0
    assert m["loss/clipfrac_low"] == 0.0
    g = _grad(loss, logp)
    # row 0 clipped -> 0; row 1: d(s1 * 1)/d logp_t = s1 / |y_1| per valid token, / G = 2
    torch.testing.assert_close(g, _t([[0, 0, 0], [math.exp(0.2) / 2 / 2, math.exp(0.2) / 2 / 2, 0]]))


def test_gspo_hand_computed_gradient_unclipped():
    logp, old, adv, mask = _gspo_batch()
    loss, _ = get_policy_loss("gspo")(logp, old, adv, mask, clip_low=0.5, clip_high=0.5, agg_mode="token-mean")
    s0, s1 = math.exp(0.1), math.exp(0.2)
    # token-mean over 5 tokens of (-s0, -s0, -s0, s1, s1)
    torch.testing.assert_close(loss, _t((-3 * s0 + 2 * s1) / 5))
    # d/d logp_{i,t}: |y_i| copies of -A_i s_i / 5, each with d s_i / d logp_t = s_i / |y_i| -> -A_i s_i / 5
    torch.testing.assert_close(_grad(loss, logp), _t([[-s0 / 5] * 3, [s1 / 5, s1 / 5, 0.0]]))


@pytest.mark.parametrize("agg_mode", AGG_MODES)
@pytest.mark.parametrize(("clip_low", "clip_high"), [(3e-4, 4e-4), (0.2, 0.2), (0.5, 0.5)])
def test_gspo_token_equals_gspo_with_sequence_advantages(agg_mode, clip_low, clip_high):
    # GSPO paper §4.3: with A_i,t = A_i, GSPO-token and GSPO agree in value, clipping and gradient
    rng = np.random.default_rng(1)
    old = _t(rng.normal(-1.0, 0.5, (5, 7)))
    delta = _t(rng.normal(0.0, 0.3, (5, 7)))
    mask = torch.from_numpy(rng.random((5, 7)) < 0.7)
    adv = _t(rng.normal(0.0, 1.0, 5))
    outs = {}
    for name in ("gspo", "gspo_token"):
        logp = (old + delta).requires_grad_(True)
        loss, m = get_policy_loss(name)(
            logp, old, adv, mask, clip_low=clip_low, clip_high=clip_high, agg_mode=agg_mode, max_tokens=7
        )
        outs[name] = (loss, _grad(loss, logp), m)
    torch.testing.assert_close(outs["gspo"][0], outs["gspo_token"][0])
    torch.testing.assert_close(outs["gspo"][1], outs["gspo_token"][1])
    for k, v in outs["gspo"][2].items():
        assert outs["gspo_token"][2][k] == pytest.approx(v, rel=1e-12), k


def test_gspo_token_per_token_advantages_hand_computed():
    logp, old, _, mask = _gspo_batch()
    adv_tok = _t([[1.0, -2.0, 0.5], [3.0, -1.0, 7.0]])
    loss, m = get_policy_loss("gspo_token")(
        logp, old, adv_tok, mask, clip_low=0.5, clip_high=0.5, agg_mode="token-mean"
    )
    s0, s1 = math.exp(0.1), math.exp(0.2)
    # value: every token's ratio is its sequence's s_i: sum_t -A_t s_i / 5 tokens
    torch.testing.assert_close(loss, _t(-(s0 * (1.0 - 2.0 + 0.5) + s1 * (3.0 - 1.0)) / 5))
    # gradient: token t gets only its own -A_t s_i / 5 (no averaging over the sequence, unlike GSPO)
    expected = _t([[-s0 / 5, 2 * s0 / 5, -0.5 * s0 / 5], [-3 * s1 / 5, s1 / 5, 0.0]])
    torch.testing.assert_close(_grad(loss, logp), expected)
    assert m["loss/ratio_max"] == pytest.approx(s1, rel=1e-14)


def test_gspo_token_gradient_differs_from_gspo_per_token():
    # the same value with per-token advantages collapsed to their sequence mean, but different per-token gradients
    logp, old, _, mask = _gspo_batch()
    adv_tok = _t([[1.0, -2.0, 0.5], [3.0, -1.0, 0.0]])
    adv_seq = _t([(1.0 - 2.0 + 0.5) / 3, (3.0 - 1.0) / 2])
    kw = dict(clip_low=0.5, clip_high=0.5, agg_mode="seq-mean-token-mean")
    loss_tok, _ = get_policy_loss("gspo_token")(logp, old, adv_tok, mask, **kw)
    g_tok = _grad(loss_tok, logp)
    loss_seq, _ = get_policy_loss("gspo")(logp, old, adv_seq, mask, **kw)
    g_seq = _grad(loss_seq, logp)
    torch.testing.assert_close(loss_tok, loss_seq)
    # GSPO spreads each sequence's gradient evenly over its tokens; GSPO-token follows each token's advantage
    assert torch.allclose(g_seq[0], g_seq[0, :1].expand(3))
    assert not torch.allclose(g_tok[0], g_seq[0])
    torch.testing.assert_close(g_tok.sum(-1), g_seq.sum(-1))


def test_gspo_rejects_token_advantages():
    logp, old, _, mask = _gspo_batch()
    with pytest.raises(ValueError, match="advantages"):
        get_policy_loss("gspo")(
            logp, old, torch.zeros(2, 3, dtype=torch.float64), mask, clip_low=0.2, clip_high=0.2, agg_mode="token-mean"
        )


# ----------------------------------------------------------------------------------------------------------------
# aggregate_loss
# ----------------------------------------------------------------------------------------------------------------


def test_aggregate_loss_hand_computed():
    loss_mat = _t([[1.0, 2.0, 3.0, NAN], [4.0, 0.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    # token-mean: (1 + 2 + 3 + 4) / 4 tokens = 2.5
    torch.testing.assert_close(aggregate_loss(loss_mat, mask, "token-mean"), _t(2.5))
    # seq-mean-token-mean: rows (6/3, 4/1); the empty row is not counted -> (2 + 4) / 2 = 3
    torch.testing.assert_close(aggregate_loss(loss_mat, mask, "seq-mean-token-mean"), _t(3.0))
    # seq-mean-token-sum-norm, max_tokens = 5: (6/5 + 4/5) / 2 = 1
    torch.testing.assert_close(aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", max_tokens=5), _t(1.0))
    # global denominators replace the local counts: 10 / 8 tokens, (2 + 4) / 6 sequences, (2) / 4 sequences
    torch.testing.assert_close(aggregate_loss(loss_mat, mask, "token-mean", global_tokens=8), _t(1.25))
    torch.testing.assert_close(aggregate_loss(loss_mat, mask, "seq-mean-token-mean", global_seqs=6), _t(1.0))
    torch.testing.assert_close(
        aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", global_seqs=4, max_tokens=5), _t(0.5)
    )


@pytest.mark.parametrize("agg_mode", AGG_MODES)
def test_aggregate_loss_all_masked_is_zero(agg_mode):
    loss_mat = _t([[NAN, 1.0], [2.0, float("inf")]]).requires_grad_(True)
    out = aggregate_loss(loss_mat, torch.zeros(2, 2), agg_mode, max_tokens=3)
    assert out.item() == 0.0
    torch.testing.assert_close(_grad(out, loss_mat), torch.zeros(2, 2, dtype=torch.float64))


def test_aggregate_loss_validation():
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3)
    with pytest.raises(ValueError, match="agg_mode"):
        aggregate_loss(x, m, "mean")
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate_loss(x, m, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate_loss(x, m, "seq-mean-token-sum-norm", max_tokens=0)
    with pytest.raises(ValueError, match="global_tokens"):
        aggregate_loss(x, m, "token-mean", global_tokens=5)  # fewer than the 6 local tokens
    with pytest.raises(ValueError, match="global_tokens"):
        aggregate_loss(x, m, "token-mean", global_tokens=float("nan"))
    with pytest.raises(ValueError, match="global_seqs"):
        aggregate_loss(x, m, "seq-mean-token-mean", global_seqs=1)
    with pytest.raises(ValueError, match="mask"):
        aggregate_loss(x, torch.ones(3, 2), "token-mean")
    with pytest.raises(ValueError, match="mask"):
        aggregate_loss(x, torch.full((2, 3), 2.0), "token-mean")
    with pytest.raises(ValueError, match="loss_mat"):
        aggregate_loss(torch.zeros(6), torch.ones(6), "token-mean")
    with pytest.raises(ValueError, match="loss_mat"):
        aggregate_loss(torch.tensor([[1.0, NAN]]), torch.ones(1, 2), "token-mean")
    # tensor-valued global counts are accepted (the trainer may compute them with torch)
    torch.testing.assert_close(
        aggregate_loss(torch.ones(2, 3), m, "token-mean", global_tokens=torch.tensor(12)), torch.tensor(0.5)
    )


def test_aggregate_loss_smallest_counts():
    # one valid token / one non-empty sequence: the smallest legal denominators (1) are accepted and used as is
    one_tok = _t([[3.0, NAN]])
    one_tok_mask = torch.tensor([[1, 0]])
    # token-mean: 3 / 1 token, locally or with global_tokens = 1
    assert aggregate_loss(one_tok, one_tok_mask, "token-mean").item() == 3.0
    assert aggregate_loss(one_tok, one_tok_mask, "token-mean", global_tokens=1).item() == 3.0
    # a batch with a single non-empty sequence (the other one fully masked): the seq-mean divides by 1
    loss_mat = _t([[1.0, 2.0, NAN], [7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    # seq-mean-token-mean: (1 + 2) / 2 tokens = 1.5, over 1 sequence
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-mean").item() == 1.5
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-mean", global_seqs=1).item() == 1.5
    # seq-mean-token-sum-norm with a generation budget of one token: (1 + 2) / 1, over 1 sequence
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", max_tokens=1).item() == 3.0
    assert aggregate_loss(loss_mat, mask, "seq-mean-token-sum-norm", max_tokens=1, global_seqs=1).item() == 3.0


def test_aggregate_loss_rejects_zero_global_counts():
    # a global count of 0 would divide by zero (NaN loss), even for a micro-batch with no valid token
    loss_mat, mask = torch.zeros(2, 3), torch.zeros(2, 3)
    with pytest.raises(ValueError, match="global_tokens"):
        aggregate_loss(loss_mat, mask, "token-mean", global_tokens=0)
    for agg_mode in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):
        with pytest.raises(ValueError, match="global_seqs"):
            aggregate_loss(loss_mat, mask, agg_mode, global_seqs=0, max_tokens=3)


# ----------------------------------------------------------------------------------------------------------------
# Micro-batch equivalence: summing micro-batch losses (and gradients) with global denominators = full batch
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("agg_mode", AGG_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_micro_batches_sum_to_full_batch(name, agg_mode, seed):
    rng = np.random.default_rng(seed)
    b, t = 9, 12
    lengths = rng.integers(0, t + 1, b)
    lengths[0] = t
    mask = torch.from_numpy(np.arange(t)[None, :] < lengths[:, None])
    old = _t(rng.normal(-1.5, 0.7, (b, t)))
    logp = (old + _t(rng.normal(0.0, 0.25, (b, t)))).requires_grad_(True)
    adv = _t(rng.normal(0.0, 1.0, b))
    kw = dict(clip_low=0.2, clip_high=0.28, agg_mode=agg_mode, max_tokens=t)
    fn = get_policy_loss(name)
    full, _ = fn(logp, old, adv, mask, **kw)
    g_full = _grad(full, logp)

    global_tokens = int(mask.sum())
    global_seqs = int((mask.sum(-1) > 0).sum())
    total = torch.zeros((), dtype=torch.float64)
    g_micro = torch.zeros_like(logp)
    for rows in (slice(0, 2), slice(2, 3), slice(3, 7), slice(7, 9)):
        # each micro-batch is padded only to its own longest sequence, as a real collator does
        width = max(int(lengths[rows].max()), 1)
        lp = logp.detach()[rows, :width].clone().requires_grad_(True)
        part, _ = fn(
            lp,
            old[rows, :width],
            adv[rows],
            mask[rows, :width],
            global_tokens=global_tokens,
            global_seqs=global_seqs,
            **kw,
        )
        total = total + part.detach()
        g_micro[rows, :width] = _grad(part, lp)
    torch.testing.assert_close(total, full.detach())
    torch.testing.assert_close(g_micro, g_full)


# ----------------------------------------------------------------------------------------------------------------
# Masked tokens never contribute
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("agg_mode", AGG_MODES)
def test_masked_tokens_ignored(name, agg_mode):
    rng = np.random.default_rng(3)
    mask = torch.from_numpy(rng.random((4, 6)) < 0.6)
    mask[0] = True
    old = _t(rng.normal(-1.0, 0.5, (4, 6)))
    base = old + _t(rng.normal(0.0, 0.2, (4, 6)))
    adv = _t(rng.normal(0.0, 1.0, 4))
    kw = dict(clip_low=0.2, clip_high=0.28, agg_mode=agg_mode, max_tokens=6)
    results = []
    for fill in (0.0, 123.0, NAN, float("-inf")):
        lp = torch.where(mask, base, _t(fill)).requires_grad_(True)
        o = torch.where(mask, old, _t(-fill if fill == fill else fill))
        loss, m = get_policy_loss(name)(lp, o, adv, mask, **kw)
        results.append((loss.detach(), _grad(loss, lp), m))
    for loss, g, m in results[1:]:
        torch.testing.assert_close(loss, results[0][0])
        torch.testing.assert_close(g, results[0][1])
        assert m == pytest.approx(results[0][2], rel=1e-14)
    assert bool((results[0][1][~mask] == 0).all())


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_all_masked_batch(name):
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    loss, m = get_policy_loss(name)(
        logp,
        torch.zeros(2, 3, dtype=torch.float64),
        _t([1.0, -1.0]),
        torch.zeros(2, 3),
        clip_low=0.2,
        clip_high=0.2,
        agg_mode="token-mean",
    )
    assert loss.item() == 0.0
    assert bool((_grad(loss, logp) == 0).all())
    assert m["loss/clipfrac_low"] == m["loss/clipfrac_high"] == m["loss/approx_kl"] == 0.0
    assert all(math.isnan(m[k]) for k in ("loss/ratio_mean", "loss/ratio_max", "loss/ratio_min"))


# ----------------------------------------------------------------------------------------------------------------
# Loop-based reference twin
# ----------------------------------------------------------------------------------------------------------------


def _ref_policy_loss(name, logp, old, adv, mask, clip_low, clip_high, agg_mode, max_tokens):
    """Scalar loops, one token at a time; autograd through the scalars gives the reference gradient."""
    b, t = logp.shape
    seq_sums, seq_lens = [], []
    clip_hi = clip_lo = 0
    n_tok = 0
    for i in range(b):
        valid = [j for j in range(t) if bool(mask[i, j])]
        if name != "vanilla":
            mean_lr = sum((logp[i, j] - old[i, j] for j in valid), torch.zeros((), dtype=logp.dtype))
            mean_lr = mean_lr / max(len(valid), 1)
        total = torch.zeros((), dtype=logp.dtype)
        for j in valid:
            a = float(adv[i, j]) if adv.dim() == 2 else float(adv[i])
            if name == "vanilla":
                r = torch.exp(logp[i, j] - old[i, j])
            elif name == "gspo":
                r = torch.exp(mean_lr)
            else:
                r = torch.exp(mean_lr.detach() + logp[i, j] - logp[i, j].detach())
            rv = float(r.detach())
            if rv > 1 + clip_high:
                c = torch.tensor(1 + clip_high, dtype=logp.dtype)
            elif rv < 1 - clip_low:
                c = torch.tensor(1 - clip_low, dtype=logp.dtype)
            else:
                c = r
            unclipped, clipped = r * a, c * a
            total = total - (unclipped if float(unclipped.detach()) <= float(clipped.detach()) else clipped)
            clip_hi += a > 0 and rv > 1 + clip_high
            clip_lo += a < 0 and rv < 1 - clip_low
            n_tok += 1
        seq_sums.append(total)
        seq_lens.append(len(valid))
    nonempty = [i for i in range(b) if seq_lens[i] > 0]
    if agg_mode == "token-mean":
        loss = sum(seq_sums, torch.zeros((), dtype=logp.dtype)) / max(n_tok, 1)
    elif agg_mode == "seq-mean-token-mean":
        loss = sum((seq_sums[i] / seq_lens[i] for i in nonempty), torch.zeros((), dtype=logp.dtype))
        loss = loss / max(len(nonempty), 1)
    else:
        loss = sum((seq_sums[i] / max_tokens for i in nonempty), torch.zeros((), dtype=logp.dtype))
        loss = loss / max(len(nonempty), 1)
    return loss, clip_lo / max(n_tok, 1), clip_hi / max(n_tok, 1)


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("seed", range(6))
def test_matches_loop_reference(name, seed):
    rng = np.random.default_rng(100 + seed)
    b, t = int(rng.integers(1, 6)), int(rng.integers(1, 8))
    mask = torch.from_numpy(rng.random((b, t)) < 0.75)
    old = _t(rng.normal(-1.2, 0.6, (b, t)))
    delta = _t(rng.normal(0.0, 0.3, (b, t)))
    token_adv = name != "gspo" and seed % 2 == 1
    adv = _t(rng.normal(0.0, 1.0, (b, t) if token_adv else b))
    clip_low, clip_high = (0.2, 0.28) if name == "vanilla" else (0.03, 0.05)
    for agg_mode in AGG_MODES:
        logp = (old + delta).requires_grad_(True)
        loss, m = get_policy_loss(name)(
            logp, old, adv, mask, clip_low=clip_low, clip_high=clip_high, agg_mode=agg_mode, max_tokens=t + 1
        )
        g = _grad(loss, logp)
        logp_ref = (old + delta).requires_grad_(True)
        ref, ref_lo, ref_hi = _ref_policy_loss(name, logp_ref, old, adv, mask, clip_low, clip_high, agg_mode, t + 1)
        torch.testing.assert_close(loss, ref)
        if ref.requires_grad:
            torch.testing.assert_close(g, _grad(ref, logp_ref))
        else:
            assert bool((g == 0).all())
        assert m["loss/clipfrac_low"] == pytest.approx(ref_lo, abs=1e-15)
        assert m["loss/clipfrac_high"] == pytest.approx(ref_hi, abs=1e-15)


# ----------------------------------------------------------------------------------------------------------------
# KL penalty
# ----------------------------------------------------------------------------------------------------------------


def test_kl_penalty_hand_computed():
    logp = _t([[math.log(0.5), math.log(0.3)]]).requires_grad_(True)
    ref = _t([[math.log(0.25), math.log(0.3)]])
    # k1 = log 0.5 - log 0.25 = log 2; identical log-probs give 0
    torch.testing.assert_close(kl_penalty(logp, ref, "k1"), _t([[math.log(2), 0.0]]))
    k3 = kl_penalty(logp, ref, "k3")
    # k3: d = ref - logp = -log 2 -> e^d - d - 1 = 0.5 + log 2 - 1
    torch.testing.assert_close(k3, _t([[0.5 + math.log(2) - 1, 0.0]]))
    # d k3 / d logp = 1 - e^(ref - logp) = 1 - 0.5
    torch.testing.assert_close(_grad(k3.sum(), logp), _t([[0.5, 0.0]]))


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_kl_penalty_is_unbiased(kind):
    # E_{y ~ pi}[k(y)] = KL(pi || ref) exactly, summing over a small vocabulary instead of sampling
    rng = np.random.default_rng(5)
    pi = rng.dirichlet(np.ones(7))
    ref = rng.dirichlet(np.ones(7))
    per_token = kl_penalty(_t(np.log(pi))[None], _t(np.log(ref))[None], kind)[0].numpy()
    np.testing.assert_allclose((pi * per_token).sum(), (pi * np.log(pi / ref)).sum(), rtol=1e-12)
    if kind == "k3":
        assert (per_token >= 0).all()


def test_kl_penalty_mask_and_validation():
    logp = _t([[-1.0, NAN]])
    ref = _t([[-2.0, float("inf")]])
    out = kl_penalty(logp, ref, "k3", mask=torch.tensor([[1, 0]]))
    torch.testing.assert_close(out, _t([[math.exp(-1.0) + 1.0 - 1.0, 0.0]]))
    with pytest.raises(ValueError, match="logprobs"):
        kl_penalty(logp, ref, "k3")
    with pytest.raises(ValueError, match="ref_logprobs"):
        kl_penalty(_t([[-1.0, -1.0]]), ref, "k1")
    with pytest.raises(ValueError, match="kind"):
        kl_penalty(_t([[-1.0]]), _t([[-1.0]]), "k2")
    with pytest.raises(ValueError, match="ref_logprobs"):
        kl_penalty(_t([[-1.0]]), _t([[-1.0, -1.0]]), "k3")


# ----------------------------------------------------------------------------------------------------------------
# Validation and registry
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_policy_loss_validation(name):
    fn = get_policy_loss(name)
    lp, old, adv, mask = torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3)
    kw = dict(clip_low=0.2, clip_high=0.28, agg_mode="token-mean")

    def call(**over):
        args = dict(logprobs=lp, old_logprobs=old, advantages=adv, mask=mask)
        args.update({k: v for k, v in over.items() if k in args})
        return fn(
            args["logprobs"],
            args["old_logprobs"],
            args["advantages"],
            args["mask"],
            **{**kw, **{k: v for k, v in over.items() if k not in args}},
        )

    call()
    cases = [
        ("old_logprobs", dict(old_logprobs=torch.zeros(2, 4))),
        ("logprobs", dict(logprobs=torch.zeros(6))),
        ("logprobs", dict(logprobs=torch.zeros(2, 3, dtype=torch.long))),
        ("mask", dict(mask=torch.ones(3, 2))),
        ("mask", dict(mask=torch.full((2, 3), 0.5))),
        ("advantages", dict(advantages=torch.zeros(3))),
        ("advantages", dict(advantages=torch.tensor([0.0, NAN]))),
        ("logprobs", dict(logprobs=torch.tensor([[0.0, NAN, 0.0], [0.0, 0.0, 0.0]]))),
        ("old_logprobs", dict(old_logprobs=torch.tensor([[0.0, 0.0, 0.0], [float("inf"), 0.0, 0.0]]))),
        ("clip_low", dict(clip_low=1.0)),
        ("clip_low", dict(clip_low=-0.1)),
        ("clip_high", dict(clip_high=-0.1)),
        ("clip_high", dict(clip_high=float("nan"))),
        ("agg_mode", dict(agg_mode="sum")),
        ("max_tokens", dict(agg_mode="seq-mean-token-sum-norm")),
    ]
    for arg, over in cases:
        with pytest.raises(ValueError, match=arg):
            call(**over)


def test_ratio_overflow_is_reported():
    lp = torch.zeros(1, 2)
    old = torch.tensor([[0.0, -200.0]])  # exp(200) overflows float32
    with pytest.raises(ValueError, match="overflows"):
        get_policy_loss("vanilla")(
            lp, old, torch.ones(1), torch.ones(1, 2), clip_low=0.2, clip_high=0.2, agg_mode="token-mean"
        )


def _kinds(fn) -> list[tuple[str, str]]:
    return [(p.name, p.kind.name) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_policy_loss_signature_is_the_documented_one(name):
    # docs/design.md: fn(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, agg_mode,
    #                    global_tokens=None, global_seqs=None, max_tokens=None)
    pos, kw = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
    assert _kinds(get_policy_loss(name)) == [
        ("logprobs", pos),
        ("old_logprobs", pos),
        ("advantages", pos),
        ("mask", pos),
        ("clip_low", kw),
        ("clip_high", kw),
        ("agg_mode", kw),
        ("global_tokens", kw),
        ("global_seqs", kw),
        ("max_tokens", kw),
    ]
    # all by keyword works; the clip range passed positionally is refused
    z = torch.zeros(1, 1)
    loss, _ = get_policy_loss(name)(
        logprobs=z,
        old_logprobs=z,
        advantages=torch.ones(1),
        mask=torch.ones(1, 1),
        clip_low=0.2,
        clip_high=0.2,
        agg_mode="token-mean",
    )
    assert loss.item() == -1.0  # r = 1, A = 1: -min(1, 1) over 1 token
    with pytest.raises(TypeError):
        get_policy_loss(name)(z, z, torch.ones(1), torch.ones(1, 1), 0.2, 0.2, "token-mean")


def test_aggregate_loss_and_kl_penalty_signatures_are_the_documented_ones():
    # docs/design.md: aggregate_loss(loss_mat, mask, agg_mode, *, global_tokens=None, global_seqs=None,
    # max_tokens=None); kl_penalty(logprobs, ref_logprobs, kind="k3"|"k1") with the optional mask by keyword only
    pos, kw = "POSITIONAL_OR_KEYWORD", "KEYWORD_ONLY"
    assert _kinds(aggregate_loss) == [
        ("loss_mat", pos),
        ("mask", pos),
        ("agg_mode", pos),
        ("global_tokens", kw),
        ("global_seqs", kw),
        ("max_tokens", kw),
    ]
    assert _kinds(kl_penalty) == [("logprobs", pos), ("ref_logprobs", pos), ("kind", pos), ("mask", kw)]


def test_registry():
    assert set(LOSS_NAMES) <= set(POLICY_LOSSES)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("vanilla")(lambda *a, **k: None)
    with pytest.raises(ValueError, match="gspo, gspo_token, vanilla"):
        get_policy_loss("ppo")
    with pytest.raises(ValueError, match="name"):
        register_policy_loss("")


def test_register_new_loss():
    name = "_test_only_reinforce"

    @register_policy_loss(name)
    def reinforce(logprobs, old_logprobs, advantages, mask, *, clip_low, clip_high, agg_mode, **kw):
        return aggregate_loss(-logprobs * advantages[:, None], mask, agg_mode, **kw), {}

    try:
        loss, _ = get_policy_loss(name)(
            _t([[-1.0, -2.0]]),
            _t([[0.0, 0.0]]),
            _t([2.0]),
            torch.ones(1, 2),
            clip_low=0.2,
            clip_high=0.2,
            agg_mode="token-mean",
        )
        # -(-1 * 2 + -2 * 2) / 2 = 3
        torch.testing.assert_close(loss, _t(3.0))
    finally:
        POLICY_LOSSES.pop(name)
