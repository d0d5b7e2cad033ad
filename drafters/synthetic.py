"""A drafter for throughput benchmarks on random weights, where real drafts are never accepted: `--draft
synthetic:MEAN` proposes chains of random tokens (no model, no cost) and has the engine accept the first k drafts
of each, k drawn so that the mean accepted length (the bonus token included) is MEAN. Every draft is accepted with
the same probability alpha given that the one before it was, as a real drafter's acceptance roughly falls.

Verification and commit cost what they cost with real drafts of that acceptance; the emitted tokens mean nothing.
Use it to time speculative decoding at the accepted length measured on trained models (specdec eval).
"""

from __future__ import annotations

import random

import torch

from specdec.engine.tree import DraftTree

from .base import Drafter, DraftRequest, TreeShape


class SyntheticDrafter(Drafter):
    def __init__(self, mean_accepted_length: float, vocab_size: int, seed: int = 0):
        if mean_accepted_length < 1:
            raise ValueError(f"synthetic:MEAN needs a mean accepted length >= 1 (the bonus token counts), "
                             f"got {mean_accepted_length}")
        self.mean_accepted_length = mean_accepted_length
        self.vocab_size = vocab_size
        self.generator = torch.Generator().manual_seed(seed)
        self.coins = random.Random(seed)  # acceptance draws, on the host: a step draws up to depth per request
        self._alpha: dict[int, float] = {}  # chain depth -> per-draft acceptance probability

    def check_shape(self, shape: TreeShape) -> None:
        if shape.topk != 1 or shape.dynamic:
            raise ValueError("the synthetic drafter drafts chains: use --topk 1 without --dynamic-tree")
        if self.mean_accepted_length > shape.steps + 1:
            raise ValueError(f"a mean accepted length of {self.mean_accepted_length} needs chains of at least "
                             f"{self.mean_accepted_length - 1:g} drafts; raise --num-steps (now {shape.steps})")

    def propose(self, requests: list[DraftRequest], shape: TreeShape) -> list[DraftTree]:
        depth = shape.budget
        drafts = torch.randint(0, self.vocab_size, (len(requests), depth), generator=self.generator).tolist()
        return [DraftTree([request.tokens[-1], *tokens], list(range(-1, depth)))
                for request, tokens in zip(requests, drafts, strict=True)]

    def forced_path(self, tree: DraftTree) -> list[int]:
        depth = len(tree) - 1
        alpha = self.alpha(depth)
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
