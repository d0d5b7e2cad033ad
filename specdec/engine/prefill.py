"""Prefill as forwards of a bounded size: admitted requests wait here until their prompts are all committed, and the
engine runs one forward of them per step (chunked prefill, interleaved with the decode steps of the requests already
running: a long prompt neither stalls them for its whole prefill nor runs one forward of unbounded activations).

A forward takes at most max_tokens padded tokens (its pieces padded to the longest): prompts that fit share one, in
admission order; a longer prompt runs alone, max_tokens of it a forward, each continuing from what the one before
committed (the cache's prefill works from a row's committed state: docs/design.md 2.5)."""

from __future__ import annotations

import torch

from .request import Request


def prefill_forwards(prompt_lengths: list[int], max_tokens: int) -> list[list[tuple[int, int, int]]]:
    """The admitted requests' prompts cut into prefill forwards of at most max_tokens padded tokens each (a forward
    pads its pieces to the longest: count x longest), in order. -> per forward its pieces (request index, start,
    end). Prompts that fit share forwards; a longer prompt runs alone in pieces of max_tokens tokens, each forward
    continuing from what the one before committed (chunked prefill: docs/design.md 2.5)."""
    forwards, group, longest = [], [], 0
    for index, length in enumerate(prompt_lengths):
        if length > max_tokens:
            forwards += [group] if group else []
            forwards += [[(index, start, min(start + max_tokens, length))] for start in range(0, length, max_tokens)]
            group, longest = [], 0
            continue
        if group and (len(group) + 1) * max(longest, length) > max_tokens:
            forwards.append(group)
            group, longest = [], 0
        group.append((index, 0, length))
        longest = max(longest, length)
    return forwards + ([group] if group else [])


class PrefillQueue:
    def __init__(self, runner, max_tokens: int):
        self.runner = runner
        self.max_tokens = max_tokens
        self.waiting: list[Request] = []  # in admission order; request.prefilled: its prompt tokens committed so far
        self._features: dict[int, list[torch.Tensor]] = {}  # request id -> its pieces' features [piece, F]

    def add(self, requests: list[Request]) -> None:
        self.waiting += requests

    def drop(self, request_id: int) -> None:
        """An aborted request: forget it and its features."""
        self.waiting = [r for r in self.waiting if r.request_id != request_id]
        self._features.pop(request_id, None)

    def forward(self, features_wanted: bool) -> list[tuple[Request, torch.Tensor, torch.Tensor | None]]:
        """Commit the next forward's pieces of the waiting prompts. -> for each prompt it finished: (its request,
        the logits [V] of its last token, the features [len(prompt), F] of all its tokens where wanted, else None)."""
        remaining = [len(r.prompt) - r.prefilled for r in self.waiting]
        first_forward = prefill_forwards(remaining, self.max_tokens)[0]
        pieces = [(self.waiting[index], first, end) for index, first, end in first_forward]  # (first, end: of the rest)
        tokens = [r.prompt[r.prefilled + first:r.prefilled + end] for r, first, end in pieces]
        logits, features = self.runner.prefill_with_features([r.slot for r, _, _ in pieces], tokens)
        done = []
        for row, (request, first, end) in enumerate(pieces):
            if features_wanted:
                self._features.setdefault(request.request_id, []).append(features[row, : end - first])
            request.prefilled += end - first
            if request.prefilled == len(request.prompt):
                whole = torch.cat(self._features.pop(request.request_id)) if features_wanted else None
                done.append((request, logits[row], whole))
        self.waiting = [r for r in self.waiting if r.prefilled < len(r.prompt)]
        return done
