#!/usr/bin/env bash
# Trains the small models that ship in specdec/checkpoints, from the corpus in specdec/training/corpus, one command
# per model (each a few minutes on one H200; every training loop stops within --max-minutes, 23 in all). Usage:
#   bash examples/train_shipped_models.sh [OUT] [STEP]   STEP: tokenizer | qwen | qwen-draft | nemotron |
#                                                               nemotron-draft | eagle3 | all (default)
set -euo pipefail
OUT=${1:-specdec/checkpoints}
STEP=${2:-all}
run() { [[ $STEP == all || $STEP == "$1" ]]; }

if run tokenizer; then python -m specdec.cli train-tokenizer --vocab-size 8192 --out "$OUT/tokenizer"; fi
if run qwen; then
  python -m specdec.cli train --preset qwen3.5-tiny --tokenizer "$OUT/tokenizer" --out "$OUT/qwen3.5-tiny" \
    --steps 4000 --batch-size 64 --seq-len 512 --lr 3e-3 --max-minutes 6
fi
if run qwen-draft; then
  python -m specdec.cli train --preset qwen3.5-tiny-draft --tokenizer "$OUT/tokenizer" --out "$OUT/qwen3.5-tiny-draft" \
    --steps 4000 --batch-size 64 --seq-len 512 --lr 4e-3 --max-minutes 3
fi
if run nemotron; then
  python -m specdec.cli train --preset nemotron-3-tiny --tokenizer "$OUT/tokenizer" --out "$OUT/nemotron-3-tiny" \
    --steps 4000 --batch-size 64 --seq-len 512 --lr 3e-3 --max-minutes 6
fi
if run nemotron-draft; then
  python -m specdec.cli train --preset nemotron-3-tiny-draft --tokenizer "$OUT/tokenizer" --out "$OUT/nemotron-3-tiny-draft" \
    --steps 4000 --batch-size 64 --seq-len 512 --lr 4e-3 --max-minutes 3
fi
if run eagle3; then
  python -m specdec.cli train-drafter --target "$OUT/qwen3.5-tiny" --method eagle3 --out "$OUT/qwen3.5-tiny-eagle3" \
    --steps 3000 --batch-size 32 --seq-len 512 --lr 2e-3 --draft-vocab-size 2048 --max-minutes 5
fi
