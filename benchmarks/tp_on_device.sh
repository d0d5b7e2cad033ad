#!/usr/bin/env bash
# Issue 18's GPU run, for a host of two GPUs or more (nvidia-h200-x2 / nvidia-h100-x2): the GPU tensor-parallel tests,
# then `specdec bench` of plain decoding, fixed speculation and adaptive speculation at TP2 and at TP1 on the same
# machine (the TP1 row is the baseline of the TP2 >= 1.6x target; each bench row reports the per-rank linear-state
# memory and, on a GPU, the largest batch that fits). Each part runs under its own time limit, cut to what is left of
# SECONDS, so one that fails or hangs loses only itself; results go to $OUT/tp{1,2}_NAME.json, logs to
# $OUT/tp_NAME.log (NAME: the target, ':' and '/' made '_').
#   usage: OUT=dir [TARGET=random:qwen3.5-9b] [BATCHES="64 256"] [BENCH_ARGS=...] benchmarks/tp_on_device.sh [SECONDS]
# e.g. in one device call: WHEELS=.whlx OUT=$OUT bash benchmarks/device_call.sh \
#        "580:OUT=\$STEP_OUT bash benchmarks/tp_on_device.sh 570"
set -u
cd "$(dirname "$0")/.."
seconds=${1:-570}
out=${OUT:-benchmarks/results}
target=${TARGET:-random:qwen3.5-9b}
name=${target//[:\/]/_}
log="$out/tp_$name.log"
mkdir -p "$out"
part() {  # LIMIT COMMAND...: the command under min(LIMIT, what is left), its output to the log
  local limit=$1 left=$((seconds - SECONDS))
  shift
  if [ "$left" -lt 20 ]; then echo "[tp] skipped, ${left}s left: $*" | tee -a "$log"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "[tp] $* (${limit}s)" | tee -a "$log"
  timeout "$limit" "$@" >>"$log" 2>&1 || echo "[tp] failed or timed out (exit $?): $*" | tee -a "$log"
}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  part 150 python -m pytest -q -p no:cacheprovider tests/test_tensor_parallel.py -m gpu
fi
# shellcheck disable=SC2086  # (BATCHES and BENCH_ARGS are word lists)
for tp in 2 1; do
  part 240 python -m specdec bench --target "$target" --draft synthetic:2.72 --batch-sizes ${BATCHES:-64 256} \
    --speculation fixed adaptive --tp "$tp" ${BENCH_ARGS:-} --output "$out/tp${tp}_$name.json"
done
tail -n 40 "$log"
