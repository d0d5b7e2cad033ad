"""What adaptive speculation may choose among and how it learns (AdaptiveConfig): the chains and the tree
offered, the drafter's prior acceptance, the collapse, the probes' and refreshes' intervals, the optimism."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from specdec.speculation.tree import TreeShape

from .tree_yield import TreeLayout


@dataclass(frozen=True)
class AdaptiveConfig:
    """prior_acceptance: the drafter's conditional acceptance per draft position (the last value repeats), where the
    acceptance pooled over requests starts, which a new request starts from (default: the shipped Qwen3.5 drafters
    on MT-bench, about 0.75 at each position); prior_weight: its weight in observations; decay: per observation of a
    position (and 1 - decay: how far an idle request's estimate relaxes toward the pooled one per plain step).
    collapse: a request whose first-position acceptance falls below this (and whose tree, where one is offered,
    keeps one of the root's children less often too) counts as emitting one token whatever it drafts. probe_every:
    steps a batch holding such requests runs without drafting before a probe step drafts (every row). refresh_every:
    steps between re-measuring the contender (a shape within 20% of the best) measured least recently in the batch's
    bucket (a cost drifts with context, and with whatever else the machine runs), twice as long after each refresh
    that confirmed the best shape, up to REFRESH_BACKOFF times. optimism: how many deviations of its estimate above
    it each row's acceptance is taken at when shapes are compared, the rows' shortfalls added in quadrature (plan;
    0: compared at the estimates); where the estimates prefer plain decoding, a drafting shape that only hope
    prefers is drafted in trials now and then.
    max_steps: the longest chain (the engine's TreeShape depth); chains: the lengths
    offered (default: 1, 2, 4, ... up to max_steps, and max_steps: a small fixed set, since on a GPU each is a CUDA
    graph of its own width, `widths`). tree: a tree (topk > 1, at most max_steps deep; static, or dynamic and priced at
    the layout the rank model keeps most of at the prior figures, tree_yield.likeliest_tree_parents) offered beside
    the chains, its shape keyed by the drafts it holds (its budget, more than any chain's), to batches of at most
    tree_max_batch requests (the GPU studies of 2026-12-05/06: the study's tree was the best shape only at <= 26
    rows, at >= 64 its step cost >= 2x a 4-chain's; above, no CUDA graph of its width is captured nor its logits
    held: 4.3 GB at batch 512 and Qwen3.5's vocabulary); sibling_prior: the rank model's sibling acceptance before
    any tree step (tree_yield.py; the shipped MTP's trees fit 0.52, its EAGLE-3 head's 0.15)."""

    max_steps: int = 4
    chains: tuple[int, ...] | None = None
    prior_acceptance: tuple[float, ...] = (0.75,)
    prior_weight: float = 2.0
    decay: float = 0.9
    collapse: float = 0.2
    probe_every: int = 16
    refresh_every: int = 16
    optimism: float = 1.0
    tree: TreeShape | None = None
    sibling_prior: float = 0.3
    tree_max_batch: int = 64

    def __post_init__(self):
        if self.max_steps < 1 or any(not 1 <= s <= self.max_steps for s in self.chain_lengths):
            raise ValueError(f"chain lengths must lie in [1, max_steps={self.max_steps}], got {self.chains}")
        if not self.prior_acceptance or not all(0.0 <= p <= 1.0 for p in self.prior_acceptance):
            raise ValueError(f"prior_acceptance needs values in [0, 1], got {self.prior_acceptance}")
        if not 0.0 < self.decay < 1.0 or self.prior_weight <= 0 or self.probe_every < 1 or self.optimism < 0:
            raise ValueError("need 0 < decay < 1, prior_weight > 0, probe_every >= 1 and optimism >= 0")
        if self.tree is not None and (self.tree.topk < 2 or self.tree.depth > self.max_steps
                                      or self.tree.budget <= self.max_steps):
            raise ValueError(f"the tree offered must branch (topk > 1, more drafts than max_steps) and reach at most "
                             f"max_steps={self.max_steps} deep, got {self.tree}")
        if not 0.0 <= self.sibling_prior <= 1.0 or self.tree_max_batch < 1:
            raise ValueError(f"need sibling_prior in [0, 1] and tree_max_batch >= 1, got {self.sibling_prior} and "
                             f"{self.tree_max_batch}")

    # (worked out once a config: the policy reads them several times a plan, between a drafting step's acceptance
    # read and the next launch)
    @functools.cached_property
    def chain_lengths(self) -> tuple[int, ...]:
        if self.chains:
            return tuple(sorted(set(self.chains)))
        return tuple(sorted({1 << k for k in range(self.max_steps.bit_length())} | {self.max_steps}))

    @functools.cached_property
    def shapes(self) -> tuple[int, ...]:
        """Drafts per row of each shape offered: 0 (no drafting), the chains, and the tree's budget."""
        return (*self.chain_shapes, *((self.tree.budget,) if self.tree is not None else ()))

    @functools.cached_property
    def chain_shapes(self) -> tuple[int, ...]:
        """The shapes offered above tree_max_batch: 0 and the chains."""
        return (0, *self.chain_lengths)

    @functools.cached_property
    def tree_layout(self) -> TreeLayout | None:
        if self.tree is None:
            return None
        return TreeLayout.of(self.tree, self.prior_at(self.tree.depth), self.sibling_prior)

    @functools.cached_property
    def tree_budget(self) -> int | None:
        """The tree's drafts per row (TreeShape.budget, a sum over its levels each time it is read), None without."""
        return self.tree.budget if self.tree is not None else None

    def is_tree(self, steps: int) -> bool:
        """Whether the shape of `steps` drafts per row is the tree (its budget: no chain is as long)."""
        return steps == self.tree_budget

    @functools.cached_property
    def widths(self) -> tuple[int, ...]:
        """Nodes per row of each shape's step (the root and its drafts): the step widths to capture."""
        return tuple(steps + 1 for steps in self.shapes)

    @functools.cached_property
    def width_max_batch(self) -> dict[int, int]:
        """Widths offered only up to a batch: the tree's, up to tree_max_batch (StepGraphs.set_widths' max_rows)."""
        return {self.tree.budget + 1: self.tree_max_batch} if self.tree is not None else {}

    def prior_at(self, positions: int) -> tuple[float, ...]:
        p = self.prior_acceptance
        return tuple(p[min(k, len(p) - 1)] for k in range(positions))
