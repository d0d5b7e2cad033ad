"""Adaptive speculation replayed on the CPU against step times measured on a GPU: a development tool for the policy
(specdec/speculation/adaptive), so that a change to it is checked against a device's costs before device time is
spent on a study row. It simulates what `benchmarks.study --only kvbuffer adaptive` runs: per batch size (in the
study's order, one policy throughout), a warm-up round of requests of flush_length + 8 tokens, then B requests of
NEW_TOKENS each, all started together, the batch shrinking as they end; each step's time looked up in a table of
measured step times, each draft kept as SyntheticAcceptance keeps it (a draw fixed per text and position: every
engine meets the same texts). Plain decoding and fixed 4-chains run the same way beside it. What it leaves out:
the host's own time (the plans, the bookkeeping) and the noise of a real device, so it ranks policies; it does not
replace a study row.

The step times: the median measured time of each (batch, step width) among the full-batch steps of the policy
traces that `benchmarks.study --policy-trace` writes (benchmarks/results/policy_traces_h200/; pipelined plain
steps, the warm-up round's included, each shape's first step of a run left out); a width a batch never ran is
interpolated (or extrapolated) linearly from its neighbours, a batch between two measured ones linearly. A step
costs the batch its rows pad up to, as under the engine's CUDA graphs (specdec/runner/cuda_graphs.py: a shrinking
batch of 229 requests replays the graph of 256), and the policy is told so (StepCost's rows). The first
plain step after a speculative one pays the pipeline's refill (REFILL of a plain step: the H200 traces of
2026-12-02 show 15-20%) and, like the second, teaches the policy no cost, as in the engine. With --fold-us the
KVBuffer's folds are simulated too: each row's buffer takes the entries its steps commit and folds at flush_length,
costing the step that much more per folding row, so that rows decoding together fold in the same steps, as they do
on the device (adaptive_h200_2026-12-04g: plain decoding at 256 rows of Qwen3.5-9B, three steps of every 16 at 1.4x).

Checked against the H200 rows of 2026-12-02 (the policy of main 0fbc348, the third adaptive rows in BENCHMARKS.md):
the replay chose the same shapes in the same shares within ~10 points and put adaptive / best within ~0.05 of the
measured ratio at most points, optimistic by a few percent; it missed the worst measured points (Nemotron-3-Nano at
batch 1: 0.88x replayed, 0.62x measured; Qwen3.5-9B at 16 and 256: 0.99x and 0.95x replayed, 0.87x and 0.88x
measured), where a run's luck and the host's time weigh more than the step times.

With --trees the study's tree (--topk 2, 16 drafts) is offered to the policy beside the chains and replayed as a
fixed shape of its own, its paths drawn as SyntheticAcceptance draws them (a level's draw keeps the first-ranked
child with the chain's alpha, a later sibling with --sibling); its step times, which no policy trace holds yet, come
from the fixed tree rows of the study files given to --study-rows (their full-batch step ms), whose plain and 4-chain
rows replace the traces' times of those widths (give the traces of the same sitting: --traces).

With --shadow-drafts the policy is told each plain step's shadow drafts (AdaptivePolicy.observe_shadows: whether a
row's first draft would have been kept, the draw at its position), as the engine tells them for a drafter that
drafts for nothing (n-gram, the study's synthetic one).

    python -m benchmarks.adaptive_replay --model qwen3.5-9b --accepted-length 2.72 [--fold-us 52] [--shadow-drafts]
    python -m benchmarks.adaptive_replay --model qwen3.5-9b --accepted-length 2.72 --batches 1 16 --trees \
        --traces benchmarks/results/adaptive_h200_2026-12-05g/trace_qwen3.5-9b_b1-16.jsonl.gz \
        --study-rows benchmarks/results/adaptive_h200_2026-12-05g/study_qwen3.5-9b_b1-16_*.json --new-tokens 256
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path

from specdec.eval.step_cost import H200, roofline_step_cost
from specdec.eval.synthetic import SIBLING_ACCEPTANCE, SyntheticAcceptance, TextCoins, ranked_child
from specdec.models.real_shapes import SHAPES
from specdec.runner.cuda_graphs import batch_buckets, padded_batch
from specdec.speculation.adaptive import AdaptiveConfig, AdaptivePolicy
from specdec.speculation.adaptive.tree_yield import child_lists
from specdec.speculation.tree import TreeShape, static_tree_parents

TRACES = Path("benchmarks/results/policy_traces_h200")
NEW_TOKENS, PROMPT_TOKENS, FLUSH_LENGTH, WARMUP_TOKENS = 64, 128, 16, 8
REFILL = 0.15
CHAIN = 4  # the fixed shape, and the longest adaptive chain
TREE = TreeShape(steps=CHAIN, topk=2, max_tokens=16)  # --trees: the study's tree (benchmarks/study.py TREE)
# a study row's mode -> the step width it measures (--study-rows: plain decoding, fixed 4-chains, the tree)
ROW_WIDTHS = {"plain": 1, "speculative": CHAIN + 1, "tree": TREE.budget + 1}

StepTime = Callable[[int, int], float]  # (rows, width) -> seconds
Draws = Callable[[int, int], float]  # (text, position) -> a uniform draw: the draft there is kept iff it is < alpha


def text_draws(seed: int) -> Draws:
    """A uniform draw fixed per (text, position), the study's own (TextCoins): every engine and shape meets the same
    texts."""
    coins = TextCoins(seed)
    return lambda text, position: coins.at(text, position, 1)[0]


class MeasuredSteps:
    """Step times (ms) per (batch, width) -> seconds at any rows and width: linear in the rows between measured
    batches, and in the width between (and past) measured widths."""

    def __init__(self, table: dict[int, dict[int, float]]):
        if not table:
            raise ValueError("no step times: give traces of timed full-batch steps (benchmarks.study --policy-trace)")
        self.table = {batch: dict(sorted(widths.items())) for batch, widths in sorted(table.items())}
        self.batches = list(self.table)

    @classmethod
    def from_traces(cls, paths: list[Path], fold_ms: float = 0.0) -> MeasuredSteps:
        """fold_ms: what a row's fold costs a step (Folds); a drafting step's median holds its share of folds spread
        over its rows (each folds once in flush_length entries), which is taken out so that the replay adds the
        folds it simulates instead. A plain step's median is a step without folds: rows that decode together fold
        together, in a few steps of every flush_length."""
        times: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for path in paths:
            seen = set()
            with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as lines:
                for line in lines:
                    entry = json.loads(line)
                    key = (entry["batch"], entry["steps"] + 1)
                    if entry["measured_ms"] and entry["batch"] == entry["batch_size"]:
                        if key in seen:  # (each shape's first step of a run: its warm-up, as the policy drops it)
                            spread = (fold_ms * (entry["batch"] + entry["accepted"]) / FLUSH_LENGTH
                                      if fold_ms and entry["steps"] else 0.0)
                            times[key[0]][key[1]].append(entry["measured_ms"] - spread)
                        seen.add(key)
        return cls({batch: {width: statistics.median(values) for width, values in widths.items()}
                    for batch, widths in times.items()})

    def with_study_rows(self, paths: list[Path], model: str) -> MeasuredSteps:
        """These step times with the full-batch step ms of the study rows in `paths` (benchmarks.study's JSON) of
        `model` put over them: plain, fixed 4-chain and fixed tree rows (ROW_WIDTHS), the median over files (a
        fixed engine's steps of one width a run, against the traces' few steps of each width among the others)."""
        found: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
        for path in paths:
            result = json.loads(path.read_text())
            if result["model"] != model:
                continue
            for row in result["rows"]:
                if row["mode"] in ROW_WIDTHS and not row.get("out_of_memory") and row.get("full_batch_step_ms"):
                    found[row["batch_size"]][ROW_WIDTHS[row["mode"]]].append(row["full_batch_step_ms"])
        table = {batch: dict(widths) for batch, widths in self.table.items()}
        for batch, widths in found.items():
            for width, values in widths.items():
                table.setdefault(batch, {})[width] = statistics.median(values)
        return MeasuredSteps(table)

    def at_batch(self, batch: int, width: int) -> float:
        widths = self.table[batch]
        known = list(widths)
        if width in widths:
            return widths[width]
        above = bisect_left(known, width)
        if above == 0 or len(known) == 1:
            return widths[known[min(above, len(known) - 1)]]
        low, high = (known[-2], known[-1]) if above == len(known) else (known[above - 1], known[above])
        share = (width - low) / (high - low)
        return (1 - share) * widths[low] + share * widths[high]

    def __call__(self, rows: int, width: int) -> float:
        above = bisect_left(self.batches, rows)
        if above == len(self.batches):
            return self.at_batch(self.batches[-1], width) / 1e3
        if self.batches[above] == rows or above == 0:
            return self.at_batch(self.batches[above], width) / 1e3
        low, high = self.batches[above - 1], self.batches[above]
        share = (rows - low) / (high - low)
        return ((1 - share) * self.at_batch(low, width) + share * self.at_batch(high, width)) / 1e3


def graph_rows(max_batch: int) -> Callable[[int], int]:
    """rows -> the batch of the graph a step of them replays, for an engine of up to max_batch requests."""
    return partial(padded_batch, batch_buckets(max_batch))


def tree_path(parents: list[int], kids: list[list[int]], alpha: float, sibling: float, draw) -> list[int]:
    """A static tree's kept path, root first, as SyntheticAcceptance draws it: at each level draw(level) keeps a
    child by rank (ranked_child), the path ending where the child kept is not in the tree."""
    path = [0]
    while kids[path[-1]]:
        rank = ranked_child(draw(len(path) - 1), alpha, sibling, len(kids[path[-1]]))
        if rank is None:
            break
        path.append(kids[path[-1]][rank])
    return path


def run_batch(step_time: StepTime, batch: int, tokens: int, alpha: float, draws: Draws,
              policy: AdaptivePolicy | None = None, chain: int = 0, first_id: int = 0,
              refill: float = REFILL, rows: Callable[[int], int] = lambda rows: rows,
              fold_seconds: float = 0.0, shadows: bool = False, tree: TreeShape | None = None,
              sibling: float = SIBLING_ACCEPTANCE) -> tuple[int, float]:
    """B requests of `tokens` new tokens each to the end (request first_id + i on text i), every step planned by
    `policy` (else `chain` drafts per row, 0 for plain decoding, or every step `tree` where chain is 0 and a tree is
    given), each costing the rows it runs (`rows`: the graph batch it pads up to) and fold_seconds for each row whose
    buffer folds in it: a row's buffer (empty after its prompt) takes the entries its steps commit, one a plain step,
    the kept drafts and the root a drafting step, and folds when it would reach FLUSH_LENGTH, as the KVBuffer's
    does. A tree step's rows keep the path tree_path draws (sibling: a later sibling's acceptance). shadows: each
    plain step's rows told the policy whether their first draft would have been kept
    (AdaptivePolicy.observe_shadows: a drafter whose drafts cost nothing). -> (tokens emitted, seconds)."""
    left = {first_id + i: tokens for i in range(batch)}
    buffered = dict.fromkeys(left, 0)
    emitted, seconds, plain_run, pending = 0, 0.0, 0, None
    tree = tree or (policy.config.tree if policy is not None else None)
    parents = static_tree_parents(tree) if tree is not None else []
    kids = child_lists(parents)
    while left:
        ids = list(left)
        contexts = [PROMPT_TOKENS + tokens - left[rid] for rid in ids]
        if policy is not None:
            plan = policy.plan(ids, contexts)
            steps, tree_step = plan.steps, plan.tree
        else:
            steps, tree_step = (chain, False) if chain or tree is None else (tree.budget, True)
        plain_run = plain_run + 1 if steps == 0 else 0
        cost = step_time(rows(len(ids)), steps + 1) * (1 + refill if plain_run == 1 and policy is not None else 1)
        kept, paths = [], []
        for rid, context in zip(ids, contexts, strict=True):
            if tree_step:
                paths.append(tree_path(parents, kids, alpha, sibling,
                                       lambda level, rid=rid, context=context: draws(rid - first_id, context + level)))
                k = len(paths[-1]) - 1
            else:
                k = 0
                while k < steps and draws(rid - first_id, context + k) < alpha:
                    k += 1
            kept.append(k)
            out = min(k + 1, left[rid])
            emitted += out
            left[rid] -= out
            folds = buffered[rid] + k + 1 >= FLUSH_LENGTH
            buffered[rid] = 0 if folds else buffered[rid] + k + 1
            cost += fold_seconds * folds
        seconds += cost
        if policy is not None:  # told as the engine tells it (Engine.hold_outcome): a drafting step's outcome after
            if pending is not None:  # the next plan, a plain step's at once; plain steps timed from a run's third
                policy.observe(*pending)
                pending = None
            outcome = (ids, [steps] * len(ids), kept, cost if steps > 0 or plain_run >= 3 else None)
            if steps > 0:
                trees = [(parents, path) for path in paths] if tree_step else None
                pending = (*outcome, policy.take_planned(), trees)
            else:
                policy.observe(*outcome)
                if shadows and policy.wants_shadows:
                    policy.observe_shadows(ids, [draws(rid - first_id, context) < alpha
                                                 for rid, context in zip(ids, contexts, strict=True)])
        finished = [rid for rid in ids if left[rid] == 0]
        if finished and pending is not None:  # (before the policy forgets its requests)
            policy.observe(*pending)
            pending = None
        for rid in finished:
            del left[rid]
            if policy is not None:
                policy.finish(rid)
    return emitted, seconds


def replay(step_time: StepTime, batches: list[int], accepted_length: float, prior: Callable | None = None,
           seed: int = 0, new_tokens: int = NEW_TOKENS, fold_seconds: float = 0.0,
           shadows: bool = False, trees: bool = False, sibling: float = SIBLING_ACCEPTANCE,
           optimism: float | None = None) -> list[dict]:
    """The study's rows per batch (plain, fixed 4-chains, with `trees` the fixed tree, and adaptive, offered the
    tree too) in tokens/s, with the adaptive shapes; fold_seconds: each row's fold, shadows: the plain steps' shadow
    drafts told, sibling: a tree's later sibling's acceptance (run_batch); optimism: the policy's (AdaptiveConfig;
    None: its default)."""
    alpha = SyntheticAcceptance(accepted_length).alpha(CHAIN)
    draws = text_draws(seed)
    padded = partial(run_batch, rows=graph_rows(max(batches)), fold_seconds=fold_seconds, shadows=shadows,
                     sibling=sibling)
    knobs = {} if optimism is None else {"optimism": optimism}
    policy = AdaptivePolicy(AdaptiveConfig(max_steps=CHAIN, tree=TREE if trees else None, **knobs),
                            **({"prior": prior} if prior else {}), step_rows=graph_rows(max(batches)))
    rows, next_id = [], 0
    for batch in batches:
        padded(step_time, batch, FLUSH_LENGTH + WARMUP_TOKENS, alpha, draws, policy, first_id=next_id)
        next_id += batch
        before = policy.counts.copy()
        tokens, seconds = padded(step_time, batch, new_tokens, alpha, draws, policy, first_id=next_id)
        next_id += batch
        shapes = policy.counts - before
        fixed = {"plain": padded(step_time, batch, new_tokens, alpha, draws),
                 "fixed": padded(step_time, batch, new_tokens, alpha, draws, chain=CHAIN)}
        if trees:
            fixed["tree"] = padded(step_time, batch, new_tokens, alpha, draws, tree=TREE)
        rates = {name: emitted / spent for name, (emitted, spent) in fixed.items()}
        best = max(rates.values())
        rates["adaptive"] = tokens / seconds
        total = sum(shapes.values())
        rows.append({"batch": batch, **rates, "of_best": rates["adaptive"] / best,
                     "shapes": {label: count / total for label, count in shapes.most_common()}})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(SHAPES), required=True)
    parser.add_argument("--accepted-length", type=float, required=True, help="synthetic acceptance to replay at")
    parser.add_argument("--traces", type=Path, nargs="+", default=None,
                        help="policy traces of the model (default: every trace of it in " + str(TRACES) + ")")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64, 128, 256])
    parser.add_argument("--seeds", type=int, default=5, help="replays averaged per row")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="tokens per request (the study's "
                        "--new-tokens): the ragged end of a batch weighs less in longer runs")
    parser.add_argument("--fold-us", type=float, default=0.0,
                        help="what a row's fold adds to a step, all layers (0: folds not simulated; Qwen3.5-9B at "
                             "batch 256 on the H200: ~52, the lockstep plain steps' excess, adaptive_h200_2026-12-04g)")
    parser.add_argument("--trees", action="store_true",
                        help="offer the study's tree (--topk 2, 16 drafts) to the policy, and replay it fixed too")
    parser.add_argument("--sibling", type=float, default=SIBLING_ACCEPTANCE,
                        help="a tree's later sibling's acceptance (the synthetic drafts'; default %(default)s)")
    parser.add_argument("--study-rows", type=Path, nargs="+", default=[],
                        help="benchmarks.study JSON files whose plain, fixed 4-chain and fixed tree rows give the "
                             "step times the traces lack (the tree's, with --trees)")
    parser.add_argument("--shadow-drafts", action="store_true",
                        help="the plain steps' rows tell the policy whether their first draft would have been kept "
                             "(a drafter that drafts for nothing: n-gram, synthetic)")
    parser.add_argument("--optimism", type=float, default=None,
                        help="the policy's optimism (AdaptiveConfig: deviations above a row's acceptance estimate it "
                             "is priced at; default: the config's)")
    args = parser.parse_args()
    paths = args.traces or sorted(TRACES.glob(f"trace_{args.model}*.jsonl*"))
    steps = MeasuredSteps.from_traces(paths, args.fold_us * 1e-3).with_study_rows(args.study_rows, args.model)
    if args.trees and any(TREE.budget + 1 not in steps.table.get(batch, {}) for batch in args.batches):
        parser.error(f"--trees needs the tree's step time (width {TREE.budget + 1}) at every batch replayed: give "
                     "--study-rows with its fixed tree rows (benchmarks.study --only kvbuffer tree)")
    prior = roofline_step_cost(SHAPES[args.model][0](), H200, FLUSH_LENGTH)
    runs = [replay(steps, args.batches, args.accepted_length, prior, seed, args.new_tokens,
                   fold_seconds=args.fold_us * 1e-6, shadows=args.shadow_drafts, trees=args.trees,
                   sibling=args.sibling, optimism=args.optimism) for seed in range(args.seeds)]
    sources = [p.name for p in paths] + [p.name for p in args.study_rows]
    print(f"{args.model}, accepted {args.accepted_length}, step times from {', '.join(sources)}; mean of "
          f"{args.seeds} replays of {args.new_tokens} tokens a request (simulated: no host time, no noise)")
    names = ("plain", "fixed", "tree", "adaptive") if args.trees else ("plain", "fixed", "adaptive")
    print(f"| batch | {' | '.join(f'{name} tok/s' for name in names)} | adaptive / best | worst replay | "
          "shapes (seed 0) |")
    print("|---|" + "---|" * (len(names) + 3))
    for index, batch in enumerate(args.batches):
        mean = {key: statistics.mean(run[index][key] for run in runs) for key in names}
        of_best = statistics.mean(run[index]["of_best"] for run in runs)
        worst = min(run[index]["of_best"] for run in runs)
        shapes = ", ".join(f"{label} {share:.0%}" for label, share in runs[0][index]["shapes"].items())
        print(f"| {batch} | {' | '.join(f'{mean[name]:.0f}' for name in names)} | {of_best:.2f}x | {worst:.2f}x | "
              f"{shapes} |")


if __name__ == "__main__":
    main()
