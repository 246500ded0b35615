#!/usr/bin/env bash
# XRPO on verl end to end on CPU (xrpo verl --cpu): the built-in model on the built-in task's easiest gcd problems
# (it solves about a quarter of its rollouts there, so groups have reward variance), a seeded ICL corpus, the KL loss
# with verl's reference worker; steps 1-2 with a checkpoint at step 2, then a second launch resumed by verl from it for
# step 3. Offline. Sized for 2 cores and 16 GB (docs/benchmarks.md, "verl on CPU"). The last line printed is the
# summary from the run's logged metrics: verl-cpu: steps=3 resumed_at=2 grad_norm_max=... icl_rows=... corpus=... kl_last=...
#   bash examples/verl/cpu_dry_run.sh OUT_DIR [key=value ...]
# Hydra overrides after OUT_DIR go to both launches, after the script's own (the last value of a key wins), e.g.
# algorithm.xrpo.allocation=xrpo-plus.
set -euo pipefail
OUT=$(realpath -m "${1:?usage: cpu_dry_run.sh OUT_DIR [key=value ...]}")
shift
cd "$(dirname "$0")/../.."
# Ray's workers inherit this environment: they import this checkout's xrpo
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}  # GiB of KV cache for vLLM's CPU server (its minimum)
PY=${PYTHON:-python}
mkdir -p "$OUT"
# the built-in model (solves some of the built-in task) in Llama's layout: verl's Qwen2 tokenisation needs Qwen's chat
# tokens, which the built-in tokenizer does not have (make_tiny_model.py says why the function is unchanged)
$PY examples/verl/make_tiny_model.py --from-default --out "$OUT/model"
MODEL="$OUT/model"
$PY examples/verl/prepare_data.py --task default --families gcd --levels 0 --n-train 64 --n-val 8 \
  --template 'Q: {prompt}\nA:' --seed-corpus "$OUT/seed.jsonl" --out "$OUT/data"
ARGS=(
  actor_rollout_ref.model.path="$MODEL"
  data.train_files="$OUT/data/train.parquet" data.val_files="$OUT/data/val.parquet" data.seed=0
  # ICL prompts are fitted to 512 tokens (make_tiny_model.py --from-default declares 1024 of context); an answer and
  # its end token take ~7 tokens, a rambling rollout up to ~20 (measured)
  data.train_batch_size=4 data.max_prompt_length=512 data.max_response_length=24 data.dataloader_num_workers=0
  # 4 prompts x 8 rollouts: 4 base rollouts each (the paper's n_base), 16 more over 2 planning rounds
  actor_rollout_ref.rollout.n=8 algorithm.xrpo.n_base=4 algorithm.xrpo.embedder=hash
  algorithm.xrpo.corpus_init="$OUT/seed.jsonl" algorithm.xrpo.corpus_max_per_problem=8
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32
  actor_rollout_ref.actor.optim.lr=1e-4
  # one agent-loop worker and one reward worker (verl starts 8 of each, every one importing verl and vLLM: minutes
  # of start-up on 2 cores), Ray's dashboard UI off
  actor_rollout_ref.rollout.agent.num_workers=1 reward.num_workers=1
  +ray_kwargs.ray_init.object_store_memory=1073741824 +ray_kwargs.ray_init.include_dashboard=false
  # no idle workers started ahead: verl's actors each need a worker with the job's environment, so Ray's two
  # prestarted ones only sat there (~5 CPU-seconds each, measured)
  '+ray_kwargs.ray_init._system_config={prestart_worker_first_driver:false}'
  trainer.total_epochs=1 trainer.val_before_train=false trainer.test_freq=-1 trainer.save_freq=2
  trainer.default_local_dir="$OUT/run" trainer.rollout_data_dir="$OUT/rollouts"
  trainer.project_name=xrpo_cpu trainer.experiment_name=dry_run
)
# each launch's output goes to its log unbuffered: a launch that dies leaves its log complete up to then
export PYTHONUNBUFFERED=1
launch() {  # launch N [override ...]: one `xrpo verl --cpu` launch, its output in $OUT/launch-N.log
  local n=$1 rc=0
  shift
  $PY -m xrpo.cli verl --cpu "${ARGS[@]}" "$@" > "$OUT/launch-$n.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -40 "$OUT/launch-$n.log"
    echo "cpu_dry_run.sh: launch $n exited with code $rc; its whole output: $OUT/launch-$n.log" >&2
    exit 1
  fi
}
launch 1 trainer.total_training_steps=2 "$@"
launch 2 trainer.total_training_steps=3 trainer.resume_mode=auto "$@"
# the summary the second launch printed last (grep -o: matched anywhere in a line of the log, which the launch shares
# with the output of its Ray workers)
summary=$(grep -o 'verl-cpu: .*' "$OUT/launch-2.log" | tail -1) || {
  tail -40 "$OUT/launch-2.log"
  echo "cpu_dry_run.sh: launch 2 exited 0 without its summary line: $OUT/launch-2.log" >&2
  exit 1
}
echo "$summary"
