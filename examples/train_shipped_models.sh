#!/usr/bin/env bash
# Trains the small models that ship in specdec/checkpoints, from the corpus in specdec/training/corpus. On one
# H200 the four language models train side by side (they are too small to fill the GPU alone), each for at most
# 7 minutes, then the EAGLE-3 head for the Qwen3.5 target for at most 6. Usage:
#   bash examples/train_shipped_models.sh [OUT] [STEP]
#   STEP: tokenizer | models (the four below, in parallel) | qwen | qwen-draft | nemotron | nemotron-draft |
#         eagle3 | all (default: tokenizer, models, eagle3)
# Logs go to OUT/logs/STEP.log. The tokenizer is deterministic and takes seconds on a CPU.
set -euo pipefail
OUT=${1:-specdec/checkpoints}
STEP=${2:-all}
MINUTES=${MINUTES:-7}
mkdir -p "$OUT/logs"

train() {  # train NAME PRESET LR: one language model, logged to OUT/logs/NAME.log
  python -m specdec.cli train --preset "$2" --tokenizer "$OUT/tokenizer" --out "$OUT/$2" \
    --steps 4000 --batch-size 64 --seq-len 512 --lr "$3" --max-minutes "$MINUTES" > "$OUT/logs/$1.log" 2>&1
}
declare -A PRESET=([qwen]=qwen3.5-tiny [qwen-draft]=qwen3.5-tiny-draft [nemotron]=nemotron-3-tiny
                   [nemotron-draft]=nemotron-3-tiny-draft)
declare -A LR=([qwen]=3e-3 [qwen-draft]=4e-3 [nemotron]=3e-3 [nemotron-draft]=4e-3)

if [[ $STEP == all || $STEP == tokenizer ]]; then
  python -m specdec.cli train-tokenizer --vocab-size 8192 --out "$OUT/tokenizer"
fi
if [[ $STEP == all || $STEP == models ]]; then
  pids=()
  for name in qwen qwen-draft nemotron nemotron-draft; do train "$name" "${PRESET[$name]}" "${LR[$name]}" & pids+=($!); done
  for pid in "${pids[@]}"; do wait "$pid"; done
elif [[ -n ${PRESET[$STEP]:-} ]]; then
  train "$STEP" "${PRESET[$STEP]}" "${LR[$STEP]}"
fi
if [[ $STEP == all || $STEP == eagle3 ]]; then
  python -m specdec.cli train-drafter --target "$OUT/qwen3.5-tiny" --method eagle3 --out "$OUT/qwen3.5-tiny-eagle3" \
    --steps 4000 --batch-size 32 --seq-len 512 --lr 2e-3 --draft-vocab-size 2048 --max-minutes "${MINUTES_EAGLE3:-6}" \
    > "$OUT/logs/eagle3.log" 2>&1
fi
