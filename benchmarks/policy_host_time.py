"""The adaptive policy's host time a step (AdaptivePolicy.plan + observe), by batch size: time between a step's
acceptance read and the next launch, where the GPU waits for the host. Synthetic outcomes (each row keeps 0-4 of
its drafts at random), the flat step cost, the best of three runs of 200 steps after 30 of warm-up.

    python -m benchmarks.policy_host_time                     # this checkout
    PYTHONPATH=/path/to/other/checkout python -m benchmarks.policy_host_time --label before   # another, to compare
"""

from __future__ import annotations

import argparse
import random
import time

from specdec.speculation.adaptive import AdaptiveConfig, AdaptivePolicy

BATCHES = (1, 4, 16, 128, 256, 512)
WARM_UP, STEPS, RUNS = 30, 200, 3


def seconds_per_step(batch: int, seed: int = 0) -> float:
    """The best of RUNS runs: mean seconds of plan + observe over STEPS steps of `batch` rows."""
    return min(one_run(batch, seed) for _ in range(RUNS))


def one_run(batch: int, seed: int) -> float:
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4))
    ids, contexts = list(range(batch)), [300] * batch
    rng = random.Random(seed)
    draws = [[rng.randint(0, 4) for _ in range(batch)] for _ in range(WARM_UP + STEPS)]
    kept = {steps: [[min(d, steps) for d in row] for row in draws] for steps in policy.config.shapes}
    for index in range(WARM_UP + STEPS):
        if index == WARM_UP:
            start = time.perf_counter()
        plan = policy.plan(ids, contexts)
        policy.observe(ids, [plan.steps] * batch, kept[plan.steps][index], 0.02)
    return (time.perf_counter() - start) / STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="this checkout")
    args = parser.parse_args()
    print(f"| batch | plan + observe ms a step ({args.label}) |")
    print("|---|---|")
    for batch in BATCHES:
        print(f"| {batch} | {1e3 * seconds_per_step(batch):.3f} |", flush=True)


if __name__ == "__main__":
    main()
