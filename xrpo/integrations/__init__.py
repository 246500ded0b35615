"""Integrations with other frameworks; each is an optional extra and imported only on demand.

verl    XRPO inside verl (Ray; FSDP/Megatron training; vLLM/SGLang rollouts): `pip install xrpo[verl]`,
        `xrpo verl --config ...`; see docs/verl.md
"""
