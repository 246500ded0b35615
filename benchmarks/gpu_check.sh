#!/usr/bin/env bash
# The GPU check: everything xrpo should prove on one CUDA GPU, in one call of about 8 minutes that builds
# nothing, writing its results to one folder (7 files). Run whenever a GPU machine is lent:
#
#   bash benchmarks/gpu_check.sh OUTDIR            # on the GPU machine, from the repository root
#   bash benchmarks/gpu_check.sh --smoke OUTDIR    # the CPU rehearsal (seconds-sized), run by CI so the script cannot rot
#   GPU_CHECK_STAGES="3 1" GPU_CHECK_T_STEPS=330 bash benchmarks/gpu_check.sh OUTDIR   # only some stages, in order
#
# Outputs (8 files at most, as the device tool brings back): env.txt pytest.txt bench.log bench_gpu.md steps.log
# bench_gpu-steps.md default.log (summary.json's figures appended to it) cb.log (its tables at its end). The JSON
# files the benchmark writes beside its tables are removed: their figures are in the logs.
#
# What the GPU machine lacks travels with the tree (docs/benchmarks.md, "## GPU", says how to assemble it):
#   .whl/       wheels of the pure-Python needs the image lacks (pydantic, math-verify, reasoning-gym, wordllama ...):
#               installed with --no-deps into /tmp/site
#   .gpucache/  the built-in default model, built on a CPU once (XRPO_CACHE), so the default job needs no warm-start
#
# Stages (each under its own time limit; a failing stage is recorded and the next one runs):
#   1. pytest.txt     tests marked gpu (tests/**/*_gpu.py) and the trainer's tests, which run on CUDA there
#   2. bench_gpu.*    random-initialised Qwen2.5-0.5B / 1.5B shapes: generation and update tokens/s, peak memory
#                     with each memory feature against the estimate (benchmarks/bench_gpu.py)
#   3. steps.*        XRPO / GRPO step time at the paper's budget with the HF engine (bench_gpu.py --shapes)
#   4. default.*      the default job (`xrpo train`) on CUDA for a fixed time: wall time, held-out pass@1
#   5. cb.log         the continuous-batching engine (rollout.engine=hf-cb) against the HF engine on the Qwen2.5-0.5B
#                     shape: generation tokens/s at 16, 64 and 128 rows, and the step time of GRPO, XRPO streaming
#                     and XRPO rounds on hf-cb and of GRPO on hf, at the paper's budget (bench_gpu.py --tag cb)
set -u
SMOKE=0
if [ "${1:-}" = "--smoke" ]; then SMOKE=1; shift; fi
OUTDIR=${1:?usage: bash benchmarks/gpu_check.sh [--smoke] OUTDIR}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || echo "wheel install failed" >&2
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
t0=$(date +%s)
stage() { echo "== [$(( $(date +%s) - t0 ))s] $*"; }

stage env
{
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    $PY -c "import sys, torch, transformers; print(sys.version.split()[0], 'torch', torch.__version__, 'transformers', transformers.__version__, 'cuda', torch.cuda.is_available())"
    $PY -c "import peft; print('peft', peft.__version__)" 2>&1 | tail -1
    $PY -c "import xrpo.trainer.loop, reasoning_gym, math_verify, wordllama; print('xrpo imports: ok')" 2>&1 | tail -1
} > "$OUTDIR/env.txt" 2>&1
cat "$OUTDIR/env.txt"

if [ $SMOKE = 1 ]; then
    TESTS=(tests/trainer/test_memory_gpu.py)
    T_TESTS=120; T_BENCH=240; T_STEPS=240; T_DEFAULT=240; T_CB=240
    BENCH=(--smoke --step-shapes); STEPS=(--smoke --shapes --tag steps); CB=(--smoke)
    DEFAULT=(steps=2 data.n_train=32 data.n_heldout=8 eval_samples=2 "eval_k=[1,2]" rollout.prompts_per_step=4
             rollout.rollouts_per_step=16 model.warmup_steps=2)
    export XRPO_CACHE="$OUTDIR/cache"
else
    # the trainer's CPU tests run on CUDA there (models load on CUDA when it is present): 38 tests in 31 s on an H200
    TESTS=(tests/trainer/test_memory_gpu.py tests/trainer/test_logprobs.py tests/trainer/test_update.py
           tests/trainer/test_lora_train.py)
    # measured on an H200 (2026-11-26): tables 90 s; the step-time runs did not fit 100 s at 128 new tokens
    T_TESTS=100; T_BENCH=140; T_STEPS=300; T_DEFAULT=60; T_CB=300
    BENCH=(--step-shapes); STEPS=(--shapes --step-tokens 128 --steps 4 --tag steps); CB=(--step-tokens 128 --steps 4)
    DEFAULT=(time_limit=25)  # 56 steps on an H200 with .gpucache (no warm-start)
    [ -d .gpucache ] && export XRPO_CACHE="$PWD/.gpucache"
