#!/usr/bin/env bash
# Trains the small models that ship in specdec/checkpoints, from the corpus in specdec/training/corpus, on one
# H200 in two rounds of at most 7 minutes (the models are too small to fill the GPU alone):
#   round 1: qwen3.5-tiny, qwen3.5-tiny-draft and nemotron-3-tiny-draft side by side;
#   round 2: nemotron-3-tiny (the slowest: transformers' reference Mamba2 scan) beside the EAGLE-3 head, which
#            needs the round-1 qwen3.5-tiny.
# Usage:
#   bash examples/train_shipped_models.sh [OUT] [STEP]
#   STEP: tokenizer | round1 | round2 | qwen | qwen-draft | nemotron | nemotron-draft | eagle3 |
#         all (default: tokenizer, round1, round2)
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
eagle3() {
  python -m specdec.cli train-drafter --target "$OUT/qwen3.5-tiny" --method eagle3 --out "$OUT/qwen3.5-tiny-eagle3" \
    --steps 4000 --batch-size 32 --seq-len 512 --lr 2e-3 --draft-vocab-size 2048 --max-minutes "${MINUTES_EAGLE3:-6}" \
    > "$OUT/logs/eagle3.log" 2>&1
}
side_by_side() {  # side_by_side NAME...: train these at once, fail if any fails
  local pids=()
  for name in "$@"; do
    if [[ $name == eagle3 ]]; then eagle3 & else train "$name" "${PRESET[$name]}" "${LR[$name]}" & fi
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
}

if [[ $STEP == all || $STEP == round1 ]]; then side_by_side qwen qwen-draft nemotron-draft; fi
if [[ $STEP == all || $STEP == round2 ]]; then side_by_side nemotron eagle3; fi
if [[ $STEP == eagle3 ]]; then eagle3; fi
if [[ -n ${PRESET[$STEP]:-} ]]; then train "$STEP" "${PRESET[$STEP]}" "${LR[$STEP]}"; fi
