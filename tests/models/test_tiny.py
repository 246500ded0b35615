"""xrpo.models.tiny: the tiny tokenizer and model that tests and the default run build in-process."""

from __future__ import annotations

import string

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from xrpo.models.tiny import TINY_CHARSET, build_tiny_model, build_tiny_tokenizer

ROUND_TRIP_TEXTS = [
    "\\boxed{12}",
    "Q: 12+34\nA: \\boxed{46}",
    "Q: Solve 3*x - 5 = 7 for x.\nA: \\boxed{4}",
    "\\frac{1}{2} + \\frac{3}{4} = \\boxed{\\frac{5}{4}}",
    "  leading and trailing spaces  ",
    "tabs\tand\n\nblank lines\n",
    "punctuation , . ; : ! ? ' \" ( ) [ ] { } < > | & ^ % $ # @ ~ `",
    "unicode: café, naïve, π ≈ 3.14159, ∑ x_i, 你好",
    "1234567890 -0.5 1e-3",
    "",
]


# ---- tokenizer ---------------------------------------------------------------------------------------------------
def test_special_tokens_padding_side_and_size(tiny_tokenizer):
    tok = tiny_tokenizer
    assert tok.pad_token == "<pad>" and tok.eos_token == "<eos>"
    assert tok.pad_token_id == 0 and tok.eos_token_id == 1  # distinct: padding is never an end of completion
    assert tok.bos_token is None and tok.unk_token is None
    assert tok.padding_side == "left"
    assert 258 < len(tok) <= 512
    assert tok("Q: 1+1", add_special_tokens=True)["input_ids"] == tok("Q: 1+1", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_decode_round_trips_text(tiny_tokenizer, text):
    ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(ids) == text
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == text


def test_eos_is_skipped_in_text_but_kept_in_ids(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = tok(" \\boxed{7}", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == " \\boxed{7}"
    assert tok.decode(ids) == " \\boxed{7}<eos>"
    assert tok("x<eos>", add_special_tokens=False)["input_ids"][-1] == tok.eos_token_id


def test_every_digit_is_its_own_token(tiny_tokenizer):
    tok = tiny_tokenizer
    # the training texts are full of multi-digit numbers, yet no token may hold two digits
    for token_id in range(len(tok)):
        piece = tok.decode([token_id])
        digits = [c for c in piece if c.isdigit()]
        assert len(digits) <= 1, (token_id, piece)
        if digits:
            assert piece == digits[0], (token_id, piece)
    ids = tok("1234567890", add_special_tokens=False)["input_ids"]
    assert len(ids) == 10 and [tok.decode([i]) for i in ids] == list("1234567890")


def test_every_charset_character_is_one_token(tiny_tokenizer):
    assert set(string.digits + "+-*/=()\\{}\n" + string.ascii_letters) <= set(TINY_CHARSET)
    for ch in TINY_CHARSET:
        ids = tiny_tokenizer(ch, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, repr(ch)
        assert tiny_tokenizer.decode(ids) == ch


def test_answer_format_gets_merges(tiny_tokenizer):
    # "\boxed" appears in the training texts and TINY_CHARSET_TEXTS: it must not cost one token per letter
    ids = tiny_tokenizer(" \\boxed{", add_special_tokens=False)["input_ids"]
    assert len(ids) <= 3


def test_chat_template(tiny_tokenizer):
    tok = tiny_tokenizer
    user = [{"role": "user", "content": "Q: 1+1\nA:"}]
    assert tok.apply_chat_template(user, add_generation_prompt=True, tokenize=False) == "Q: 1+1\nA:"
    assert tok.apply_chat_template(user, add_generation_prompt=False, tokenize=False) == "Q: 1+1\nA:"
    convo = [
        {"role": "system", "content": "Answer in a box."},
        {"role": "user", "content": "Q: 1+1\nA:"},
        {"role": "assistant", "content": " \\boxed{2}"},
        {"role": "user", "content": "Q: 2+2\nA:"},
    ]
    assert (
        tok.apply_chat_template(convo, add_generation_prompt=True, tokenize=False)
        == "Answer in a box.\nQ: 1+1\nA: \\boxed{2}<eos>Q: 2+2\nA:"
    )


def test_vocab_size_bound_and_determinism():
    texts = ["Q: 11+22\nA: \\boxed{33}"] * 5
    small = build_tiny_tokenizer(texts, vocab_size=270)
    assert len(small) <= 270
    again = build_tiny_tokenizer(texts, vocab_size=270)
    assert small.get_vocab() == again.get_vocab()


@pytest.mark.parametrize(
    "texts, vocab_size, match",
    [
        ("just one string", 512, "single str"),
        ([], 512, "at least one non-empty"),
        (["", ""], 512, "at least one non-empty"),
        (["ok", 3], 512, r"texts\[1\]"),
        (["ok"], 100, "vocab_size"),
        (["ok"], 300.0, "vocab_size"),
    ],
)
def test_tokenizer_bad_input(texts, vocab_size, match):
    with pytest.raises(ValueError, match=match):
        build_tiny_tokenizer(texts, vocab_size=vocab_size)


# ---- model -------------------------------------------------------------------------------------------------------
def test_model_shape_and_parameter_count(tiny_tokenizer, tiny_model):
    cfg = tiny_model.config
    assert type(tiny_model).__name__ == "Qwen2ForCausalLM"
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size) == (128, 4, 4, 512)
    assert cfg.vocab_size == len(tiny_tokenizer) and cfg.max_position_embeddings == 256
    # Qwen2 parameters, tied embeddings (no separate lm_head), V = vocab, d = 128, f = 512, 4 layers:
    #   embeddings V*d; per layer q,k,v,o 4*d*d + q,k,v biases 3*d + gate,up,down 3*d*f + two RMSNorms 2*d;
    #   final RMSNorm d.  Per layer: 65536 + 384 + 196608 + 256 = 262784.
    V, d = len(tiny_tokenizer), 128
    expected = V * d + 4 * 262784 + d
    assert sum(p.numel() for p in tiny_model.parameters()) == expected
    assert 1.0e6 < expected < 1.2e6  # "about 1.1M" at a ~400-token vocabulary
    assert tiny_model.lm_head.weight.data_ptr() == tiny_model.model.embed_tokens.weight.data_ptr()
    assert tiny_model.dtype == torch.float32


def test_model_special_token_ids(tiny_tokenizer, tiny_model):
    for cfg in (tiny_model.config, tiny_model.generation_config):
        assert cfg.eos_token_id == tiny_tokenizer.eos_token_id
        assert cfg.pad_token_id == tiny_tokenizer.pad_token_id
        assert cfg.bos_token_id is None


def test_model_seed_determinism_and_global_rng_untouched(tiny_tokenizer, tiny_model):
    state = torch.get_rng_state()
    a = build_tiny_model(tiny_tokenizer, seed=0, d_model=32, layers=1, heads=2, ffn=64)
    b = build_tiny_model(tiny_tokenizer, seed=0, d_model=32, layers=1, heads=2, ffn=64)
    c = build_tiny_model(tiny_tokenizer, seed=1, d_model=32, layers=1, heads=2, ffn=64)
    assert torch.equal(torch.get_rng_state(), state)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    # the fixture built once per test session used seed 0 at the default size
    fresh = build_tiny_model(tiny_tokenizer, seed=0)
    assert torch.equal(fresh.model.layers[0].mlp.up_proj.weight, tiny_model.model.layers[0].mlp.up_proj.weight)


def test_save_and_reload_together(tmp_path, tiny_tokenizer, tiny_model):
    """Saved side by side, as the default run caches them, both reload as they were."""
    tiny_tokenizer.save_pretrained(tmp_path)
    tiny_model.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert len(tok) == len(tiny_tokenizer) == model.config.vocab_size
    assert tok.get_vocab() == tiny_tokenizer.get_vocab()
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == (0, 1, None)
    assert tok.padding_side == "left" and tok.chat_template == tiny_tokenizer.chat_template
    for text in ROUND_TRIP_TEXTS:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert ids == tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    x = torch.tensor([tok("Q: 3+4\nA: \\boxed{7}", add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(model(x).logits, tiny_model(x).logits, rtol=0, atol=0)
    assert model.generation_config.eos_token_id == 1 and model.generation_config.pad_token_id == 0


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(d_model=130, heads=4), "multiple of heads"),
        (dict(d_model=12, heads=4), "even head size"),
        (dict(layers=0), "layers"),
        (dict(ffn=-1), "ffn"),
        (dict(max_positions=2.5), "max_positions"),
        (dict(seed="0"), "seed"),
    ],
)
def test_model_bad_input(tiny_tokenizer, kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_tiny_model(tiny_tokenizer, **kwargs)


def test_model_needs_pad_and_eos(tiny_tokenizer):
    class NoPad:
        pad_token_id = None
        eos_token_id = 1

        def __len__(self):
            return 300

    with pytest.raises(ValueError, match="pad_token_id and eos_token_id"):
        build_tiny_model(NoPad())