fi

T_TESTS=${GPU_CHECK_T_TESTS:-$T_TESTS}; T_BENCH=${GPU_CHECK_T_BENCH:-$T_BENCH}
T_STEPS=${GPU_CHECK_T_STEPS:-$T_STEPS}; T_DEFAULT=${GPU_CHECK_T_DEFAULT:-$T_DEFAULT}; T_CB=${GPU_CHECK_T_CB:-$T_CB}

stage1() {
stage "1. tests: ${TESTS[*]}"
timeout $T_TESTS $PY -m pytest -q -p no:cacheprovider -rfE "${TESTS[@]}" > "$OUTDIR/pytest.txt" 2>&1
echo "pytest exit $?" >> "$OUTDIR/pytest.txt"
tail -3 "$OUTDIR/pytest.txt"
}

stage2() {
stage "2. bench_gpu"
timeout $T_BENCH $PY benchmarks/bench_gpu.py --out "$OUTDIR" "${BENCH[@]}" > "$OUTDIR/bench.log" 2>&1
echo "bench exit $?" >> "$OUTDIR/bench.log"
rm -f "$OUTDIR/bench_gpu.json"  # its figures are in bench.log and bench_gpu.md
tail -1 "$OUTDIR/bench.log"
}

stage3() {
stage "3. step time"
timeout $T_STEPS $PY benchmarks/bench_gpu.py --out "$OUTDIR" "${STEPS[@]}" > "$OUTDIR/steps.log" 2>&1
echo "steps exit $?" >> "$OUTDIR/steps.log"
rm -f "$OUTDIR/bench_gpu-steps.json"  # its figures are in steps.log and bench_gpu-steps.md (8 files come back)
tail -1 "$OUTDIR/steps.log"
}

stage4() {
stage "4. default job"
s=$(date +%s)
timeout $T_DEFAULT $PY -m xrpo.cli train output=/tmp/xrpo-default-$$ progress=false tensorboard=false "${DEFAULT[@]}" \
    > "$OUTDIR/default.log" 2>&1
echo "default job exit $? after $(( $(date +%s) - s ))s" >> "$OUTDIR/default.log"
$PY - /tmp/xrpo-default-$$/summary.json <<'EOF' 2>&1 | tee -a "$OUTDIR/default.log"
import json, sys
s = json.load(open(sys.argv[1]))
print(f"default job: {s['steps']} steps, pass@1 {s['pass@1_before']:.3f} -> {s['pass@1_after']:.3f}, "
      f"wall {s['wall_time_s']:.0f}s")
EOF
}

stage5() {
stage "5. continuous batching (hf-cb) against hf"
# the engines' log-probs against the trainer's recompute on CUDA first (also in stage 1), then the benchmark
timeout $T_TESTS $PY -m pytest -q -p no:cacheprovider -rfE tests/trainer/test_memory_gpu.py -k engine_logprobs \
    > "$OUTDIR/cb.log" 2>&1
echo "cb tests exit $?" >> "$OUTDIR/cb.log"
timeout $T_CB $PY benchmarks/bench_gpu.py --out "$OUTDIR" --shapes qwen2.5-0.5b --no-update \
    --gen-engines hf hf-cb --gen-rows 16 64 128 --step-shapes qwen2.5-0.5b --step-engine hf-cb \
    --step-arms grpo xrpo-streaming xrpo grpo@hf --tag cb "${CB[@]}" >> "$OUTDIR/cb.log" 2>&1
echo "cb exit $?" >> "$OUTDIR/cb.log"
rm -f "$OUTDIR/bench_gpu-cb.json" "$OUTDIR/bench_gpu-cb.md"  # the tables end cb.log
tail -1 "$OUTDIR/cb.log"
}

for n in ${GPU_CHECK_STAGES:-1 2 3 4 5}; do
    case $n in
        1|2|3|4|5) "stage$n" ;;
        *) echo "GPU_CHECK_STAGES: unknown stage '$n' (expected 1 2 3 4 5)" >&2; exit 2 ;;
    esac
done
stage done
cat "$OUTDIR"/bench_gpu*.md 2>/dev/null
exit 0
