"""A tiny tokenizer and a tiny randomly initialised Qwen2 model, built in-process.

Tests and the offline default run (`xrpo train` with no arguments) use these instead of a downloaded checkpoint, so
they take exactly the code path of a real model: a `PreTrainedTokenizerFast` with a chat template, special tokens and
left padding, and a `Qwen2ForCausalLM`, both saved and reloaded with `save_pretrained` / `from_pretrained`.

Design (measured on the default task): byte-level BPE with every digit its own token (the model
must learn digit-by-digit arithmetic, and multi-digit merges would make numbers opaque symbols), about 400 tokens;
d_model 128, 4 layers, 4 heads, FFN 512, tied embeddings: about 1.1M parameters. A 4x larger variant was 3x slower and
scored lower after the same CPU time.
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterable

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

__all__ = [
    "PAD_TOKEN",
    "EOS_TOKEN",
    "TINY_CHARSET",
    "TINY_CHARSET_TEXTS",
    "TINY_CHAT_TEMPLATE",
    "build_tiny_tokenizer",
    "build_tiny_model",
]

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"

# Every character the default task's prompts and answers use: printable ASCII (digits, operators, letters, braces,
# backslash, punctuation) plus newline and tab. Byte-level BPE can encode any text, but training on these guarantees
# each character is a single token and that the answer format (`\boxed{...}`) gets its own merges.
TINY_CHARSET = string.digits + string.ascii_letters + string.punctuation + " \n\t"

TINY_CHARSET_TEXTS: tuple[str, ...] = (
    TINY_CHARSET,
    "0123456789",
    "+ - * / = ( ) ^ % < > . , : ; ! ? ' \" [ ] { } | & _ ~ ` @ # $",
    "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "Q: What is 12 + 34?\nA: \\boxed{46}",
    "Q: Solve for x: 3*x - 5 = 7\nA: \\boxed{4}",
    "Q: Find the GCD of 12, 18.\nA: \\boxed{6}",
    "Q: \\frac{1}{2} + \\frac{1}{3} = ?\nA: \\boxed{\\frac{5}{6}}",
    "The answer is \\boxed{-7}. #### -7",
)

# User and system turns are rendered verbatim, consecutive ones separated by a newline; an assistant turn follows the
# turn before it directly (that turn ends with its own answer cue, "A:") and ends with the EOS token. The generation
# prompt is therefore empty: the answer starts with a space that byte-level BPE merges into the next token
# (space + backslash), so a trailing space or newline in the prompt would be a token never seen before an answer.
TINY_CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'assistant' -%}"
    "{{ m['content'] }}{{ eos_token }}"
    "{%- else -%}"
    "{%- if not loop.first and loop.previtem['role'] != 'assistant' -%}{{ '\\n' }}{%- endif -%}"
    "{{ m['content'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def build_tiny_tokenizer(texts: Iterable[str], *, vocab_size: int = 512) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` (plus `TINY_CHARSET_TEXTS`) and wrap it for transformers.

    The pipeline is Qwen2's (NFC, Qwen2's pre-tokenizer regex, byte-level BPE) and the result is a `Qwen2Tokenizer`,
    a `PreTrainedTokenizerFast` subclass: transformers 5 loads the tokenizer of every `qwen2` checkpoint directory with
    `Qwen2Tokenizer`, which rebuilds its pre-tokenizer from that class rather than from `tokenizer.json`, so a tokenizer
    saved beside `build_tiny_model`'s model must already be that pipeline to reload identically. The regex's `\\p{N}`
    alternative makes every digit its own pre-token (the effect of `pre_tokenizers.Digits(individual_digits=True)`):
    no merge ever spans two digits, so the model sees numbers digit by digit.

    Special tokens: `<pad>` (id 0) and `<eos>` (id 1), distinct (padding must never be mistaken for the end of a
    completion); no BOS, no UNK (byte-level BPE encodes any text). Padding side is left (decoder-only generation).
    Decoding round-trips any NFC text exactly (no clean-up of spaces); the chat template is `TINY_CHAT_TEMPLATE`.

    Args:
        texts: training texts; at least one non-empty string.
        vocab_size: upper bound on the vocabulary (256 byte symbols + 2 special tokens + merges); the result may be
            smaller when the texts support fewer merges.

    Returns:
        The tokenizer; save it with `save_pretrained(dir)` and reload with `AutoTokenizer.from_pretrained(dir)`.
    """
    if isinstance(texts, str):
        raise ValueError("texts: expected an iterable of strings, got a single str")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise ValueError(f"texts[{i}]: expected str, got {type(t).__name__}")
    if not any(texts):
        raise ValueError("texts: expected at least one non-empty string to train the tokenizer on")
    min_vocab = len(pre_tokenizers.ByteLevel.alphabet()) + 2
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < min_vocab:
        raise ValueError(f"vocab_size: expected an int >= {min_vocab} (256 bytes + <pad> + <eos>), got {vocab_size!r}")

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts + list(TINY_CHARSET_TEXTS), trainer=trainer)

    # Older `tokenizers` serialise a merge as "a b", newer ones as ["a", "b"]; Qwen2Tokenizer wants tuples.
    raw_merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in raw_merges]
    hf_tok = Qwen2Tokenizer(
        vocab=tok.get_vocab(),
        merges=merges,
        unk_token=None,  # Qwen2Tokenizer's default would add an "<|endoftext|>" token the model has no row for
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        bos_token=None,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    hf_tok.chat_template = TINY_CHAT_TEMPLATE
    return hf_tok


def build_tiny_model(
    tokenizer,
    *,
    d_model: int = 128,
    layers: int = 4,
    heads: int = 4,
    ffn: int = 512,
    max_positions: int = 256,
    seed: int = 0,
) -> Qwen2ForCausalLM:
    """A randomly initialised `Qwen2ForCausalLM` sized for `tokenizer` (float32, tied input/output embeddings).

    At the defaults and a ~400-token vocabulary it has about 1.1M parameters. The global torch RNG is left untouched:
    initialisation draws from a forked RNG seeded with `seed`, so the same seed gives the same weights.

    Args:
        tokenizer: a tokenizer with `pad_token_id` and `eos_token_id` (e.g. from `build_tiny_tokenizer`).
        d_model: hidden size; divisible by `heads`.
        layers: number of decoder layers.
        heads: attention heads (as many key/value heads: plain multi-head attention).
        ffn: MLP intermediate size.
        max_positions: `max_position_embeddings` (context length the model is meant for).
        seed: initialisation seed.
    """
    for name, value in (
        ("d_model", d_model),
        ("layers", layers),
        ("heads", heads),
        ("ffn", ffn),
        ("max_positions", max_positions),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}: expected a positive int, got {value!r}")
    if d_model % heads != 0:
        raise ValueError(f"d_model: expected a multiple of heads={heads}, got {d_model}")
    if (d_model // heads) % 2 != 0:
        raise ValueError(f"d_model / heads: rotary embeddings need an even head size, got {d_model // heads}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"seed: expected an int, got {seed!r}")
    pad_id = getattr(tokenizer, "pad_token_id", None)
    eos_id = getattr(tokenizer, "eos_token_id", None)
    if pad_id is None or eos_id is None:
        raise ValueError(
            "tokenizer: expected pad_token_id and eos_token_id to be set (build it with build_tiny_tokenizer)"
        )

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=d_model,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        use_sliding_window=False,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model = model.to(torch.float32)
    model.generation_config = GenerationConfig(pad_token_id=pad_id, eos_token_id=eos_id, bos_token_id=None)
    model.eval()
    return model
