"""What a step costs: a prior (the roofline of the target's verify step, specdec/eval/step_cost.py, or flat) times a
factor learnt from measured step times per (batch bucket, width), so the drafter's own work, the host and whatever
the roofline leaves out are in it once a width has been measured."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

StepCostPrior = Callable[[int, int, float], float]  # (batch, width = nodes per row, mean context) -> seconds
StepRows = Callable[[int], int]  # requests -> the rows their step runs (a CUDA graph's batch: padded up to a bucket)


def unpadded(batch: int) -> int:
    """Steps without graphs run the batch's own rows."""
    return batch


def flat_prior(batch: int, width: int, context: float) -> float:
    """No model of the step: every shape costs the same until measured (the policy measures each shape first)."""
    return 1e-3


def batch_bucket(batch: int) -> int:
    """Batches grouped by powers of two: 1, 2, 4, 8, ..."""
    return 1 << (batch - 1).bit_length()


class StepCost:
    """seconds(batch, width, context) = prior(...) * factor[(bucket, width)]. A factor is the mean of the last `window`
    measured / prior ratios of its (bucket, width), leaving out those over `stall` times their median. The mean, since
    what a shape's steps cost in a run is their sum: a KVBuffer step in which rows fold their buffers costs more (on
    the H200 at 256 rows of Qwen3.5-9B, 16.7 against 11.9 ms), and rows that decode together fold together, in a few
    steps of every flush_length (16); the lower median of five, this factor before, took plain decoding at those
    steps' cost when they filled its window (15.4 ms where plain decoding costs 12.7 amortised) and 1-chains ran at
    0.92x of it for the rest of the batch (adaptive_h200_2026-12-04g; replayed with folds, benchmarks.adaptive_replay
    --fold-us 52: 0.90-0.94x, 0.97x with this mean). The window spans a flush cycle of the default flush length. A
    stall (a prefill, a shrinking batch's bookkeeping, the machine busy elsewhere) is left out of the mean, so that a
    shape that no longer wins is not priced at it until run again to wash it out (the H200 study of 2026-12-02: plain
    decoding at batch 256 priced 1.4x its cost after one stalled warm-up step, and never chosen again). Each (bucket,
    width)'s first measurement is a warm-up and dropped (CUDA graph capture, first-call allocations), and a
    measurement is clipped to `clip` times the current estimate (the borrowed one for a first measurement). An
    unmeasured (bucket, width) borrows: from the nearest width measured in its bucket, scaled by how the two widths'
    factors compare in the nearest bucket that measured both (the bucket sets the level, another
    bucket the relation between widths: a drafting step's factor holds the drafter's work, a plain step's none, and
    on the CPU with the flat prior a plain step borrowing a 4-chain's factor as it stood looked as dear as the chain,
    3x its cost, and was never tried at batch 4 again); without such a bucket, that width's factor as it stands;
    else the same width's in the nearest bucket, else the mean of all, else 1. The same bucket first, since a
    step's overheads do not scale with the batch as its roofline does (on the H200, Nemotron-3-Nano's plain step is
    2.4x its roofline at batch 1 and 1.3x at 128, BENCHMARKS.md: borrowed across buckets, plain decoding looked 2.6x
    dearer than it was at batch 16).

    A batch is priced at the rows its step runs (`rows`: under CUDA graphs the captured batch it pads up to), since
    that is what it costs: priced at its own size, the steps of a shrinking batch's tail (229 requests in a graph of
    256) taught their bucket a factor 14% too dear, and the H200 study of 2026-12-04 (Qwen3.5-9B, batch 256) then
    kept drafting 2-chains at 0.85x the plain steps' tokens/s."""

    def __init__(self, prior: StepCostPrior = flat_prior, window: int = 16, clip: float = 3.0,
                 rows: StepRows = unpadded, stall: float = 2.0):
        if window < 1 or clip <= 1.0 or stall <= 1.0:
            raise ValueError(f"need window >= 1, clip > 1 and stall > 1, got {window}, {clip} and {stall}")
        self.prior = prior
        self.rows = rows
        self.window = window
        self.clip = clip
        self.stall = stall
        self.factors: dict[tuple[int, int], float] = {}
        self.ratios: dict[tuple[int, int], deque[float]] = {}  # the last `window` kept ratios
        self.samples: dict[tuple[int, int], int] = {}  # measurements seen, the dropped warm-up included
        # the same by width: width -> {bucket: measurements} (the policy counts a shape's buckets in every plan)
        self.samples_by_width: dict[int, dict[int, int]] = {}
        self.kept_by_width: dict[int, int] = {}  # width -> measurements kept over every bucket (warm-ups left out)

    def seconds(self, batch: int, width: int, context: float) -> float:
        rows = self.rows(batch)
        return self.prior(rows, width, context) * self.factor(batch_bucket(rows), width)

    def factor(self, bucket: int, width: int) -> float:
        if (bucket, width) in self.factors:
            return self.factors[(bucket, width)]
        return self.borrowed(bucket, width)

    def borrowed(self, bucket: int, width: int) -> float:
        """The factor (bucket, width) borrows while it is not measured, as the class says; of a measured one, what it
        would borrow without its own measurements (what the others make of it: AdaptivePolicy._contender)."""
        others = self.factors
        if (bucket, width) in others:  # (a copy only then: an unmeasured shape borrows in every plan)
            others = {key: f for key, f in others.items() if key != (bucket, width)}
        in_bucket = sorted((abs(w - width), w) for (b, w) in others if b == bucket)
        for _, near in in_bucket:  # a measured width of this bucket, and the two widths' relation elsewhere
            both = [(abs(b.bit_length() - bucket.bit_length()), b) for (b, w) in others
                    if w == width and (b, near) in others]
            if both:
                other = min(both)[1]
                return others[(bucket, near)] * others[(other, width)] / others[(other, near)]
        if in_bucket:
            return others[(bucket, in_bucket[0][1])]
        same_width = [(abs(b.bit_length() - bucket.bit_length()), f) for (b, w), f in others.items() if w == width]
        if same_width:
            return min(same_width)[1]
        return sum(others.values()) / len(others) if others else 1.0

    def measured_in(self, bucket: int, width: int) -> int:
        """Measurements of this width kept in this batch bucket."""
        return max(self.samples.get((bucket, width), 0) - 1, 0)

    def observe(self, batch: int, width: int, context: float, seconds: float) -> None:
        rows = self.rows(batch)
        key = (batch_bucket(rows), width)
        self.samples[key] = self.samples.get(key, 0) + 1
        self.samples_by_width.setdefault(width, {})[key[0]] = self.samples[key]
        if self.samples[key] == 1:
            return
        self.kept_by_width[width] = self.kept_by_width.get(width, 0) + 1
        ratio = seconds / self.prior(rows, width, context)
        if self.factors:  # (the very first factor has nothing to be held against)
            ratio = min(ratio, self.clip * self.factor(*key))
        ratios = self.ratios.setdefault(key, deque(maxlen=self.window))
        ratios.append(ratio)
        median = sorted(ratios)[(len(ratios) - 1) // 2]
        kept = [r for r in ratios if r <= self.stall * median]
        self.factors[key] = sum(kept) / len(kept)


class CatchUpCost:
    """What a drafter's backlog costs: seconds(tokens) = fixed + per_token * tokens for the tokens it must read
    before it can draft (a draft model's tokens of the steps it sat out, and the prompts of requests that never
    drafted: drafters/draft_model.py's catch-up), fitted by least squares (both terms >= 0) to the last `window`
    samples, each the excess of a drafting step with a backlog over that shape's step cost; 0 until sampled. Affine,
    not proportional: on the CPU the shipped draft model reads 17-39 tokens of roots in 5-9 ms and 275-421 tokens of
    prompts in 25-35 ms (the eval at batch 4), so a per-token median priced a prompt's read at 3x its cost. A drafting
    step after plain ones pays it (there: 38-74 ms where the same shape's steps take 24-37 and a plain step 10), and a
    step cost learnt from such steps would price every drafting step as if it did."""

    def __init__(self, window: int = 8):
        self.samples: deque[tuple[int, float]] = deque(maxlen=window)  # (tokens, excess seconds)

    def seconds(self, tokens: int) -> float:
        if tokens <= 0 or not self.samples:
            return 0.0
        fixed, per_token = self.fit()
        return fixed + per_token * tokens

    def fit(self) -> tuple[float, float]:
        """(fixed, per_token): least squares over the samples; one token count alone, or a negative slope: the mean
        excess per token as the slope alone (a cost that grows with the tokens, at least at the sampled counts)."""
        tokens = [t for t, _ in self.samples]
        excess = [e for _, e in self.samples]
        n = len(tokens)
        mean_t, mean_e = sum(tokens) / n, sum(excess) / n
        spread = sum((t - mean_t) ** 2 for t in tokens)
        slope = sum((t - mean_t) * (e - mean_e) for t, e in self.samples) / spread if spread else -1.0
        if slope < 0:
            return 0.0, mean_e / mean_t
        return max(mean_e - slope * mean_t, 0.0), slope

    def observe(self, tokens: int, excess_seconds: float) -> None:
        if tokens > 0:
            self.samples.append((tokens, max(excess_seconds, 0.0)))
