"""The adaptive policy's tuned constants (AdaptivePolicy, policy.py), each with the measurement that set it."""

# a collapsed batch's probes come every probe_every plain steps, then twice as far apart after each probe that changed
# nothing, up to PROBE_BACKOFF times probe_every (a probe's drafts cost a wider step for nothing, ~6% of the steps
# at every 16: the H200 study's adaptive rows at acceptance 1.2 ran at 0.85-0.94x plain decoding)
PROBE_BACKOFF = 4
# shadow drafts (observe_shadows): a request's first-draft acceptance over a window of ~1 / (1 - SHADOW_DECAY) plain
# steps; a batch's collapsed rows call a probe when theirs, pooled, lies above the collapse by SHADOW_SURE deviations
SHADOW_DECAY = 0.95
SHADOW_SURE = 1.0
# steps a batch bucket runs before its unmeasured shapes are explored; none is explored or refreshed while the batch is
# smaller than in any of its last EXPLORE_AFTER steps (a shrinking tail passes a bucket in 4-8 steps, where a
# measurement serves a step or two: 2-3% of Nemotron-3-Nano's run at batch 128 in the H100 study of 2026-12-06)
EXPLORE_AFTER = 4
CONTENDER = 0.8  # a shape whose expected rate is within 20% of the best is worth measuring
# ... or within 2x of it while its cost in the batch's bucket is borrowed (a borrowed cost was 1.6-3x off in the H200
# study and on the CPU). 0.7 (2026-12-03): replayed 0.01-0.02 up at three points; the CPU eval of the draft model read
# 1.01x / 0.98x of plain at batch 1 / 4 against 0.98x / 1.09x at 0.5, within its noise: kept until a study row tells.
BORROWED_CONTENDER = 0.5
# a measured shape is refreshed where its expected rate is within 10% of the best (_contender): in the H100 study of
# 2026-12-06 21:00 UTC at 1.2 accepted and batch 64, 19 of the 21 drafting steps of adaptive's timed runs were refreshes
# at 0.80-0.90 of plain decoding's rate (11 in three runs of Nemotron-3-Nano, 0.988x of plain; 8 in two of Qwen3.5-9B,
# 0.993x); replayed at 0.9 against 0.8, 9 of the 16 points rose by 0.05-0.4%, 3 fell by at most 0.09%
# (benchmarks/results/adaptive_replay_refresh_contender_cpu_2026-12-06.md). Plain decoding, the shape to fall back to,
# keeps CONTENDER: where a noisy machine's costs (the CPU eval's) make a chain look best, it is still re-measured
REFRESH_CONTENDER = 0.9
# ... but a shape measured once is a contender at REFRESH_CONTENDER where that step cost at most this much more than
# the bucket's other measured shapes make of it (_contender)
SINGLE_TRUSTED = 1.2
# refreshes that confirm the best shape come twice as far apart, up to REFRESH_BACKOFF times refresh_every (each
# costs a step of a worse shape and, between plain steps, the pipeline's refill: at batch 256 the H200 study's
# refreshes every 16 steps cost ~5% of plain decoding's tokens/s; at 1.2 accepted and batch 64 in the H100 study of
# 2026-12-06 10:09 UTC, refreshes of 2-chains and trees every 64 steps cost ~1%: 8, replayed, lifted those points by
# 0.4% and moved no other by more than 0.1%: benchmarks/results/adaptive_replay_refresh_backoff_cpu_2026-12-06.md)
REFRESH_BACKOFF = 8
# the memory of the acceptance pooled over requests, a new request's prior (per observation of a position: ~100 rows)
POPULATION_DECAY = 0.99
# steps a shape chosen to be measured is held for until a step of it teaches a cost (the engine times only pipelined
# plain steps, from the third of a run on, and a new bucket's first measurement is dropped: four plain steps)
MEASURE_FOR = 4
# the drafting steps a drafter's catch-up is spread over when a drafting shape is priced (CatchUpCost): it is paid
# once, by the first of a run of drafting steps, and a run lasts at least the steps a measured shape is held for
CATCH_UP_STEPS = MEASURE_FOR
# a settled plain run (plain decoding the best by SETTLED_MARGIN even at every drafting shape's hopeful rate, every row
# worth drafting for, no shape being measured and no refresh due) is planned in full every SETTLED_REPLAN steps and
# plainly in between: on a CPU the policy's Python runs in series with the model, 0.13 ms a step of the shipped draft
# model's pair at batch 1 (8.4 ms plain steps), and adaptive held to plain steps read 0.975x of plain decoding where a
# second plain engine read 0.993x (benchmarks/results/eval_cpu_draft_model_80_prompts_2026-12-07/)
SETTLED_REPLAN = 8
SETTLED_MARGIN = 1.1
