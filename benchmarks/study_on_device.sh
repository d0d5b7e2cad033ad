#!/usr/bin/env bash
# Device calls of the H200 study for one model (all its layers unless STUDY_ARGS say --layers N). Each batch size and
# engine (KVBuffer / baseline, plain / speculative) runs in a process of its own, so that one that fails, runs out of
# memory or out of the call's time loses only its own row; building an engine costs the same either way (random
# weights are drawn in GPU memory in seconds). Items run in the order given, the target points first:
# BATCHES runs its four engines, BATCHES:plain or BATCHES:speculative both backends of one mode, BATCHES:adaptive
# the KVBuffer's adaptive speculation (with its policy trace, $OUT/trace_MODEL[_accA].jsonl), BATCHES:tree its fixed
# static trees of synthetic drafts (benchmarks/study.py TREE); BATCHES is one
# batch size or several joined by commas, timed by one process per engine (one build and compile for all of them;
# its pools are sized for the largest, so keep a batch that may not fit in an item of its own). Results go to
# $OUT/study_MODEL_bBATCHES_BACKEND_MODE.json (the parts `python -m benchmarks.study --report` joins), logs to
# $OUT/study_MODEL.log. ACCEPTED=A sets the drafts' mean accepted length (default: the model's measured one) and
# adds _accA to the file names; BACKENDS="kvbuffer" limits plain / speculative items to that backend (adaptive rows
# are the KVBuffer's alone). REPEATS=N runs each engine of an item N times, in turn (every engine once, then again),
# each in a process of its own, to files ending _r1 .. _rN: the report keeps each row's median run (an engine's
# step time moves by up to 8% from one process to the next on the H200).
#   usage: [ACCEPTED=A] [REPEATS=N] benchmarks/study_on_device.sh MODEL SECONDS ITEM... [-- STUDY_ARGS...]
# e.g.  benchmarks/study_on_device.sh qwen3.5-9b 570 1,16,64,128,256 512 -- --new-tokens 64
#       (the 2026-12-02 full-layer runs: those two items, --no-hf-reference for the MoE models)
#       ACCEPTED=1.2 benchmarks/study_on_device.sh nemotron-3-nano 250 1,16,64,128,256:adaptive -- --no-hf-reference
#       REPEATS=3 BACKENDS=kvbuffer benchmarks/study_on_device.sh nemotron-3-nano 900 \
#         "1,16,64,128,256:plain speculative adaptive" -- --no-hf-reference   (the three engines in turn, three times)
set -u
# every process of this call records the call's start as its sitting (benchmarks/study.py run_date: the report keeps a
# point's runs of its latest sitting)
export STUDY_SITTING=${STUDY_SITTING:-$(date -u +"%H:%M UTC")}
model=$1 seconds=$2
shift 2
items=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do items+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
out=${OUT:-benchmarks/results}
log="$out/study_$model.log"
mkdir -p "$out"
acc_args=() suffix=""
if [ -n "${ACCEPTED:-}" ]; then acc_args=(--accepted-length "$ACCEPTED"); suffix="_acc$ACCEPTED"; fi
repeats=${REPEATS:-1}
for item in "${items[@]}"; do
  batch=${item%%:*}
  modes="plain speculative"
  [ "$item" != "$batch" ] && modes=${item#*:}
  for run in $(seq 1 "$repeats"); do
  runs=""
  [ "$repeats" -gt 1 ] && runs="_r$run"
  for mode in $modes; do
    backends=${BACKENDS:-kvbuffer recurrent} trace=()
    if [ "$mode" = adaptive ]; then backends=kvbuffer trace=(--policy-trace "$out/trace_${model}${suffix}.jsonl"); fi
    if [ "$mode" = tree ]; then backends=kvbuffer; fi
    for backend in $backends; do
      left=$((seconds - SECONDS))
      name="$model batch $batch $backend $mode${runs:+ (run $run of $repeats)}"
      if [ "$left" -lt 45 ]; then echo "[study] $name skipped: ${left}s left" | tee -a "$log"; continue; fi
      echo "[study] $name, ${left}s left" | tee -a "$log"
      # (an item that repeats an earlier one of the call, e.g. '64:adaptive plain' '64:adaptive', writes beside its
      # file, not over it: the 2026-12-06 10:18 UTC call lost a run so; the report reads both as runs of the point)
      base="$out/study_${model}_b${batch//,/-}_${backend}_${mode}${suffix}${runs}" again=1
      file="$base.json"
      while [ -e "$file" ]; do again=$((again + 1)) file="${base}_again$again.json"; done
      timeout "$left" python -m benchmarks.study --model "$model" --batches ${batch//,/ } --only "$backend" "$mode" \
        "${acc_args[@]}" "${trace[@]}" --out "$file" "$@" \
        >>"$log" 2>&1 \
        || echo "[study] $name failed or timed out (exit $?)" | tee -a "$log"
    done
  done
  done
done
