"""xrpo.eval.config: EvalConfig's checks and the defaults that follow from the options alone."""

from __future__ import annotations

import pytest

from xrpo.eval.config import EvalConfig, default_chunk_size, default_ks


def test_default_ks():
    assert default_ks(32) == [1, 2, 4, 8, 16, 32]
    assert default_ks(12) == [1, 2, 4, 8]
    assert default_ks(1) == [1]


def test_default_chunk_size():
    assert default_chunk_size("hf", 32) == 16  # 512 // 32
    assert default_chunk_size("vllm", 32) == 128  # 4096 // 32
    assert default_chunk_size("hf", 1000) == 1  # never 0


def test_resolved_n():
    # the paper's protocol (§4.1): n = 32 samples at temperature 1.0, top-p 0.95
    assert (EvalConfig().resolved_n(), EvalConfig().temperature, EvalConfig().top_p) == (32, 1.0, 0.95)
    assert EvalConfig(n=8).resolved_n() == 8
    assert EvalConfig(greedy=True).resolved_n() == 1


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(greedy=True, n=4), "--greedy draws one sample per problem; got --n 4"),
        (dict(n=4, k=[1, 8]), r"every --k must be in \[1, n=4\], got \[8\]"),
        (dict(temperature=0.0), "--temperature must be a finite number > 0"),
        (dict(top_p=1.5), r"--top-p must be a number in \(0, 1\]"),
        (dict(chunk_size=0), "--chunk-size must be >= 1, got 0"),
        (dict(engine="sglang"), "--engine must be one of hf, hf-cb, vllm, got 'sglang'"),
        (dict(dtype="float16"), "--dtype must be float32 or bfloat16, got 'float16'"),
        (dict(icl_style="xml"), "--icl-style must be paper or fewshot, got 'xml'"),
        (dict(data=[]), "no datasets given"),
        # found by a fuzz of xrpo eval's options: each was accepted, then failed after the model loaded (or deep in
        # the run with a TypeError)
        (dict(stop=["\n", ""]), r"--stop: every stop string must be non-empty, got \['\\n', ''\]"),
        (dict(seed=-1), r"--seed must be an int in \[0, 2\*\*32\) \(numpy's and torch's seeds\), got -1"),
        (dict(seed=2**32), r"--seed must be an int in \[0, 2\*\*32\)"),
        (dict(engine="vllm", temperature=2.5), r"--temperature must be <= 2 with the vllm engine \(vLLM's sampling"),
        # a Python caller's values, which the command line would have converted or refused
        (dict(n=2.5), r"--n expects int or null, got 2.5"),
        (dict(n=True), r"--n expects int or null, got True"),
        (dict(k=2), r"--k expects list\[int\] or null, got 2"),
        (dict(k=[1.5]), r"--k expects list\[int\] or null, got \[1.5\]"),
        (dict(seed=None), "--seed expects int, got None"),
        (dict(limit=2.0), "--limit expects int or null, got 2.0"),
        (dict(icl_k=None), "--icl-k expects int, got None"),
        (dict(threads=1.5), "--threads expects int or null, got 1.5"),
        (dict(greedy="false"), "--greedy expects true/false, got 'false'"),
        (dict(temperature="1"), "--temperature expects float, got '1'"),
        (dict(data="default"), r"--data expects list\[str\], got 'default'"),
    ],
)
def test_validate_names_the_option(kw, message):
    with pytest.raises(ValueError, match=message):
        EvalConfig(**kw).validate()


def test_every_default_and_a_float_given_as_an_int_pass_the_type_check():
    EvalConfig().validate()
    EvalConfig(temperature=1, top_p=1, vllm_kv_cache_gib=2, n=4, k=[1, 2, 4], stop=["\n\n"]).validate()
