"""Speculation for throughput benchmarks on random weights, where real drafts are never accepted: `specdec bench
--draft synthetic:MEAN`. SyntheticDrafter proposes chains of random tokens (no model, no cost) and
SyntheticAcceptance, injected into the engine in place of the target's acceptance, keeps the first k drafts of each,
k drawn so that the mean accepted length (the bonus token included) is MEAN. Every draft is accepted with the same
probability alpha given that the one before it was, as a real drafter's acceptance roughly falls.

Verification and commit cost what they cost with real drafts of that acceptance; the emitted tokens mean nothing.
Use it to time speculative decoding at the accepted length measured on trained models (specdec eval).
"""

from __future__ import annotations

import random

import torch

from drafters.base import Drafter, DraftRequest
from specdec.speculation import DraftTree, SamplingParams, TreeShape

PREFIX = "synthetic:"


class SyntheticDrafter(Drafter):
    """Chains of tokens drawn at random from the first request's tokens (a benchmark's random prompt gives random
    tokens: MoE routing as varied as real drafts'), so that it needs no vocabulary or model: a pool of POOL of them,
    drawn once, read in turn (a draw per drafted token costs more host time than the rest of a step)."""

    POOL = 8192

    def __init__(self, mean_accepted_length: float, seed: int = 0):
        if mean_accepted_length < 1:
            raise ValueError(f"synthetic:MEAN needs a mean accepted length >= 1 (the bonus token counts), "
                             f"got {mean_accepted_length}")
        self.mean_accepted_length = mean_accepted_length
        self.picks = random.Random(seed)
        self.pool: list[int] = []
        self.cursor = 0

    def check_shape(self, shape: TreeShape) -> None:
        if shape.topk != 1 or shape.dynamic:
            raise ValueError("the synthetic drafter drafts chains: use --topk 1 without --dynamic-tree")
        if self.mean_accepted_length > shape.steps + 1:
            raise ValueError(f"a mean accepted length of {self.mean_accepted_length} needs chains of at least "
                             f"{self.mean_accepted_length - 1:g} drafts; raise --num-steps (now {shape.steps})")

    def propose(self, requests: list[DraftRequest], shape: TreeShape) -> list[DraftTree]:
        depth = shape.budget
        if not self.pool:
            self.pool = self.picks.choices(requests[0].tokens, k=self.POOL)
        parents, trees = list(range(-1, depth)), []
        for request in requests:
            if self.cursor + depth > self.POOL:
                self.cursor = 0
            trees.append(DraftTree([request.tokens[-1], *self.pool[self.cursor:self.cursor + depth]], parents))
            self.cursor += depth
        return trees


class SyntheticAcceptance:
    """Keeps the first k drafts of each chain, k with mean `mean_accepted_length` - 1; the bonus token is the target's
    argmax after the last kept node (so the target's logits are still read, as a real step reads them).

    depth: the chain length the mean is quoted at. With it every draft is accepted with that length's alpha whatever
    the length of its chain, as a real drafter's acceptance of a draft does not depend on how many follow it: what
    adaptive speculation, choosing shorter chains or none, must see (a chain of 1 then keeps its draft with
    probability alpha, not with the mean's). Without it each chain's alpha meets the mean at the chain's own length."""

    def __init__(self, mean_accepted_length: float, seed: int = 0, depth: int | None = None):
        self.mean_accepted_length = mean_accepted_length
        self.depth = depth
        self.coins = random.Random(seed)  # acceptance draws, on the host: a step draws up to depth per request
        self._alpha: dict[int, float] = {}  # chain depth -> per-draft acceptance probability

    def accept(self, trees: list[DraftTree], logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator | None]) -> list[tuple[list[int], int]]:
        argmax = logits.argmax(-1).tolist()  # [B, T]
        results = []
        for row, tree in enumerate(trees):
            path = self.forced_path(tree)
            results.append((path, argmax[row][path[-1]]))
        return results

    def forced_path(self, tree: DraftTree) -> list[int]:
        depth = len(tree) - 1
        alpha = self.alpha(self.depth or depth)
        accepted = 0
        while accepted < depth and self.coins.random() < alpha:
            accepted += 1
        return list(range(accepted + 1))

    def alpha(self, depth: int) -> float:
        """The alpha whose expected accepted drafts, alpha + alpha^2 + ... + alpha^depth, is the mean - 1."""
        if depth not in self._alpha:
            wanted = min(self.mean_accepted_length - 1, depth)
            low, high = 0.0, 1.0
            for _ in range(60):
                middle = (low + high) / 2
                low, high = (middle, high) if sum(middle**i for i in range(1, depth + 1)) < wanted else (low, middle)
            self._alpha[depth] = (low + high) / 2
        return self._alpha[depth]


def synthetic_speculation(draft: str, depth: int | None = None) -> tuple[SyntheticDrafter, SyntheticAcceptance]:
    """`synthetic:MEAN` -> the drafter and the acceptance to give the engine together; depth: the chain length the
    mean is quoted at (the engine's draft budget), which fixes the acceptance of each draft (SyntheticAcceptance)."""
    mean = draft.removeprefix(PREFIX)
    try:
        value = float(mean)
        return SyntheticDrafter(value), SyntheticAcceptance(value, depth=depth)
    except ValueError as error:
        raise ValueError(f"--draft synthetic:MEAN takes a mean accepted length, e.g. synthetic:2.9; "
                         f"{mean!r}: {error}") from None
