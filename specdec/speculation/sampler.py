"""Next tokens of plain decoding for a whole batch in one pass of tensor ops, each row with its own sampling
parameters: no per-row host work and no grouping, so that it runs on the device right after a decode step and the
host need not look at the logits before the next step is launched.

For every row it computes what acceptance.py's accept gives a tree without drafts, its bonus token: the argmax for
greedy rows; for the others target_distribution (temperature, then top-k, then top-p) and an inverse-CDF draw with
one uniform that the host drew from the request's own generator (as accept_batch draws a bonus), so that a seed
gives the same tokens either way. Rows' filters are tensors [B]; which filters any row uses at all (SamplerShape)
is known on the host and picks the ops, so a greedy batch pays for an argmax only and top-p's sort over the
vocabulary is paid only when a row asks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import SamplingParams


@dataclass(frozen=True)
class SamplerShape:
    """Which ops a batch needs: any sampled row, the largest top-k of a row (0: none), any top-p < 1."""

    sampled: bool = False
    top_k: int = 0
    top_p: bool = False

    @classmethod
    def of(cls, params: list[SamplingParams]) -> SamplerShape:
        sampled = [p for p in params if not p.greedy]
        return cls(bool(sampled), max((p.top_k for p in sampled), default=0), any(p.top_p < 1 for p in sampled))


@dataclass
class SamplerRows:
    """Per-row inputs [B]: temperature (0: greedy), top_k (0: off), top_p (1: off), the row's uniform in [0, 1)."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    uniform: torch.Tensor

    @classmethod
    def of(cls, params: list[SamplingParams], generators: list[torch.Generator | None]) -> SamplerRows:
        """On the host; draws one uniform from each sampled row's generator, in row order (greedy rows draw none)."""
        uniform = [0.0 if p.greedy else float(torch.rand((), generator=g)) for p, g in zip(params, generators,
                                                                                             strict=True)]
        return cls(torch.tensor([p.temperature for p in params], dtype=torch.float32),
                   torch.tensor([p.top_k for p in params], dtype=torch.long),
                   torch.tensor([p.top_p for p in params], dtype=torch.float32),
                   torch.tensor(uniform, dtype=torch.float64))

    def to(self, device: torch.device) -> SamplerRows:
        """On `device`, copied without waiting for it (pinned first on CUDA)."""
        if device.type != "cuda":
            return self
        move = [t.pin_memory().to(device, non_blocking=True) for t in (self.temperature, self.top_k, self.top_p,
                                                                       self.uniform)]
        return SamplerRows(*move)


def sample_rows(logits: torch.Tensor, rows: SamplerRows, shape: SamplerShape) -> torch.Tensor:
    """logits [B, V] -> next token per row [B] int64, on logits' device."""
    argmax = logits.argmax(-1)
    if not shape.sampled:
        return argmax
    vocab = logits.shape[-1]
    greedy = rows.temperature == 0
    scaled = logits.float() / torch.where(greedy, 1.0, rows.temperature)[:, None]
    if shape.top_k:  # the k-th largest of each row that asks, as target_distribution's topk(k).values[..., -1]
        kmax = min(shape.top_k, vocab)
        top = scaled.topk(kmax, dim=-1).values  # [B, kmax] descending
        kth = top.gather(1, (rows.top_k.clamp(1, kmax) - 1)[:, None])
        filtered = (rows.top_k > 0) & (rows.top_k < vocab)
        scaled = torch.where(filtered[:, None] & (scaled < kth), float("-inf"), scaled)
    probs = scaled.softmax(-1)
    if shape.top_p:  # the smallest set of most likely tokens whose mass reaches top_p
        sorted_probs, order = probs.sort(-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        keep_sorted = (mass_before < rows.top_p[:, None]) | (rows.top_p >= 1)[:, None]
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        kept = torch.where(keep, probs, 0.0)
        probs = torch.where((rows.top_p < 1)[:, None], kept / kept.sum(-1, keepdim=True), probs)
    cdf = probs.double().cumsum(-1)
    drawn = torch.searchsorted(cdf, (rows.uniform * cdf[:, -1])[:, None], right=True).clamp_max(vocab - 1)[:, 0]
    return torch.where(greedy, argmax, drawn)
