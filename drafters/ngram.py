"""Prompt lookup (n-gram) drafting: no model, no training. Find the longest recent n-gram of the request that
occurred earlier in its own tokens and propose what followed it there, as a chain of point-mass candidates."""

from __future__ import annotations

from specdec.engine.tree import DraftTree

from .base import Drafter, DraftRequest, TreeShape, register


@register("ngram")
class NgramDrafter(Drafter):
    def __init__(self, max_ngram: int = 4, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def propose(self, requests: list[DraftRequest], shape: TreeShape) -> list[DraftTree]:
        trees = []
        for request in requests:
            drafts = self.lookup(request.tokens, shape.budget if shape.topk == 1 else shape.steps)
            trees.append(DraftTree.chain(request.tokens[-1], drafts))
        return trees

    def lookup(self, tokens: list[int], count: int) -> list[int]:
        """Up to `count` tokens that followed an earlier occurrence of the longest matching suffix: the most recent
        occurrence with `count` tokens after it, else the one with the most (a recent match in a repeating text
        runs into the end of the sequence after a token or two)."""
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            suffix = tokens[-n:]
            best: list[int] = []
            for start in range(len(tokens) - n - 1, -1, -1):  # most recent occurrence first, not the suffix itself
                if tokens[start:start + n] == suffix:
                    following = tokens[start + n:start + n + count]
                    if len(following) == count:
                        return following
                    best = max(best, following, key=len)
            if best:
                return best
        return []
