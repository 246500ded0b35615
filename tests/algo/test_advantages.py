"""Tests of xrpo.algo.advantages: GRPO advantage (Section 2.1), XRPO Section 3.3, Eqs. (4)-(6), and the registry of
advantage kinds."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from numpy.testing import assert_allclose, assert_array_equal

from xrpo.algo.advantages import (
    ADVANTAGES,
    get_advantage,
    group_advantages,
    length_normalized_loglik,
    novelty,
    register_advantage,
    sharpen_advantages,
)
from xrpo.algo.tree import TreeStructure, global_whiten, tree_advantages

# "torch": CPU tensors in (verl's integration passes them), numpy arrays out with the same numbers
BACKENDS = ["numpy", "torch"]

# ---------------------------------------------------------------------------------------------------------------
# slow reference twins: one group / row / rollout at a time
# ---------------------------------------------------------------------------------------------------------------


def ref_group_advantages(rewards, group_ids, scale="std", eps=1e-6):
    r = np.asarray(rewards, float)
    g = np.asarray(group_ids)
    out = np.zeros_like(r)
    for gid in set(g.tolist()):
        idx = [i for i in range(len(r)) if g[i] == gid]
        vals = [r[i] for i in idx]
        mu = sum(vals) / len(vals)
        sigma = math.sqrt(sum((v - mu) ** 2 for v in vals) / (len(vals) - 1)) if len(vals) > 1 else 0.0
        for i in idx:
            if scale == "none":
                out[i] = r[i] - mu
            else:
                out[i] = (r[i] - mu) / (sigma + eps) if sigma > 0 else 0.0
    return out


def ref_length_normalized_loglik(lp, mask):
    lp, mask = np.asarray(lp, float), np.asarray(mask)
    out = np.empty(lp.shape[0])
    for b in range(lp.shape[0]):
        toks = [lp[b, t] for t in range(lp.shape[1]) if mask[b, t]]
        out[b] = sum(toks) / len(toks)
    return out


def ref_novelty(scores, group_ids):
    s = np.asarray(scores, float)
    g = np.asarray(group_ids)
    out = np.empty_like(s)
    for i in range(len(s)):
        members = [s[j] for j in range(len(s)) if g[j] == g[i]]
        out[i] = math.exp(s[i] - sum(members) / len(members))
    return out


def ref_sharpen(adv, rewards, scores, group_ids, lam_nov=2.5, kappa_clip=0.5, full_reward=1.0):
    eta = ref_novelty(scores, group_ids)
    out = np.asarray(adv, float).copy()
    for i in range(len(out)):
        if rewards[i] >= full_reward:
            out[i] = adv[i] + min(max(lam_nov * (1 - eta[i]), 0.0), kappa_clip * adv[i])
    return out


def random_groups(rng, n_groups):
    """Unsorted, non-contiguous ids; sizes 1..12 (size 1 included)."""
    sizes = rng.integers(1, 13, size=n_groups)
    ids = rng.choice(np.arange(-1000, 1000), size=n_groups, replace=False)
    g = np.repeat(ids, sizes)
    return g[rng.permutation(len(g))]


def as_backend(x, backend, dtype=None):
    if backend == "numpy":
        return np.asarray(x, dtype=dtype)
    return torch.from_numpy(np.array(x, dtype=dtype))


def to_np(x):
    assert isinstance(x, np.ndarray), type(x)  # one backend: numpy out, whatever went in
    return x


# ---------------------------------------------------------------------------------------------------------------
# group_advantages
# ---------------------------------------------------------------------------------------------------------------

# three groups with unsorted, non-contiguous ids:
#   id 5: [1, 0, 1, 1] mean .75, deviations [.25, -.75, .25, .25], sum sq .75, var .75/3 = .25, sigma .5
#   id 2: [0, 0]      sigma 0 -> A = 0
#   id 9: [0, 1]      mean .5, deviations [-.5, .5], sum sq .5, var .5, sigma 0.7071067812
HAND_R = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
HAND_G = [5, 5, 2, 9, 5, 2, 5, 9]


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_advantages_hand(backend):
    r, g = as_backend(HAND_R, backend, np.float64), as_backend(HAND_G, backend)
    # eps = 0: A = dev / sigma = [.5, -1.5, 0, .7071, .5, 0, .5, -.7071]
    s2 = 1 / math.sqrt(2)
    assert_allclose(to_np(group_advantages(r, g, eps=0.0)), [0.5, -1.5, 0, s2, 0.5, 0, 0.5, -s2], rtol=1e-15)
    # eps = 1e-6: .25 / .500001 = 0.4999990000, .5 / (0.7071067812 + 1e-6) = 0.7071057812
    assert_allclose(
        to_np(group_advantages(r, g)),
        [0.499999, -1.499997, 0, 0.7071057812, 0.499999, 0, 0.499999, -0.7071057812],
        rtol=1e-9,
    )
    # Dr. GRPO: just the deviations
    assert_allclose(to_np(group_advantages(r, g, scale="none")), [0.25, -0.75, 0, 0.5, 0.25, 0, 0.25, -0.5])


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_advantages_all_equal_and_singletons_are_exactly_zero(backend):
    # 0.1 is not a dyadic number: a naive mean gives 0.1 + 1e-17 and A ~ 1e-11 with eps=1e-6; here it is exactly 0
    r = as_backend([0.1, 0.1, 0.1, 0.7, 0.3], backend, np.float64)
    g = as_backend([1, 1, 1, 2, 3], backend)
    for eps in (1e-6, 0.0):
        for scale in ("std", "none"):
            # and quietly: no 0/0 (a singleton group's n - 1 = 0 degrees of freedom) behind the exact 0
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                a = group_advantages(r, g, scale=scale, eps=eps)
            assert np.all(to_np(a) == 0.0)
            assert not caught, [str(w.message) for w in caught]


def test_group_advantages_types_and_dtypes():
    r = [1, 0, 1, 1]
    g = [0, 0, 1, 1]
    # numpy: int rewards -> float64; float32 stays float32
    assert group_advantages(np.array(r), g).dtype == np.float64
    assert group_advantages(np.array(r, np.float32), g).dtype == np.float32
    # CPU tensors: numpy out, dtype kept; group ids may be numpy
    t = group_advantages(torch.tensor(r, dtype=torch.float32), np.array(g))
    assert isinstance(t, np.ndarray) and t.dtype == np.float32
    # a tensor numpy cannot view is refused with its name, not deep inside numpy
    with pytest.raises(ValueError, match="rewards must be a numeric array"):
        group_advantages(torch.tensor([1.0, 0.0, 1.0], dtype=torch.bfloat16), [0, 0, 0])
    with pytest.raises(ValueError, match="rewards must be a numeric array"):
        group_advantages(torch.tensor([1.0, 0.0], requires_grad=True), [0, 0])
    # plain lists are accepted and give numpy
    assert isinstance(group_advantages(r, g), np.ndarray)
    # no rollouts at all
    assert group_advantages(np.zeros(0), np.zeros(0, dtype=int)).shape == (0,)
    # scale and eps are keyword-only: a third positional argument is refused
    with pytest.raises(TypeError):
        group_advantages(r, g, "none")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "ids",
    [
        np.array([127, -128, 127, -128, 0], dtype=np.int8),  # full int8 range: offsets must not wrap
        np.array([2**62, -(2**62), 5, 2**62, 5], dtype=np.int64),  # sparse ids: the np.unique path
        np.array([2**63, 3, 2**63, 3, 7], dtype=np.uint64),
        np.array([4, 4, 4, 4, 4], dtype=np.int16),
    ],
)
def test_group_ids_of_any_integer_dtype_and_range(backend, ids):
    r = np.array([1.0, 0.0, 0.0, 0.0, 1.0])
    s = np.array([-1.0, -2.0, -0.5, -0.7, -3.0])
    got = group_advantages(as_backend(r, backend), as_backend(ids, backend))
    assert_allclose(to_np(got), ref_group_advantages(r, ids), rtol=1e-12)
    assert_allclose(to_np(novelty(as_backend(s, backend), as_backend(ids, backend))), ref_novelty(s, ids), rtol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "rewards, group_ids, kwargs, match",
    [
        ([1.0, np.nan], [0, 0], {}, r"rewards must be finite.*index 1"),
        ([1.0, np.inf], [0, 0], {}, r"rewards must be finite"),
        ([1.0, 0.0, 1.0], [0, 0], {}, r"group_ids has 2 entries, expected 3"),
        ([1.0, 0.0], [0.0, 0.5], {}, "group_ids must be integers"),
        ([[1.0, 0.0]], [0, 0], {}, r"rewards must be 1-D"),
        ([1.0, 0.0], [0, 0], dict(scale="mad"), r"scale must be one of \['std', 'none'\]"),
        ([1.0, 0.0], [0, 0], dict(eps=-1.0), "eps must be"),
    ],
)
def test_group_advantages_bad_input(backend, rewards, group_ids, kwargs, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(as_backend(rewards, backend, np.float64), as_backend(group_ids, backend), **kwargs)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "backend, dtype, rtol", [(b, dt, tol) for dt, tol in ((np.float64, 1e-12), (np.float32, 1e-6)) for b in BACKENDS]
)
def test_group_advantages_matches_reference(seed, backend, dtype, rtol):
    rng = np.random.default_rng(seed)
    g = random_groups(rng, int(rng.integers(1, 40)))
    r = (rng.random(len(g)) < 0.4).astype(float) if seed % 2 else rng.normal(3.0, 2.0, len(g))
    r = r.astype(dtype)
    for scale in ("std", "none"):
        got = group_advantages(as_backend(r, backend), as_backend(g, backend), scale=scale)
        want = ref_group_advantages(r.astype(float), g, scale=scale)
        assert to_np(got).dtype == dtype
        assert_allclose(to_np(got), want, rtol=rtol, atol=rtol * 1e-3)


# ---------------------------------------------------------------------------------------------------------------
# Eq. (4): length_normalized_loglik
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_length_normalized_loglik_hand(backend):
    lp = [
        [-1.0, -2.0, -3.0, 0.0],  # 3 tokens: (-1 - 2 - 3) / 3 = -2
        [-0.5, np.nan, -np.inf, 7.0],  # 1 token; masked-out positions may hold anything: -0.5
        [-0.1, -0.3, -0.2, -0.4],  # 4 tokens: -1.0 / 4 = -0.25
        [-0.05, 0.0, 0.0, 0.0],  # the model emitted EOS at once: |y| = 1 (the EOS token): -0.05
    ]
    mask = [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    want = [-2.0, -0.5, -0.25, -0.05]
    for m in (
        as_backend(mask, backend, bool),
        as_backend(mask, backend, np.int64),
        as_backend(mask, backend, np.float32),
    ):
        out = length_normalized_loglik(as_backend(lp, backend, np.float64), m)
        assert_allclose(to_np(out), want, rtol=1e-15)


def test_length_normalized_loglik_types():
    rng = np.random.default_rng(0)
    lp = -rng.random((6, 9)).astype(np.float32)
    mask = rng.random((6, 9)) < 0.7
    mask[:, 0] = True
    want = ref_length_normalized_loglik(lp, mask)
    out = length_normalized_loglik(lp, mask)
    assert out.dtype == np.float32
    assert_allclose(out, want, rtol=1e-6)
    # CPU tensors (verl's path): the same numbers, numpy out
    t = length_normalized_loglik(torch.from_numpy(lp), torch.from_numpy(mask))
    assert isinstance(t, np.ndarray) and t.dtype == np.float32
    assert_array_equal(t, out)
    # tensors numpy cannot view are refused by name
    for bad in (torch.from_numpy(lp).to(torch.bfloat16), torch.from_numpy(lp).requires_grad_(True)):
        with pytest.raises(ValueError, match="token_logprobs and mask must be rectangular"):
            length_normalized_loglik(bad, torch.from_numpy(mask))


def test_length_normalized_loglik_float16_and_overflow():
    # float16 (summed in float32, returned as float16): row sums [-3, -1.5, -4] over [2, 3, 1] tokens
    # -> s = [-1.5, -0.5, -4] (all exact in float16); 3 x 3 so that a sum over the wrong axis has the right shape
    lp = np.array([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5], [-4.0, 0.0, 0.0]], dtype=np.float16)
    mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=bool)
    out = length_normalized_loglik(lp, mask)
    assert out.dtype == np.float16
    assert_array_equal(out, [-1.5, -0.5, -4.0])
    # finite log-probs whose float32 sum overflows (-3e38 * 2 < -3.4e38): a ValueError that says so
    with np.errstate(over="ignore"), pytest.raises(Exception) as exc:
        length_normalized_loglik(np.array([[-3e38, -3e38]], dtype=np.float32), np.ones((1, 2), dtype=bool))
    assert exc.type is ValueError and "sum of a row overflowed" in str(exc.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_length_normalized_loglik_bad_input(backend):
    def run(lp, mask):
        lp = np.asarray(lp, float)
        if backend == "numpy":
            return length_normalized_loglik(lp, np.asarray(mask))
        return length_normalized_loglik(torch.tensor(lp), torch.tensor(np.asarray(mask)))

    with pytest.raises(ValueError, match=r"mask row 1 has no token.*EOS token counts"):
        run([[-1.0, -1.0], [-1.0, -1.0]], [[True, False], [False, False]])
    with pytest.raises(ValueError, match=r"row 0, token 1 is not"):
        run([[-1.0, np.nan], [-1.0, -1.0]], [[True, True], [True, False]])
    with pytest.raises(ValueError, match=r"row 1, token 0 is not"):
        run([[-1.0, -1.0], [-np.inf, -1.0]], [[True, True], [True, False]])
    with pytest.raises(ValueError, match="mask must be bool or hold only 0 and 1"):
        run([[-1.0, -1.0]], [[1.0, 0.5]])
    with pytest.raises(ValueError, match=r"mask must have the shape of token_logprobs \(1, 2\)"):
        run([[-1.0, -1.0]], [[True, True, True]])
    with pytest.raises(ValueError, match=r"token_logprobs must be 2-D"):
        run([-1.0, -1.0], [True, True])
    if backend == "numpy":
        with pytest.raises(ValueError, match="must be rectangular"):
            length_normalized_loglik([[-1.0, -1.0], [-1.0]], [[True, True], [True]])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("backend", BACKENDS)
def test_length_normalized_loglik_matches_reference(seed, backend):
    rng = np.random.default_rng(seed)
    B, T = int(rng.integers(1, 30)), int(rng.integers(1, 70))
    lp = np.log(rng.random((B, T)))
    mask = rng.random((B, T)) < rng.uniform(0.1, 1.0)
    mask[np.arange(B), rng.integers(0, T, B)] = True  # at least one token per row
    lp[~mask & (rng.random((B, T)) < 0.3)] = np.nan  # garbage where masked out
    want = ref_length_normalized_loglik(np.where(mask, lp, 0.0), mask)
    if backend == "numpy":
        got = length_normalized_loglik(lp, mask)
    else:
        got = to_np(length_normalized_loglik(torch.tensor(lp), torch.tensor(mask)))
    assert_allclose(got, want, rtol=1e-13)


# ---------------------------------------------------------------------------------------------------------------
# Eq. (5): novelty
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_novelty_hand(backend):
    # group 7: scores [-1, -2, -3], mean -2 -> eta = [e^1, e^0, e^-1] = [2.7182818285, 1, 0.3678794412]
    # group 3: one rollout -> eta = 1; group 4: equal scores (-0.1) -> eta = 1 exactly
    s = as_backend([-1.0, -0.3, -2.0, -0.1, -3.0, -0.1], backend, np.float64)
    g = as_backend([7, 3, 7, 4, 7, 4], backend)
    eta = to_np(novelty(s, g))
    assert_allclose(eta, [2.7182818285, 1.0, 1.0, 1.0, 0.3678794412, 1.0], rtol=1e-10)
    assert eta[1] == 1.0 and eta[3] == 1.0 and eta[5] == 1.0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("backend", BACKENDS)
def test_novelty_matches_reference(seed, backend):
    rng = np.random.default_rng(seed)
    g = random_groups(rng, int(rng.integers(1, 40)))
    s = np.log(rng.random(len(g))) * rng.uniform(0.1, 3)
    got = to_np(novelty(as_backend(s, backend), as_backend(g, backend)))
    assert_allclose(got, ref_novelty(s, g), rtol=1e-13)


@pytest.mark.parametrize("backend", BACKENDS)
def test_novelty_bad_input(backend):
    with pytest.raises(ValueError, match=r"scores must be finite.*index 0"):
        novelty(as_backend([np.nan, 1.0], backend, np.float64), as_backend([0, 0], backend))
    with pytest.raises(ValueError, match=r"group_ids has 1 entries, expected 2"):
        novelty(as_backend([0.0, 1.0], backend, np.float64), as_backend([0], backend))


# ---------------------------------------------------------------------------------------------------------------
# Eq. (6): sharpen_advantages
# ---------------------------------------------------------------------------------------------------------------

# one group, rewards [1, 1, 0, 0], GRPO advantages with eps = 0: mean .5, sum sq 1, var 1/3, sigma .5773502692
#   -> A = [.8660254038, .8660254038, -.8660254038, -.8660254038]
# scores [-0.5, -1.5, -1, -1]: mean -1 -> eta = [e^.5, e^-.5, 1, 1] = [1.6487212707, 0.6065306597, 1, 1]
SH_R = [1.0, 1.0, 0.0, 0.0]
SH_S = [-0.5, -1.5, -1.0, -1.0]
SH_G = [0, 0, 0, 0]
SQ3_2 = math.sqrt(3) / 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_sharpen_hand(backend):
    r, s, g = (as_backend(x, backend, dt) for x, dt in ((SH_R, np.float64), (SH_S, np.float64), (SH_G, None)))
    a = group_advantages(r, g, eps=0.0)
    assert_allclose(to_np(a), [SQ3_2, SQ3_2, -SQ3_2, -SQ3_2], rtol=1e-15)
    # rollout 0: eta > 1 -> max(2.5 (1 - 1.6487), 0) = 0 -> unchanged
    # rollout 1: lam (1 - eta) = 2.5 * 0.3934693403 = 0.9836733508; kappa A = .5 * .8660254038 = .4330127019
    #            -> bonus = min(.98367, .43301) = .4330127019 (clipped) -> A+ = 1.2990381057
    # rollouts 2, 3: reward 0 < 1 -> unchanged
    out, m = sharpen_advantages(a, r, s, g)
    assert_allclose(to_np(out), [SQ3_2, 1.2990381057, -SQ3_2, -SQ3_2], rtol=1e-10)
    assert m["adv/sharpen_eligible"] == 2.0 and m["adv/sharpened_count"] == 1.0
    assert m["adv/negative_bonus_count"] == 0.0
    assert_allclose([m["adv/mean_bonus"], m["adv/max_bonus"]], [0.4330127019, 0.4330127019], rtol=1e-10)
    # mean eta over the two correct rollouts: (1.6487212707 + 0.6065306597) / 2 = 1.1276259652
    assert_allclose(m["adv/mean_novelty"], 1.1276259652, rtol=1e-10)
    # lam_nov = 0.5: 0.5 * 0.3934693403 = 0.1967346701 < .4330127019 -> not clipped: A+ = 1.0627600739
    out, m = sharpen_advantages(a, r, s, g, lam_nov=0.5)
    assert_allclose(to_np(out), [SQ3_2, 1.0627600739, -SQ3_2, -SQ3_2], rtol=1e-10)
    assert_allclose(m["adv/mean_bonus"], 0.1967346701, rtol=1e-9)
    # kappa = 0 or lam = 0 switch sharpening off
    for kw in (dict(kappa_clip=0.0), dict(lam_nov=0.0)):
        out, m = sharpen_advantages(a, r, s, g, **kw)
        assert_array_equal(to_np(out), to_np(a))
        assert m["adv/sharpened_count"] == 0.0 and m["adv/mean_bonus"] == 0.0


@pytest.mark.parametrize("backend", BACKENDS)
def test_sharpen_edge_cases(backend):
    def run(a, r, s, g, **kw):
        out, m = sharpen_advantages(
            *(as_backend(x, backend, np.float64) for x in (a, r, s)), as_backend(g, backend), **kw
        )
        return to_np(out), m

    # all-correct group: GRPO gives A = 0, so kappa * A = 0 caps the bonus at 0, however novel the rollout
    out, m = run([0.0, 0.0], [1.0, 1.0], [-0.1, -3.0], [1, 1])
    assert_array_equal(out, [0.0, 0.0])
    assert m["adv/sharpened_count"] == 0.0 and m["adv/sharpen_eligible"] == 2.0
    # eta = 1 (equal scores): lam (1 - 1) = 0 -> no bonus
    out, m = run([0.7, -0.7], [1.0, 0.0], [-0.4, -0.4], [3, 3])
    assert_array_equal(out, [0.7, -0.7])
    # a correct rollout with A < 0 (a reward above full_reward exists): literal Eq. (6) gives min(., kappa A) =
    # kappa A -> A+ = (1 + .5) * -0.7071 = -1.0606601718, although eta = 1 here
    a = [-1 / math.sqrt(2), 1 / math.sqrt(2)]
    out, m = run(a, [1.0, 1.5], [-1.0, -1.0], [0, 0])
    assert_allclose(out, [-1.0606601718, 1 / math.sqrt(2)], rtol=1e-10)
    assert m["adv/negative_bonus_count"] == 1.0 and m["adv/sharpened_count"] == 0.0
    assert m["adv/max_bonus"] == 0.0  # the reward-1.5 rollout is eligible too, with bonus min(0, .3536) = 0
    # no correct rollout at all; and no rollout at all
    out, m = run([0.5, -0.5], [0.0, 0.5], [-1.0, -2.0], [0, 0])
    assert_array_equal(out, [0.5, -0.5])
    assert m == {
        "adv/sharpen_eligible": 0.0,
        "adv/sharpened_count": 0.0,
        "adv/negative_bonus_count": 0.0,
        "adv/mean_bonus": 0.0,
        "adv/max_bonus": 0.0,
        "adv/mean_novelty": 1.0,
    }
    out, m = run([], [], [], np.zeros(0, dtype=np.int64))
    assert out.shape == (0,) and m["adv/sharpen_eligible"] == 0.0
    # full_reward is a threshold: reward 0.9 with full_reward 0.8 counts
    out, _ = run([0.5, -0.5], [0.9, 0.0], [-2.0, -1.0], [0, 0], full_reward=0.8)
    assert out[0] == pytest.approx(0.75)  # kappa A = .25 < 2.5 (1 - e^-.5) = .9837 -> .5 + .25
    # the defaults (lam_nov 2.5, kappa_clip .5, full_reward 1) with a bonus below the clip: scores [-1, -.9], mean
    # -.95, eta_0 = exp(-.05) = 0.9512294245; 2.5 * (1 - eta_0) = 0.1219264387 < .5 * .7071067812 = .3535533906
    # -> A+ = .7071067812 + .1219264387 = 0.8290332199
    out, _ = run([1 / math.sqrt(2), -1 / math.sqrt(2)], [1.0, 0.0], [-1.0, -0.9], [0, 0])
    assert_allclose(out, [0.8290332199, -1 / math.sqrt(2)], rtol=1e-10)
    # advantages that are not GRPO's (allowed): every eligible rollout has A < 0, so every bonus is kappa A < 0 and
    # max_bonus is the largest of them, not the 0 of the ineligible rollout: bonuses .5 * [-.4, -.2] = [-.2, -.1]
    out, m = run([-0.4, -0.2, 0.6], [1.0, 1.0, 0.0], [-1.0, -2.0, -3.0], [0, 0, 0])
    assert_allclose(out, [-0.6, -0.3, 0.6], rtol=1e-15)
    assert m["adv/max_bonus"] == -0.1 and m["adv/negative_bonus_count"] == 2.0
    # two sharpened rollouts: scores [-1, -1, -.7], mean -.9, eta = exp(-.1) = 0.9048374180 for both;
    # 2.5 * (1 - eta) = 0.2379064549 < .5 * .5 = .25 -> both get 0.2379064549; mean_bonus = 2 * 0.2379064549 / 2
    out, m = run([0.5, 0.5, -1.0], [1.0, 1.0, 0.0], [-1.0, -1.0, -0.7], [0, 0, 0])
    assert_allclose(out, [0.7379064549, 0.7379064549, -1.0], rtol=1e-10)
    assert m["adv/sharpened_count"] == 2.0
    assert_allclose([m["adv/mean_bonus"], m["adv/max_bonus"]], [0.2379064549, 0.2379064549], rtol=1e-9)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sharpen_overflowing_novelty_stays_finite(backend):
    # scores 2000 nats apart: eta_0 = exp(1000) = inf. With lam_nov = 0 a literal lam * (1 - eta) = 0 * -inf = NaN;
    # the bonus must stay 0 (and with lam_nov > 0 it is max(-inf, 0) = 0 as well)
    a, r = as_backend([0.5, -0.5], backend, np.float64), as_backend([1.0, 0.0], backend, np.float64)
    s, g = as_backend([0.0, -2000.0], backend, np.float64), as_backend([0, 0], backend)
    with np.errstate(over="ignore"):
        for lam in (0.0, 2.5):
            out, m = sharpen_advantages(a, r, s, g, lam_nov=lam)
            assert_array_equal(to_np(out), [0.5, -0.5])
            assert m["adv/mean_bonus"] == 0.0


def test_sharpen_keeps_dtype_and_mixed_inputs():
    a = torch.tensor([0.5, 0.5, -1.0], dtype=torch.float32)
    out, m = sharpen_advantages(a, np.array([1.0, 1.0, 0.0]), [-0.2, -2.0, -1.0], np.array([4, 4, 4]))
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    assert all(isinstance(v, float) for v in m.values())
    out_np, m_np = sharpen_advantages(a.numpy(), np.array([1.0, 1.0, 0.0]), [-0.2, -2.0, -1.0], [4, 4, 4])
    assert out_np.dtype == np.float32
    assert_array_equal(out, out_np)
    assert m == m_np


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(lam_nov=-1.0), "lam_nov must be a finite number >= 0"),
        (dict(kappa_clip=float("nan")), "kappa_clip"),
        (dict(full_reward=float("inf")), "full_reward"),
        (dict(rewards=[1.0, 0.0, 1.0]), r"rewards has 3 entries, expected 2"),
        (dict(scores=[-1.0, np.nan]), r"scores must be finite.*index 1"),
        (dict(advantages=[np.inf, 0.0]), r"advantages must be finite"),
        (dict(group_ids=[0.5, 0.5]), "group_ids must be integers"),
    ],
)
def test_sharpen_bad_input(backend, kwargs, match):
    args = dict(advantages=[0.5, -0.5], rewards=[1.0, 0.0], scores=[-1.0, -2.0], group_ids=[0, 0])
    kwargs = dict(kwargs)  # parametrize shares the dict between backends
    knobs = {k: kwargs.pop(k) for k in ("lam_nov", "kappa_clip", "full_reward") if k in kwargs}
    args.update(kwargs)
    args = {k: as_backend(v, backend, None if k == "group_ids" else np.float64) for k, v in args.items()}
    with pytest.raises(ValueError, match=match):
        sharpen_advantages(**args, **knobs)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    "backend, dtype, rtol", [(b, dt, tol) for dt, tol in ((np.float64, 1e-12), (np.float32, 1e-6)) for b in BACKENDS]
)
def test_sharpen_matches_reference(seed, backend, dtype, rtol):
    rng = np.random.default_rng(seed)
    g = random_groups(rng, int(rng.integers(1, 40)))
    r = (rng.random(len(g)) < 0.5).astype(float)
    s = np.log(rng.random(len(g))) * 0.5
    a = ref_group_advantages(r, g)
    lam, kappa = float(rng.uniform(0, 5)), float(rng.uniform(0, 1))
    out, m = sharpen_advantages(
        as_backend(a.astype(dtype), backend),
        as_backend(r, backend),
        as_backend(s, backend),
        as_backend(g, backend),
        lam_nov=lam,
        kappa_clip=kappa,
    )
    want = ref_sharpen(a.astype(dtype).astype(float), r, s, g, lam, kappa)
    assert to_np(out).dtype == dtype
    assert_allclose(to_np(out), want, rtol=rtol, atol=rtol * 1e-3)
    bonus = want - a.astype(dtype).astype(float)
    assert m["adv/sharpened_count"] == float(np.sum(bonus > 1e-12))
    assert m["adv/sharpen_eligible"] == float(np.sum(r >= 1.0))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cpu_tensors_give_the_numbers_of_numpy_bit_for_bit(dtype):
    # verl's integration passes CPU tensors (xrpo/integrations/verl/advantage.py): each function must give exactly
    # the numbers it gives on the same values as numpy arrays
    rng = np.random.default_rng(7)
    g = random_groups(rng, 25)
    n = len(g)
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    r = (rng.random(n) < 0.5).astype(np_dtype)
    lp = np.log(rng.random((n, 17))).astype(np_dtype)
    mask = rng.random((n, 17)) < 0.8
    mask[:, 0] = True

    def run(conv):
        a = group_advantages(conv(r), conv(g))
        s = length_normalized_loglik(conv(lp), conv(mask))
        out, m = sharpen_advantages(conv(a), conv(r), conv(s), conv(g), lam_nov=3.0, kappa_clip=0.8)
        return [a, s, novelty(conv(s), conv(g)), out], m

    arrays, m1 = run(lambda x: x)
    tensors, m2 = run(torch.from_numpy)
    for x, y in zip(arrays, tensors):
        assert isinstance(y, np.ndarray) and y.dtype == np_dtype
        assert_array_equal(x, y)
    assert m1 == m2 and m1["adv/sharpened_count"] > 0


# ---------------------------------------------------------------------------------------------------------------
# the registry of advantage kinds
# ---------------------------------------------------------------------------------------------------------------


def test_registry_has_the_kinds_and_names_the_valid_ones():
    assert set(ADVANTAGES) == {"group", "tree"}
    assert get_advantage("group") is ADVANTAGES["group"]
    with pytest.raises(ValueError, match="unknown advantage kind 'gae'; valid names: group, tree"):
        get_advantage("gae")
    with pytest.raises(ValueError, match="'group' is already registered"):
        register_advantage("group")(lambda *a, **k: None)
    with pytest.raises(ValueError, match="non-empty string"):
        register_advantage("")
    assert set(ADVANTAGES) == {"group", "tree"}  # the refused registrations left nothing behind
    for kind in ("group", "tree"):  # scale and tree are keyword-only: a positional scale is refused
        with pytest.raises(Exception) as exc:
            get_advantage(kind)([1.0, 0.0], [0, 0], "none")
        assert exc.type is TypeError


@pytest.mark.parametrize("scale", ["std", "none"])
def test_group_kind_is_group_advantages_plus_summary(scale):
    # HAND_R / HAND_G above, default eps = 1e-6: std -> [.499999, -1.499997, 0, .7071057812, .499999, 0, .499999,
    # -.7071057812]: sum 3 * .499999 - 1.499997 + .7071057812 - .7071057812 = 0; none -> deviations, sum 0
    adv, m = get_advantage("group")(np.array(HAND_R), np.array(HAND_G), scale=scale)
    assert adv.dtype == np.float64
    assert_array_equal(adv, group_advantages(HAND_R, HAND_G, scale=scale))
    # abs mean, std: (3 * .499999 + 1.499997 + 2 * .7071057812) / 8 = 4.4142055624 / 8 = 0.5517756953;
    #           none: (3 * .25 + .75 + 2 * .5) / 8 = 2.5 / 8 = 0.3125
    assert m["adv/abs_mean"] == pytest.approx(0.5517756953 if scale == "std" else 0.3125, rel=1e-9)
    assert m["adv/mean"] == pytest.approx(0.0, abs=1e-15)
    assert set(m) == {"adv/mean", "adv/abs_mean"}
    # the tree structure is not needed, and ignored if given
    tree = TreeStructure(np.arange(8)[:, None], np.ones(8))
    assert_array_equal(get_advantage("group")(HAND_R, HAND_G, scale=scale, tree=tree)[0], adv)


def test_tree_kind_hand():
    # one tree, root 0; leaves 0, 1 under node 1, leaves 2, 3 under node 2; rewards [1, 0, 1, 1]
    #   root mean .75 -> A_root = [.25, -.75, .25, .25]
    #   node 1 mean .5 -> [.5, -.5]; node 2 mean 1 -> [0, 0]
    #   mean over the two depths: [.375, -.625, .125, .125]
    r = np.array([1.0, 0.0, 1.0, 1.0])
    anc = np.array([[0, 1], [0, 1], [0, 2], [0, 2]])
    lengths = np.array([1, 1, 1, 1])
    adv, m = get_advantage("tree")(r, [5, 5, 5, 5], scale="none", tree=TreeStructure(anc, lengths))
    assert_allclose(adv, [0.375, -0.625, 0.125, 0.125], rtol=1e-15)
    assert m["adv/tree_subgroups_mean"] == 2.0 and m["adv/tree_zero_frac"] == 0.0
    assert m["adv/mean"] == 0.0 and m["adv/abs_mean"] == pytest.approx(1.25 / 4)
    # scale="std": TreePO's batch-wide whitening by token counts; equal lengths: mean 0, unbiased variance
    #   (.140625 + .390625 + .015625 + .015625) / 3 = .1875 -> A / sqrt(.1875 + 1e-8)
    adv, m = get_advantage("tree")(r, [5, 5, 5, 5], scale="std", tree=TreeStructure(anc, lengths))
    assert_allclose(adv, np.array([0.375, -0.625, 0.125, 0.125]) / math.sqrt(0.1875 + 1e-8), rtol=1e-14)
    want = global_whiten(tree_advantages(r, anc)[0], lengths)
    assert_array_equal(adv, want)
    assert m["adv/abs_mean"] == pytest.approx(np.abs(want).mean(), rel=1e-15)


def test_tree_kind_bad_input():
    tree = TreeStructure(np.zeros((2, 1), dtype=int), np.ones(2))
    with pytest.raises(ValueError, match=r"advantage kind 'tree' needs tree=TreeStructure"):
        get_advantage("tree")([1.0, 0.0], [0, 0])
    with pytest.raises(ValueError, match=r"scale must be one of \['std', 'none'\]"):
        get_advantage("tree")([1.0, 0.0], [0, 0], scale="mad", tree=tree)
    with pytest.raises(ValueError, match="group_ids has 3 entries, expected 2"):
        get_advantage("tree")([1.0, 0.0], [0, 0, 0], tree=tree)
    with pytest.raises(ValueError, match=r"scale must be one of"):
        get_advantage("group")([1.0, 0.0], [0, 0], scale="mad")
