"""A generation request: what was asked, what has been emitted, and its statistics."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from drafters.base import DraftRequest
from specdec.speculation import SamplingParams


@dataclass
class RequestStats:
    """steps: target forwards after the prefill; emitted_per_step: tokens each step emitted (accepted drafts plus
    the bonus token); drafted_per_step: draft tokens proposed on each step's accepted path's tree; shapes: steps per
    speculation shape the adaptive policy chose ("plain", "chain-2", "tree-16", ...; empty for fixed speculation)."""

    steps: int = 0
    emitted_per_step: list[int] = field(default_factory=list)
    drafted_per_step: list[int] = field(default_factory=list)
    shapes: Counter[str] = field(default_factory=Counter)
    prefill_seconds: float = 0.0
    start: float = field(default_factory=time.perf_counter)  # submitted
    admitted: float | None = None                           # joined the batch (after waiting for room)
    end: float | None = None

    @property
    def mean_accepted_length(self) -> float:
        """Tokens per target step, the bonus token included."""
        return sum(self.emitted_per_step) / max(len(self.emitted_per_step), 1)

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens over proposed draft tokens."""
        proposed = sum(self.drafted_per_step)
        accepted = sum(self.emitted_per_step) - len(self.emitted_per_step)
        return accepted / proposed if proposed else 0.0

    @property
    def seconds(self) -> float:
        return (self.end or time.perf_counter()) - self.start


@dataclass(eq=False)  # a request is itself: identity, not field-by-field equality
class Request:
    request_id: int
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    eos_token_ids: frozenset[int] = frozenset()
    output: list[int] = field(default_factory=list)
    slot: int | None = None
    finish_reason: str | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    generator: torch.Generator | None = None
    draft_view: DraftRequest | None = None  # the drafter's view of it (drafter_view), made once
    in_flight: int = 0  # plain decoding steps launched for it whose token is not emitted yet
    prefilled: int = 0  # prompt tokens committed so far (a long prompt prefills in pieces: engine/prefill.py)

    def __post_init__(self):
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)
        self._tokens = self.prompt + self.output  # kept in step with output by emit

    @property
    def tokens(self) -> list[int]:
        """Prompt + output, one list kept up to date (not a copy per call: drafters read it every step; read it,
        never change it)."""
        return self._tokens

    def drafter_view(self) -> DraftRequest:
        """The request as its drafter sees it: one view per request, whose tokens list grows with the request's."""
        if self.draft_view is None:
            self.draft_view = DraftRequest(self.request_id, self.tokens, self.params, self.generator)
        return self.draft_view

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def emit(self, tokens: list[int]) -> list[int]:
        """Append emitted tokens up to an end-of-sequence token or max_new_tokens; returns those kept."""
        if len(tokens) < self.max_new_tokens - len(self.output) and self.eos_token_ids.isdisjoint(tokens):
            self.output += tokens  # every token kept and the request goes on: the common case, without a loop
            self._tokens += tokens
            return tokens
        kept = []
        for token in tokens:
            if len(self.output) >= self.max_new_tokens:
                break
            self.output.append(token)
            self._tokens.append(token)
            kept.append(token)
            if token in self.eos_token_ids:
                self.finish_reason = "eos"
                break
        if not self.finished and len(self.output) >= self.max_new_tokens:
            self.finish_reason = "length"
        if self.finished:
            self.stats.end = time.perf_counter()
        return kept
