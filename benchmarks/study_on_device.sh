#!/usr/bin/env bash
# One device call of the H200 study for one model: each batch size runs in its own process, so that a size that
# fails or runs out of the call's time loses only its own row. Results go to $OUT/study_MODEL_bBATCH.json (the
# parts `python -m benchmarks.study --report` joins), logs to $OUT/study_MODEL.log.
#   usage: benchmarks/study_on_device.sh MODEL SECONDS BATCH... [-- STUDY_ARGS...]
# e.g.  CUDA_VISIBLE_DEVICES=0 benchmarks/study_on_device.sh qwen3.5-9b 560 128 256 512 1 16 64
set -u
model=$1 seconds=$2
shift 2
batches=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do batches+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
out=${OUT:-benchmarks/results}
mkdir -p "$out"
for batch in "${batches[@]}"; do
  left=$((seconds - SECONDS))
  if [ "$left" -lt 30 ]; then echo "[study] $model batch $batch skipped: ${left}s left" | tee -a "$out/study_$model.log"; continue; fi
  echo "[study] $model batch $batch, ${left}s left" | tee -a "$out/study_$model.log"
  timeout "$left" python -m benchmarks.study --model "$model" --batches "$batch" \
    --out "$out/study_${model}_b$batch.json" "$@" >>"$out/study_$model.log" 2>&1 \
    || echo "[study] $model batch $batch failed or timed out (exit $?)" | tee -a "$out/study_$model.log"
done
