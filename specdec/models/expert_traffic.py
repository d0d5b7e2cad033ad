"""How many distinct experts the MoE layers of a model read, counted on the device while it runs (benchmarks).

The roofline (specdec/eval/roofline.py) reads, per MoE layer and step, the experts that N tokens routed uniformly to
k of E would touch. Real traffic comes close to that; random weights need not (a deep random network's hidden states
tend to look alike, so their tokens crowd onto few experts), and a step that reads fewer experts than the roofline
assumes runs "under its roofline". The bench counts what the steps really touched and scales the roofline's expert
reads by measured / uniform.

The count is three small device ops per MoE layer call (a zeroed [E] mask, a scatter of the chosen experts, a sum
added to a counter), no host synchronisation: they are captured in CUDA graphs like the rest of the step, so the
counters must be attached before the graphs are captured and reset in place (never replaced) between runs.
"""

from __future__ import annotations

import torch
from torch import nn


class ExpertTraffic:
    """Counters on every StackedExperts of `model`: distinct experts touched, summed over calls, and the calls."""

    def __init__(self, model: nn.Module):
        from .moe import StackedExperts  # (moe imports nothing from here)

        self.experts = [m for m in model.modules() if isinstance(m, StackedExperts)]
        device = next(model.parameters()).device
        self.counts = torch.zeros(2, dtype=torch.long, device=device)  # [distinct experts summed, calls]
        for module in self.experts:
            module.traffic = self.counts

    @property
    def any(self) -> bool:
        return bool(self.experts)

    def reset(self) -> None:
        self.counts.zero_()

    def read(self) -> tuple[int, int]:
        """(distinct experts summed over the calls since the last reset, calls); waits for the device."""
        distinct, calls = self.counts.tolist()
        return distinct, calls

    def detach(self) -> None:
        for module in self.experts:
            module.traffic = None


def count_touched(counts: torch.Tensor, top_index: torch.Tensor, num_experts: int) -> None:
    """counts [2] += (distinct experts in top_index [N, k], 1), on the device."""
    hit = torch.zeros(num_experts, dtype=torch.long, device=top_index.device)
    hit.scatter_(0, top_index.flatten(), 1)
    counts[0] += hit.sum()
    counts[1] += 1
