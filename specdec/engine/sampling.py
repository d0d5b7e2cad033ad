"""Sampling parameters, the target distribution they define, and lossless acceptance of drafted tokens.

Acceptance is recursive rejection sampling. At a tree node with target distribution p, its drafted children are
tried in order; child i was drawn from q_i (a point mass for deterministic drafts such as greedy or n-gram
candidates). It is accepted with probability min(1, p(x_i) / q_i(x_i)); on rejection p becomes
norm(max(p - q_i, 0)) and the next child is tried. If no child is accepted the bonus token is drawn from the
current p. Whatever q_i are (even adapted to the earlier rejections), each step emits exactly p in distribution
(the speculative sampling lemma), so the output equals sampling from the target: the method is lossless.
With temperature 0 the target is a point mass at the argmax: a child is accepted iff it is the argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy; top_k 0 and top_p 1 switch those filters off; seed makes a request
    reproducible (each request draws from its own generator)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def target_distribution(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., V] -> probabilities [..., V] in fp32: temperature, then top-k, then top-p (nucleus: the
    smallest set of most likely tokens whose mass reaches top_p). Greedy gives a one-hot at the argmax."""
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if params.top_p < 1:
        sorted_probs, order = probs.sort(-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the strictly more likely tokens
        keep_sorted = mass_before < params.top_p  # always keeps the most likely token
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from probs [V]."""
    return int(torch.multinomial(probs, 1, generator=generator))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)): the target conditioned on rejecting a draw from q. If p <= q everywhere (only when
    p == q, where a rejection cannot happen) p is returned to stay a distribution."""
    rest = (p - q).clamp_min(0)
    total = rest.sum()
    return rest / total if total > 0 else p


def accept_child(p: torch.Tensor, token: int, q: torch.Tensor | None, generator: torch.Generator | None) -> bool:
    """Accept a drafted token x drawn from q (None: a point mass at x) with probability min(1, p(x) / q(x))."""
    q_x = 1.0 if q is None else float(q[token])
    p_x = float(p[token])
    if p_x >= q_x:
        return True
    if p_x == 0:
        return False
    return float(torch.rand((), generator=generator)) < p_x / q_x


def point_mass(token: int, size: int, device) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token, device=device), size).float()
