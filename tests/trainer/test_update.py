"""The policy update's inputs, seen from inside the loss: importance ratios, clipping, temperature, dropout, KL.

The `loss_spy` fixture (tests/trainer/conftest.py) is a policy loss registered through the public registry: it
records what the trainer hands the real "vanilla" loss on every micro-batch and the gradient of the loss with respect
to each token's log-prob. Runs use the ends-with-alnum task of tests/trainer/conftest.py, on
which XRPO seeds ICL prompts from step 2 on.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from xrpo.trainer.config_loader import build_config
from xrpo.trainer.loop import train


def quiet(*_):
    pass


def jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def run(env, spy, out: Path, method: str, steps: int, *extra: str, on_step=None) -> list[dict]:
    """Train with the spy loss; returns the metrics rows (the spy holds the calls)."""
    spy.calls.clear()
    ov = env["learn_overrides"](out, method, steps) + [f"method.policy_loss={spy.name}", *extra]
    train(build_config(None, ov), log=quiet, on_step=on_step)
    return jsonl(out / "metrics.jsonl")


# ------------------------------------------------------------------------------------------------ ratio = 1
def _seeded_moved(report) -> int:
    return sum(x.seeded and x.train_prompt_ids != x.gen_prompt_ids for x in report.plan.records)


@pytest.mark.parametrize("old_logprobs, tol", [("recompute", 0.0), ("auto", 2e-5)])
def test_first_minibatch_ratio_is_one_for_every_rollout_icl_seeded_included(
    trainer_env, loss_spy, tmp_path, old_logprobs, tol
):
    # one mini-batch and one epoch: every token of every rollout is in the step's first (only) mini-batch. "auto"
    # reuses the hf engine's sampling log-probs for rollouts trained under the prompt they were sampled from (equal
    # to a forward pass up to float rounding) and recomputes the ICL-seeded ones under the original prompt
    moved = []
    rows = run(
        trainer_env,
        loss_spy,
        tmp_path / old_logprobs,
        "xrpo",
        4,
        f"optim.old_logprobs={old_logprobs}",
        on_step=lambda rep: moved.append(_seeded_moved(rep)),
    )
    # ICL-seeded rollouts trained under the original prompt are in at least two steps (so also after an update, where
    # their sampling log-probs are under another prompt and must not be reused); how many depends on the device's
    # sampling (CPU: 10 in 3 steps, an H100: 4 in 2), not on what is tested
    assert sum(m > 0 for m in moved) >= 2, moved
    calls = loss_spy.calls
    assert sum(int(c["mask"].any(dim=1).sum()) for c in calls) == sum(r["rollout/count"] for r in rows)
    for c in calls:
        r = loss_spy.ratios(c)
        assert float((r - 1).abs().max()) <= tol, (old_logprobs, float(r.min()), float(r.max()))
    for row in rows:
        assert abs(row["loss/ratio_max"] - 1) <= tol and abs(row["loss/ratio_min"] - 1) <= tol, row
        assert row["loss/clipfrac_low"] == row["loss/clipfrac_high"] == 0.0


# ------------------------------------------------------------------------------------------------ clipping
def test_clipping_binds_exactly_where_the_ratio_leaves_its_bounds(trainer_env, loss_spy, tmp_path):
    # 2 epochs x 2 mini-batches at a large learning rate: after the first optimizer step of a step the ratios move
    # and the clip binds; the first mini-batch of each step is still on-policy
    rows = run(
        trainer_env,
        loss_spy,
        tmp_path / "clip",
        "xrpo-no-icl",
        3,
        "optim.mini_batches=2",
        "optim.ppo_epochs=2",
        "optim.lr=3e-2",
        "optim.old_logprobs=recompute",
    )
    cl, ch = 0.2, 0.28  # the preset's clip_low / clip_high
    clipped = {"low": 0, "high": 0}
    for step, row in zip(loss_spy.steps(len(rows), mini_batches=2, epochs=2), rows):
        # on-policy up to float rounding (a mini-batch's micro-batches are not padded like the recomputation's)
        for c in step[0]:
            assert float((loss_spy.ratios(c) - 1).abs().max()) <= 2e-6
        n_valid = low = high = 0
        every = torch.cat([loss_spy.ratios(c) for mb in step for c in mb])
        # the loss took the same float32 exp of the same tensors: equal, or one ulp apart (2^-23 relative) where a
        # vectorised and a scalar exp kernel meet
        assert (row["loss/ratio_min"], row["loss/ratio_max"]) == pytest.approx(
            (float(every.min()), float(every.max())), rel=2**-23, abs=0
        )
        for mb in step:
            for c in mb:
                assert (c["clip_low"], c["clip_high"]) == (cl, ch)
                m = c["mask"]
                r = torch.exp(c["lp"] - c["old"])
                a = c["adv"][:, None].expand_as(r)
                is_low = m & (a < 0) & (r < 1 - cl)
                is_high = m & (a > 0) & (r > 1 + ch)
                # token-mean over the mini-batch: d loss / d logp_t = -A r_t / N where the clip does not bind, 0 where
                # it binds
                expect = torch.where(is_low | is_high, 0.0, -a * r / c["global_tokens"]) * m
                # autograd forms the same float32 product -A * r * (1/N) in another order: each side is at most three
                # roundings from the exact value, so they differ by at most 6u relative (u = 2^-24); where the clip
                # binds or a position is masked both are exactly 0
                torch.testing.assert_close(c["grad"], expect, rtol=6 * 2**-24, atol=0)
                n_valid += int(m.sum())
                low += int(is_low.sum())
                high += int(is_high.sum())
        # token-weighted float64 mean of per-micro-batch count ratios: a few float64 roundings (~1e-16) of a value <= 1
        assert row["loss/clipfrac_low"] == pytest.approx(low / n_valid, abs=1e-12)
        assert row["loss/clipfrac_high"] == pytest.approx(high / n_valid, abs=1e-12)
        clipped["low"] += low
        clipped["high"] += high
    assert clipped["low"] > 0 and clipped["high"] > 0, clipped  # both bounds were reached in these steps


# ------------------------------------------------------------------------------------------------ temperature
def test_sampling_temperature_is_used_for_old_logprobs_the_policy_forward_and_the_reference(
    trainer_env, loss_spy, tmp_path
):
    from transformers import AutoModelForCausalLM

    T = 0.7
    reports = []
    rows = run(
        trainer_env,
        loss_spy,
        tmp_path / "t",
        "grpo-deepseekmath",
        1,
        f"rollout.temperature={T}",
        on_step=reports.append,
    )
    # old log-probs: log softmax(logits / T) of the initial model under each rollout's training prompt
    model = AutoModelForCausalLM.from_pretrained(trainer_env["model"]).eval()
    (rep,) = reports
    with torch.no_grad():
        for x, old in zip(rep.plan.records[:16], rep.old_logprobs[:16]):
            ids = torch.tensor([x.train_prompt_ids + x.completion_ids])
            logits = model(ids).logits[0, len(x.train_prompt_ids) - 1 : -1]
            want = torch.log_softmax(logits / T, -1).gather(-1, torch.tensor(x.completion_ids)[:, None])[:, 0]
            torch.testing.assert_close(torch.tensor(old), want, rtol=0, atol=2e-5)
    # the policy forward at the same T: the ratio of the (only) mini-batch is 1; the reference (the initial model, at
    # T as well) equals the policy before the first update: KL exactly 0
    for c in loss_spy.calls:
        assert float((loss_spy.ratios(c) - 1).abs().max()) == 0.0
    assert rows[0]["loss/kl"] == 0.0 and rows[0]["loss/recomputed_old_logprobs"] == rows[0]["rollout/count"]


# ------------------------------------------------------------------------------------------------ dropout
def test_dropout_does_not_enter_the_policy_forward(trainer_env, loss_spy, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = trainer_env["model"]
    model = AutoModelForCausalLM.from_pretrained(src, attention_dropout=0.5)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    model.train()
    torch.manual_seed(0)
    noisy = model(ids).logits
    model.eval()
    assert not torch.allclose(noisy, model(ids).logits)  # the model's training mode does change its forward
    dropout_dir = tmp_path / "dropout_model"
    model.save_pretrained(dropout_dir)
    AutoTokenizer.from_pretrained(src).save_pretrained(dropout_dir)
    run(trainer_env, loss_spy, tmp_path / "d", "grpo", 2, f"model.path={dropout_dir}", "optim.old_logprobs=recompute")
    assert loss_spy.calls
    for c in loss_spy.calls:
        assert float((loss_spy.ratios(c) - 1).abs().max()) == 0.0


# ------------------------------------------------------------------------------------------------ KL
def test_kl_term_enters_the_loss_and_holds_the_policy_near_the_reference(trainer_env, loss_spy, tmp_path):
    last_kl = {}
    for beta in (1e-3, 1.0):
        rows = run(trainer_env, loss_spy, tmp_path / f"kl{beta}", "grpo", 6, f"method.kl_coef={beta}")
        for row, step in zip(rows, loss_spy.steps(len(rows))):
            # loss/policy is the policy loss alone: the spy's float32 values of the step's only mini-batch, which the
            # trainer adds up in float64 (in any order, n float64 additions agree to n * 2^-53 * sum |p_i|)
            p = [c["loss"] for c in step[0]]
            assert abs(row["loss/policy"] - sum(p)) <= len(p) * 2**-53 * sum(map(abs, p))
            # loss/total adds beta * KL, but per micro-batch in float32: fl(p_i + fl(b * k_i)) with b = beta rounded
            # to float32, so each term is off by at most u|p_i| + 3u|beta k_i| (u = 2^-24, one rounding each for b,
            # the product and the sum), while loss/policy + beta * loss/kl is formed in float64. The KL terms are
            # k3 estimates (>= 0), so sum |k_i| is loss/kl. The bound scales with sum |p_i|, not with the total:
            # micro-batch losses of both signs cancel (a relative tolerance on the total fails on some machines).
            bound = 2**-24 * (sum(map(abs, p)) + 3 * beta * row["loss/kl"]) + len(p) * 2**-52 * sum(map(abs, p))
            assert abs(row["loss/total"] - (row["loss/policy"] + beta * row["loss/kl"])) <= bound
        assert rows[0]["loss/kl"] == 0.0 and all(r["loss/kl"] > 0 for r in rows[1:])
        last_kl[beta] = rows[-1]["loss/kl"]
    # a 1000x stronger KL term keeps the policy closer to the reference
    assert last_kl[1.0] < 0.5 * last_kl[1e-3], last_kl


def test_without_kl_no_reference_model_is_loaded(trainer_env, loss_spy, tmp_path, monkeypatch):
    import transformers

    loads = []
    real = transformers.AutoModelForCausalLM.from_pretrained.__func__

    def counting(cls, *a, **kw):
        loads.append(a[0] if a else kw.get("pretrained_model_name_or_path"))
        return real(cls, *a, **kw)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", classmethod(counting))
    for beta, n in ((0.0, 1), (0.01, 2)):
        loads.clear()
        rows = run(trainer_env, loss_spy, tmp_path / f"b{beta}", "grpo", 1, f"method.kl_coef={beta}")
        assert len(loads) == n, (beta, loads)
        assert ("loss/kl" in rows[0]) == (beta > 0) and ("loss/total" in rows[0]) == (beta > 0)


# ------------------------------------------------------------------------------------ gradient checkpointing
def _layer_calls(model) -> list[int]:
    calls = [0] * len(model.model.layers)
    for i, layer in enumerate(model.model.layers):
        # a pre-hook: the recomputation stops early (torch raises inside the layer once the last saved tensor is
        # rebuilt), so a forward hook, called at the end, would not see it
        layer.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    return calls


@pytest.mark.parametrize("which", ["tiny", "larger"])
def test_gradient_checkpointing_recomputes_layers_and_keeps_loss_and_gradients(
    tiny_model, tiny_tokenizer, larger_model, which
):
    # float64 copies of one model, one with transformers' checkpointing switched on: the recomputation runs the same
    # kernels on the same inputs, so loss and gradients agree to float64 rounding (1e-12 relative is ~4 orders above
    # it and ~10 below any real difference). The model stays in eval mode, as in the trainer: transformers only
    # checkpoints a layer in training mode, which `checkpointing` provides without putting dropout in train mode.
    import copy

    from xrpo.trainer.logprobs import completion_logprobs
    from xrpo.trainer.update import checkpointing

    base = copy.deepcopy(tiny_model).double() if which == "tiny" else larger_model
    plain, ckpt = copy.deepcopy(base).eval(), copy.deepcopy(base).eval()
    ckpt.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    prompts = [[5, 9, 11, 4], [7], [12, 13, 14, 15, 16, 17], [8, 8], [30, 31, 32]]
    comps = [[20, 21, 22], [23, 24, 25, 26, 27], [28], [40, 41], [50, 51, 52, 53]]
    pad = tiny_tokenizer.pad_token_id
    out = {}
    for name, model, on in (("plain", plain, False), ("ckpt", ckpt, True)):
        calls = _layer_calls(model)
        with checkpointing(model, on):
            lp, mask = completion_logprobs(model, prompts, comps, pad, 0.9)
        loss = (lp * mask).sum() / mask.sum()
        loss.backward()
        out[name] = (loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}, list(calls))
        assert not any(m.training for m in model.modules())  # back in eval mode everywhere
    assert out["plain"][2] == [1] * len(plain.model.layers)
    assert out["ckpt"][2] == [2] * len(ckpt.model.layers)  # forward, then recomputed in the backward pass
    assert out["ckpt"][0] == pytest.approx(out["plain"][0], rel=1e-12)
    for n, g in out["plain"][1].items():
        assert ((out["ckpt"][1][n] - g).norm() / g.norm().clamp_min(1e-300)).item() < 1e-12, n


def test_trainer_with_checkpointing_trains_the_same_weights_and_chunks_reach_the_update(
    trainer_env, loss_spy, tmp_path, monkeypatch
):
    # float32, same kernels: gradient checkpointing recomputes exactly, so two steps give the same weights bit for
    # bit. Chunked log-probs equal the full forward to float rounding (test_logprobs); AdamW's normalised steps turn
    # rounding noise in near-zero gradients (k_proj's bias gets none at all in exact arithmetic) into lr-sized moves,
    # so their runs are compared on the first step's loss (same rollouts, same log-probs to rounding: 1e-5 relative
    # is ~50x float32 rounding over these few hundred tokens) and on what reached the update.
    from safetensors.torch import load_file

    import xrpo.trainer.logprobs as lpm

    def weights(out):
        return load_file(str(out / "checkpoints" / "step-00000002" / "model" / "model.safetensors"))

    plain = run(trainer_env, loss_spy, tmp_path / "plain", "grpo", 2)
    run(trainer_env, loss_spy, tmp_path / "ckpt", "grpo", 2, "model.gradient_checkpointing=true")
    init = load_file(str(trainer_env["model"] / "model.safetensors"))
    a, b = weights(tmp_path / "plain"), weights(tmp_path / "ckpt")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], init[k]) for k in a)  # the runs trained

    rows = []
    real = lpm._chunk_logprobs
    monkeypatch.setattr(lpm, "_chunk_logprobs", lambda h, *x: rows.append(h.shape[0]) or real(h, *x))
    chunked = run(trainer_env, loss_spy, tmp_path / "chunk", "grpo", 2, "optim.logprob_chunk_tokens=5")
    assert rows and max(rows) == 5
    assert chunked[0]["loss/policy"] == pytest.approx(plain[0]["loss/policy"], rel=1e-5, abs=1e-9)


# ------------------------------------------------------------------------------------------ mixed precision
def _changed_share(out, trainer_env) -> tuple[float, set]:
    from safetensors.torch import load_file

    init = load_file(str(trainer_env["model"] / "model.safetensors"))
    after = load_file(str(out / "checkpoints" / "step-00000001" / "model" / "model.safetensors"))
    # against the initial weights as loaded in the run's dtype (bfloat16 master weights start rounded)
    changed = sum(int((after[k] != init[k].to(after[k].dtype)).sum()) for k in init)
    return changed / sum(v.numel() for v in init.values()), {str(v.dtype) for v in after.values()}


def test_bfloat16_compute_keeps_float32_master_weights_so_small_updates_land(trainer_env, loss_spy, tmp_path):
    # one AdamW step at the paper's lr 2e-6 moves every weight with a gradient by ~2e-6, about 1e-4 of a typical
    # weight of this model (~0.02): representable in float32 (eps 1.2e-7), far below bfloat16's resolution (2^-8
    # relative). Mixed precision (bf16 compute, float32 master weights) keeps them; bf16 master weights lose them.
    common = ["optim.lr=2e-6", "model.dtype=bfloat16"]
    run(trainer_env, loss_spy, tmp_path / "mixed", "grpo", 1, *common)
    run(trainer_env, loss_spy, tmp_path / "pure", "grpo", 1, *common, "model.master_dtype=bfloat16")
    mixed, mixed_dtypes = _changed_share(tmp_path / "mixed", trainer_env)
    pure, pure_dtypes = _changed_share(tmp_path / "pure", trainer_env)
    assert mixed_dtypes == {"torch.float32"} and pure_dtypes == {"torch.bfloat16"}
    assert mixed > 0.9, mixed
    assert pure < 0.1, pure


def test_mixed_precision_forwards_compute_in_bfloat16(tiny_model):
    import copy

    from xrpo.trainer.update import Policy

    model = copy.deepcopy(tiny_model)
    policy = Policy(model, None, None, 0, autocast_dtype=torch.bfloat16)
    with torch.no_grad(), policy.compute():
        logits = model(torch.tensor([[5, 6, 7]])).logits
    assert logits.dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32


# ------------------------------------------------------------------------------------------ zero advantages
def _update_arms(tiny_model, tiny_tokenizer, *, kl: bool):
    """A policy after one real optimizer step (AdamW's moments non-zero, weight decay on), its batch of 6 rollouts,
    and the config of a zero-advantage step of 2 epochs x 2 mini-batches."""
    import copy

    from xrpo.algo.losses import get_policy_loss
    from xrpo.rollout.records import RolloutRecord
    from xrpo.trainer.config import TrainConfig
    from xrpo.trainer.update import Policy, UpdateBatch, old_logprobs, policy_update

    cfg = TrainConfig()
    cfg.method.kl_coef = 0.05 if kl else 0.0
    cfg.optim.weight_decay = 0.1
    cfg.optim.mini_batches = 2
    cfg.optim.ppo_epochs = 2
    cfg.optim.old_logprobs = "recompute"
    gen = torch.Generator().manual_seed(0)
    records = [
        RolloutRecord(
            problem_index=i // 3,
            group_id=i // 3,
            round=0,
            seeded=False,
            gen_prompt_ids=ids,
            train_prompt_ids=ids,
            completion_ids=torch.randint(5, 60, (3 + i,), generator=gen).tolist(),
            logprobs=[0.0] * (3 + i),
            finish_reason="eos",
            text="",
        )
        for i, ids in enumerate([[5, 9, 11], [5, 9, 11], [5, 9, 11], [7, 8], [7, 8], [7, 8]])
    ]
    model = copy.deepcopy(tiny_model).train(False)
    policy = Policy(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1),
        loss_fn=get_policy_loss("vanilla"),
        pad_id=tiny_tokenizer.pad_token_id,
        ref_model=copy.deepcopy(tiny_model).requires_grad_(False) if kl else None,
    )
    old, ref, _ = old_logprobs(policy, records, cfg, 1)
    policy_update(policy, UpdateBatch(records, torch.tensor([1.0, -1.0, 0.0, 0.5, 0.5, -1.0]), old, ref), cfg, 1)
    old, ref, _ = old_logprobs(policy, records, cfg, 2)
    return policy, UpdateBatch(records, torch.zeros(len(records)), old, ref), cfg


def _forwards(model) -> list[int]:
    calls = [0]
    model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_a_zero_advantage_step_skips_the_passes_and_leaves_what_the_full_step_leaves(tiny_model, tiny_tokenizer):
    # the same step twice from the same state: once through the full forward / backward passes (the loss under a name
    # that does not declare itself advantage-weighted, so the update cannot skip), once skipped. A zero gradient is
    # exactly zero either way, so AdamW's steps (moment decay, weight decay, step count) give the same bits
    import copy

    from xrpo.algo.losses import POLICY_LOSSES, get_policy_loss, register_policy_loss
    from xrpo.trainer.update import policy_update, zero_gradient

    policy, batch, cfg = _update_arms(tiny_model, tiny_tokenizer, kl=False)
    assert zero_gradient(batch, cfg)
    full = copy.deepcopy(policy)
    full_cfg = copy.deepcopy(cfg)
    name = "test-vanilla-undeclared"
    register_policy_loss(name)(get_policy_loss("vanilla"))
    try:
        full_cfg.method.policy_loss = name
        assert not zero_gradient(batch, full_cfg)
        full_calls, skip_calls = _forwards(full.model), _forwards(policy.model)
        before = {k: v.clone() for k, v in policy.model.state_dict().items()}
        m_full = policy_update(full, batch, full_cfg, 2)
        m_skip = policy_update(policy, batch, cfg, 2)
    finally:
        POLICY_LOSSES.pop(name)
    assert full_calls[0] == 4 and skip_calls[0] == 0  # 2 epochs x 2 mini-batches of one micro-batch each
    after = policy.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after)  # weight decay and AdamW's momentum moved it
    for k, v in full.model.state_dict().items():
        assert torch.equal(v, after[k]), k
    s_full, s_skip = full.optimizer.state_dict(), policy.optimizer.state_dict()
    assert s_full["state"].keys() == s_skip["state"].keys()
    for i, st in s_full["state"].items():
        for key, v in st.items():
            assert torch.equal(v, s_skip["state"][i][key]), (i, key)
    assert m_skip["loss/skipped_zero_advantage"] == 1.0 and "loss/skipped_zero_advantage" not in m_full
    assert m_skip["loss/policy"] == m_full["loss/policy"] == 0.0
    assert m_skip["loss/grad_norm"] == m_full["loss/grad_norm"] == 0.0


def test_a_zero_advantage_step_with_a_kl_term_still_runs(tiny_model, tiny_tokenizer):
    # the KL term pulls the policy, which one step moved, back toward the reference: its gradient is not zero, so the
    # update must run (skipping it would leave the policy where a real step does not)
    from xrpo.trainer.update import policy_update, zero_gradient

    policy, batch, cfg = _update_arms(tiny_model, tiny_tokenizer, kl=True)
    assert not zero_gradient(batch, cfg)
    calls = _forwards(policy.model)
    metrics = policy_update(policy, batch, cfg, 2)
    assert calls[0] == 4 and metrics["loss/grad_norm"] > 0 and "loss/skipped_zero_advantage" not in metrics
