"""The adaptive policy's host time a step (AdaptivePolicy.plan + observe): time between a step's acceptance read
and the next launch, where the GPU waits for the host. Two tables: by batch size on synthetic outcomes (each row
keeps 0-4 of its drafts at random, the flat step cost, the best of three runs of 200 steps after 30 of warm-up),
and inside the engine at batch 1 (the shipped Qwen3.5 pair with its draft model, six MT-bench questions of 128
tokens, the adaptive engine held to plain steps and free, and free over the questions in the chat template), where a
process that also runs torch's threads pays more per call than the first table shows.

    python -m benchmarks.policy_host_time                     # this checkout
    PYTHONPATH=/path/to/other/checkout python -m benchmarks.policy_host_time --label before   # another, to compare
    python -m benchmarks.policy_host_time --warm-buckets      # a policy that has measured costs in every bucket
    python -m benchmarks.policy_host_time --tree              # offered a static tree too (topk 2, 16 drafts)
    python -m benchmarks.policy_host_time --first-plan        # a new batch's first plan beside the next one

--first-plan: the first plan of a batch of new requests (none observed yet: each row priced from the pooled
figures, in the step that refills the pipeline after a prefill) beside the plan after it (every row's figures kept),
the median of 20 fresh policies."""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import replace

from specdec.speculation.adaptive import AdaptiveConfig, AdaptivePolicy
from specdec.speculation.tree import TreeShape, static_tree_parents

BATCHES = (1, 4, 16, 128, 256, 512)
WARM_UP, STEPS, RUNS = 30, 200, 3


# --warm-buckets: the study's batch sizes, which one process's policy runs in turn (benchmarks.study), so that its
# step costs hold measurements in every bucket as a study's or a long-running server's do
STUDY_BATCHES = (1, 16, 64, 128, 256)
TREE = TreeShape(steps=4, topk=2, max_tokens=16)  # --tree: the study's (benchmarks/study.py TREE)


def seconds_per_step(batch: int, seed: int = 0, warm_buckets: bool = False, tree: bool = False) -> float:
    """The best of RUNS runs: mean seconds of plan + observe over STEPS steps of `batch` rows."""
    return min(one_run(batch, seed, warm_buckets, tree) for _ in range(RUNS))


def first_ranked_path(kept: int) -> list[int]:
    """TREE's path through its first-ranked children, `kept` drafts long: a tree step's outcome as the engine tells
    it (the policy's bookkeeping of a path does not depend on which children it took)."""
    parents, path = static_tree_parents(TREE), [0]
    for _ in range(kept):
        path.append(parents.index(path[-1]))
    return path


def one_run(batch: int, seed: int, warm_buckets: bool = False, tree: bool = False) -> float:
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=4, tree=TREE if tree else None))
    parents = static_tree_parents(TREE)
    paths = [first_ranked_path(k) for k in range(5)]
    if warm_buckets:  # other requests first, WARM_UP steps at each of the study's batch sizes, then finished
        for size in STUDY_BATCHES:
            run_steps(policy, list(range(10**6 * size, 10**6 * size + size)), WARM_UP, seed)
    ids, contexts = list(range(batch)), [300] * batch
    rng = random.Random(seed)
    draws = [[rng.randint(0, 4) for _ in range(batch)] for _ in range(WARM_UP + STEPS)]
    kept = {steps: [[min(d, steps) for d in row] for row in draws] for steps in policy.config.shapes}  # (a tree: 0-4)
    for index in range(WARM_UP + STEPS):
        if index == WARM_UP:
            start = time.perf_counter()
        plan = policy.plan(ids, contexts)
        trees = [(parents, paths[k]) for k in kept[plan.steps][index]] if plan.tree else None
        policy.observe(ids, [plan.steps] * batch, kept[plan.steps][index], 0.02, trees=trees)
    return (time.perf_counter() - start) / STEPS


def run_steps(policy: AdaptivePolicy, ids: list[int], steps: int, seed: int) -> None:
    """`steps` planned and observed steps of these requests (0-4 drafts kept at random), then the requests end."""
    rng = random.Random(seed)
    for _ in range(steps):
        plan = policy.plan(ids, [300] * len(ids))
        policy.observe(ids, [plan.steps] * len(ids), [min(rng.randint(0, 4), plan.steps) for _ in ids], 0.02)
    for rid in ids:
        policy.finish(rid)


