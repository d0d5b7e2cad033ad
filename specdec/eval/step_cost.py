"""The adaptive policy's prior step cost (specdec/speculation/adaptive/step_cost.py) from the roofline of the target's
step (specdec/eval/roofline.py): what the policy assumes of a (batch, width) it has not measured yet. It leaves out
the drafter and the host, which the policy's measured factors bring in."""

from __future__ import annotations

import torch

from specdec.eval.peaks import Peaks, measure_peaks
from specdec.eval.roofline import Workload, roofline
from specdec.parallel import broadcast_object
from specdec.speculation.adaptive import StepCostPrior

# the ceilings assumed when none are measured: the H200 of 2026-11-29 (specdec/eval/peaks.py), and a nominal CPU
H200 = Peaks(4.27e12, 790e12, "H200, measured 2026-11-29")
CPU = Peaks(20e9, 200e9, "a nominal CPU")


def roofline_step_cost(config, peaks: Peaks, flush_length: int = 16, dtype_bytes: int = 2) -> StepCostPrior:
    """(batch, width, mean context) -> seconds of the target's step of `batch` rows of `width` nodes (config: the
    target's transformers config). The roofline is computed on a grid of batches (grid_points: powers of two and
    the midpoints between them; memoised per (batch, width, context rounded up to a power of two)) and interpolated
    linearly between its points: a roofline costs 1.5-2.6 ms of Python at real shapes (specdec/eval/roofline.py),
    and the policy plans every step of a batch that shrinks one request at a time; priced per exact batch, the
    plans of a shrinking batch's tail took ~10 ms a step on the H200 (2026-12-02, 32 layers), more than the steps.
    A step's bytes and FLOPs are affine in its rows, but for the GEMMs turning compute-bound (a kink at ~185 tokens
    on the H200) and a MoE layer's distinct experts (concave): on the grid's chords the real shapes' rooflines stay
    within 1.2% but at that kink, 7% for Qwen3.5-9B at 39 rows of 5 nodes (powers of two alone: 11%); the measured
    factors take up the rest."""
    memo: dict[tuple[int, int, int], float] = {}

    def at(batch: int, width: int, bucket: int) -> float:
        key = (batch, width, bucket)
        if key not in memo:
            work = Workload(batch=batch, nodes=width, flush_length=flush_length, context=float(bucket),
                            dtype_bytes=dtype_bytes)
            memo[key] = roofline(config, work, peaks).ms_per_step / 1e3
        return memo[key]

    def seconds(batch: int, width: int, context: float) -> float:
        bucket = 1 << max(int(context), 1).bit_length()
        low, high = grid_points(batch)
        if batch == low:
            return at(low, width, bucket)
        share = (batch - low) / (high - low)
        return (1 - share) * at(low, width, bucket) + share * at(high, width, bucket)

    return seconds


def grid_points(batch: int) -> tuple[int, int]:
    """The grid points around `batch` (low <= batch < high) of the grid 1, 2, 3, 4, 6, 8, 12, 16, ...: powers of two
    and the midpoints between them."""
    power = 1 << (max(batch, 1).bit_length() - 1)
    middle = power + power // 2
    if power < 2:
        return power, 2
    return (power, middle) if batch < middle else (middle, 2 * power)


def with_device_prior(llm, peaks: Peaks | None = None) -> None:
    """Give an adaptive engine's policy the roofline of its target's step at `peaks` (`specdec bench`: the run's,
    measured once) or, without, at the peaks measured on its GPU now (measure_peaks: about a second, 2 GiB for that
    while; `specdec run`, `serve` and `eval` call it once the engine is built). Without peaks on the CPU, or where the
    measurement does not fit beside the weights, the flat prior stands (every shape measured before it is trusted;
    the CPU eval's). Why on a GPU: under the flat prior a batch size not seen yet borrows another's step time as it
    stands, whatever its rows (a chain at 64 rows priced as at 16 until it has run there); the roofline scales it.
    Before 2026-12-06 only bench and the study had it, so the GPU study measured the policy under a prior the
    commands' users did not get. The prior's flush length is the engine's (1 for the intermediate-state baseline)."""
    policy, model = llm.engine.policy, llm.model
    if policy is None:
        return
    tp = model.tp
    if peaks is None and model.device.type == "cuda" and tp.rank == 0:
        try:
            peaks = measure_peaks(model.device, model.dtype)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
    if tp.size > 1:  # every rank's policy prices shapes alike: at rank 0's peaks (its own or given), or none
        peaks = broadcast_object(peaks, tp)
    if peaks is None:
        return
    cache = llm.engine.config.cache
    flush_length = cache.flush_length if cache.linear_state == "kvbuffer" else 1
    policy.cost.prior = roofline_step_cost(model.hf_config, peaks, flush_length, model.dtype.itemsize)


def default_peaks(device: torch.device) -> Peaks:
    return H200 if device.type == "cuda" else CPU
