#!/usr/bin/env bash
# One call of a lent GPU machine as several timed steps. Such a call runs one command of at most 10 minutes and hands
# back at most 8 files from $OUT, so: fla-core is unpacked from a carried wheel (.whl/fla*.zip or .whl/fla*.whl,
# never installed on the CPU: it breaks transformers' Qwen3.5 there) or a trimmed copy of it (.whl/fla*.tar.xz: the
# tracked tree leaves little of the call's 64 MiB), each step runs under its own time limit with
# its own log, a step that fails or runs out of time loses only itself, a step that would not fit in what is left of
# TOTAL seconds (default 570) is skipped, and everything the steps wrote is packed into one file,
# $OUT/call.tar.gz (read it back with `tar xzf`), beside the last lines of each log on stdout. It is packed again
# after every step, so a call killed at the run's own limit still hands back the steps that ended.
#
# Steps are "SECONDS:COMMAND", run in order from the repository root; each sees STEP_OUT, a folder of its own
# for its files, and its stdout and stderr go to STEP_OUT/log.txt. E.g. (the 2026-12-03 seventh sitting's calls):
#   bash benchmarks/device_call.sh \
#     "90:python -m benchmarks.sweep_gdn --ops conv --batches 128 256" \
#     "140:python -m benchmarks.profile_step --target random:qwen3.5-9b --draft synthetic:2.72 --mode speculative \
#          --batch 128 --backends kvbuffer --out \$STEP_OUT/qwen3.5-9b_spec_b128.md" \
#     "300:OUT=\$STEP_OUT bash benchmarks/study_on_device.sh qwen3.5-9b 290 128:speculative 256:plain"
# Steps also see KERNEL_WINNERS, a kernel settings file of the call's own (benchmarks/kernel_settings.py; packed with
# the rest), empty at the start, or a copy of KERNEL_WINNERS_FROM (an earlier call's, carried): a sweep given
# --winners \$KERNEL_WINNERS adds the settings that beat its defaults, and a later step run as
# SPECDEC_KERNEL_SETTINGS=\$KERNEL_WINNERS measures with them, e.g.
#     "330:python -m benchmarks.sweep_gdn --ops smalltree --winners \$KERNEL_WINNERS" \
#     "400:SPECDEC_KERNEL_SETTINGS=\$KERNEL_WINNERS python -m benchmarks.kernels --out \$STEP_OUT/kernels_h200.json"
set -u
cd "$(dirname "$0")/.."
out=${OUT:?OUT must name the folder whose files come back}
total=${TOTAL:-570}
wheels=${WHEELS:-.whl}
wheel=$(ls "$wheels"/fla*.zip "$wheels"/fla*.whl "$wheels"/fla*.tar.xz 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  site=${SITE:-/tmp/site}
  mkdir -p "$site" && python3 -c "import sys, tarfile, zipfile
archive = sys.argv[1]
(tarfile.open(archive) if archive.endswith('.tar.xz') else zipfile.ZipFile(archive)).extractall(sys.argv[2])" \
    "$wheel" "$site"
  export PYTHONPATH=$site:$PWD
else
  echo "[call] no fla-core wheel under $wheels/: its baselines and prefill are left out"
  export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1
work=$(mktemp -d)
export KERNEL_WINNERS=$work/kernel_winners.json
if [ -n "${KERNEL_WINNERS_FROM:-}" ]; then
  cp "$KERNEL_WINNERS_FROM" "$KERNEL_WINNERS" || exit 1
else
  echo "{}" >"$KERNEL_WINNERS"
fi
pack() {  # (after every step too: a call killed from outside, at the run's own limit, still hands back what ran)
  tar czf "$out/call.tar.gz.part" -C "$work" . && mv -f "$out/call.tar.gz.part" "$out/call.tar.gz"
}
index=0
for step in "$@"; do
  index=$((index + 1))
  limit=${step%%:*} command=${step#*:}
  left=$((total - SECONDS))
  dir=$(printf "%s/step%02d" "$work" "$index")
  mkdir -p "$dir"
  printf "%s\n" "$command" >"$dir/command.txt"
  if [ "$limit" -gt "$left" ]; then
    echo "[call] step $index skipped: it asks ${limit}s, ${left}s left: $command"
    continue
  fi
  echo "[call] step $index at ${SECONDS}s (limit ${limit}s): $command"
  STEP_OUT=$dir timeout "$limit" bash -c "$command" >"$dir/log.txt" 2>&1
  echo "[call] step $index exit $? at ${SECONDS}s"
  tail -n 6 "$dir/log.txt"
  pack
done
pack
echo "[call] packed $(du -h "$out/call.tar.gz" | cut -f1) into call.tar.gz at ${SECONDS}s"