def in_engine(held: bool, prompts: int = 6, new_tokens: int = 128, chat: bool = False) -> tuple[float, float, float]:
    """The shipped pair at batch 1 -> (ms a step, us of plan a step, us of observe a step), timed by wrapping the
    policy's methods for the run. chat: the questions in the chat template (as `specdec run` and the server's chat
    endpoint give them), where on a 2-core CPU the draft model's drafts do not pay and the policy settles on plain
    decoding (AdaptivePolicy._settle)."""
    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig
    from specdec.eval.datasets import load_prompts

    texts = [p.text for p in load_prompts("mt-bench", prompts)]
    config = EngineConfig.from_flags(speculation="adaptive")
    if held:
        config = replace(config, adaptive=AdaptiveConfig(collapse=1.01, probe_every=10**9, refresh_every=0))
    llm = LLM("qwen3.5", "small", config=config)
    llm.generate(texts[:1], max_new_tokens=16, chat=chat)  # warm-up
    spent = {"plan": 0.0, "observe": 0.0}
    policy = llm.engine.policy
    for name in spent:
        method = getattr(policy, name)

        def timed(*args, _method=method, _name=name, **kwargs):
            start = time.perf_counter()
            out = _method(*args, **kwargs)
            spent[_name] += time.perf_counter() - start
            return out
        setattr(policy, name, timed)
    steps, start = policy.steps, time.perf_counter()
    for text in texts:
        llm.generate([text], max_new_tokens=new_tokens, chat=chat)
    steps = policy.steps - steps
    return 1e3 * (time.perf_counter() - start) / steps, 1e6 * spent["plan"] / steps, 1e6 * spent["observe"] / steps


def first_plan_ms(batch: int, repeats: int = 20) -> tuple[float, float]:
    """-> (ms of a fresh policy's first plan of `batch` new requests, ms of the next plan of the same requests),
    medians over `repeats` policies."""
    first, second = [], []
    ids, contexts = list(range(batch)), [300] * batch
    for _ in range(repeats):
        policy = AdaptivePolicy(AdaptiveConfig(max_steps=4))
        for times in (first, second):
            start = time.perf_counter()
            policy.plan(ids, contexts)
            times.append(1e3 * (time.perf_counter() - start))
            policy.take_planned()
    return statistics.median(first), statistics.median(second)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--engine", action="store_true", help="the in-engine table too (the shipped pair, ~1 min)")
    parser.add_argument("--tree", action="store_true", help="the policy offered a static tree too (topk 2, 16 "
                        "drafts), each tree step's rows told their paths")
    parser.add_argument("--warm-buckets", action="store_true",
                        help="the policy first runs the study's batch sizes in turn (costs in every bucket)")
    parser.add_argument("--first-plan", action="store_true",
                        help="only the first plan of a batch of new requests, beside the next plan")
    args = parser.parse_args()
    if args.first_plan:
        print(f"| batch | first plan of new requests, ms ({args.label}) | the next plan, ms |")
        print("|---|---|---|")
        for batch in (1, 16, 64, 256):
            first, second = first_plan_ms(batch)
            print(f"| {batch} | {first:.3f} | {second:.3f} |", flush=True)
        return
    warm = ", warmed over the study's batch sizes" if args.warm_buckets else ""
    warm += ", tree offered" if args.tree else ""
    print(f"| batch | plan + observe ms a step ({args.label}{warm}) |")
    print("|---|---|")
    for batch in BATCHES:
        ms = 1e3 * seconds_per_step(batch, warm_buckets=args.warm_buckets, tree=args.tree)
        print(f"| {batch} | {ms:.3f} |", flush=True)
    if args.engine:
        print(f"\n| engine, batch 1 ({args.label}) | ms a step | plan us a step | observe us a step |")
        print("|---|---|---|---|")
        for name, held, chat in (("held to plain steps", True, False), ("adaptive", False, False),
                                 ("adaptive, chat prompts", False, True)):
            step_ms, plan_us, observe_us = in_engine(held, chat=chat)
            print(f"| {name} | {step_ms:.2f} | {plan_us:.1f} | {observe_us:.1f} |", flush=True)


if __name__ == "__main__":
    main()
