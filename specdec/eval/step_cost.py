"""The adaptive policy's prior step cost (specdec/speculation/adaptive/step_cost.py) from the roofline of the target's
step (specdec/eval/roofline.py): what the policy assumes of a (batch, width) it has not measured yet. It leaves out
the drafter and the host, which the policy's measured factors bring in."""

from __future__ import annotations

import torch

from specdec.eval.peaks import Peaks
from specdec.eval.roofline import Workload, roofline
from specdec.speculation.adaptive import StepCostPrior

# the ceilings assumed when none are measured: the H200 of 2026-11-29 (specdec/eval/peaks.py), and a nominal CPU
H200 = Peaks(4.27e12, 790e12, "H200, measured 2026-11-29")
CPU = Peaks(20e9, 200e9, "a nominal CPU")


def roofline_step_cost(config, peaks: Peaks, flush_length: int = 16, dtype_bytes: int = 2) -> StepCostPrior:
    """(batch, width, mean context) -> seconds of the target's step of `batch` rows of `width` nodes (config: the
    target's transformers config). Memoised per (batch, width, context rounded to a power of two)."""
    memo: dict[tuple[int, int, int], float] = {}

    def seconds(batch: int, width: int, context: float) -> float:
        bucket = 1 << max(int(context), 1).bit_length()
        key = (batch, width, bucket)
        if key not in memo:
            work = Workload(batch=batch, nodes=width, flush_length=flush_length, context=float(bucket),
                            dtype_bytes=dtype_bytes)
            memo[key] = roofline(config, work, peaks).ms_per_step / 1e3
        return memo[key]

    return seconds


def default_peaks(device: torch.device) -> Peaks:
    return H200 if device.type == "cuda" else CPU
