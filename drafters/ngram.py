"""Prompt lookup (n-gram) drafting: no model, no training. Find the longest recent n-gram of the request that
occurred earlier in its own tokens and propose what followed it there, as a chain of point-mass candidates.

Each request keeps an index from n-grams to where they start, extended by the tokens added since the last step,
so a lookup costs the matches it examines, not a scan of the whole context (which grew with every token).
"""

from __future__ import annotations

from specdec.speculation import DraftTree, TreeShape

from .base import Drafter, DraftRequest


class NgramIndex:
    """Start positions of every n-gram (min_ngram <= n <= max_ngram) of a token sequence that only grows."""

    def __init__(self, min_ngram: int, max_ngram: int):
        self.min_ngram, self.max_ngram = min_ngram, max_ngram
        self.starts: dict[tuple[int, ...], list[int]] = {}  # n-gram -> its start positions, ascending
        self.length = 0  # tokens indexed

    def extend(self, tokens: list[int]) -> NgramIndex:
        """Index the n-grams that end in tokens[self.length:] (tokens extends what was indexed before)."""
        for end in range(self.length + 1, len(tokens) + 1):
            for n in range(self.min_ngram, min(self.max_ngram, end) + 1):
                self.starts.setdefault(tuple(tokens[end - n:end]), []).append(end - n)
        self.length = len(tokens)
        return self

    def lookup(self, tokens: list[int], count: int) -> list[int]:
        """Up to `count` tokens that followed an earlier occurrence of the longest matching suffix: the most recent
        occurrence with `count` tokens after it, else the one with the most (a recent match in a repeating text
        runs into the end of the sequence after a token or two). tokens: the indexed sequence."""
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            best: list[int] = []
            for start in reversed(self.starts.get(tuple(tokens[-n:]), [])):
                if start > len(tokens) - n - 1:  # the suffix itself
                    continue
                following = tokens[start + n:start + n + count]
                if len(following) == count:
                    return following
                if len(following) > len(best):
                    best = following
            if best:
                return best
        return []


class NgramDrafter(Drafter):
    def __init__(self, max_ngram: int = 4, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._indexes: dict[int, NgramIndex] = {}

    def propose(self, requests: list[DraftRequest], shape: TreeShape) -> list[DraftTree]:
        count = shape.budget if shape.topk == 1 else shape.steps
        return [DraftTree.chain(request.tokens[-1], self._index(request).lookup(request.tokens, count))
                for request in requests]

    def shadow_drafts(self, requests: list[DraftRequest]) -> list[int | None]:
        """A lookup of one token in each request's index: drafting costs no forward (Drafter.shadow_drafts)."""
        return [(drafts or [None])[0] for drafts in (self._index(r).lookup(r.tokens, 1) for r in requests)]

    def _index(self, request: DraftRequest) -> NgramIndex:
        """The request's index, extended to its tokens."""
        index = self._indexes.setdefault(request.request_id, NgramIndex(self.min_ngram, self.max_ngram))
        if index.length > len(request.tokens):  # not the sequence it indexed: start over
            index = self._indexes[request.request_id] = NgramIndex(self.min_ngram, self.max_ngram)
        return index.extend(request.tokens)

    def finish(self, request_id: int) -> None:
        self._indexes.pop(request_id, None)

    def lookup(self, tokens: list[int], count: int) -> list[int]:
        """NgramIndex.lookup on a fresh index of `tokens`."""
        return NgramIndex(self.min_ngram, self.max_ngram).extend(tokens).lookup(tokens, count)
