"""Runs a model on its KVBuffer cache: score a step, commit, and plain (non-speculative) greedy decoding."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.cache.model_cache import KVBufferCache
from specdec.cache.spec import CacheConfig
from specdec.cache.step import StepBatch, StepContext
from specdec.models.base import HybridCausalLM


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # new tokens per prompt
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int


class ModelRunner:
    """Owns a model and its cache. `score` runs the forward over a step (nothing committed); `commit` keeps
    the accepted paths; `prefill` / `decode` do both for chains that are accepted by construction."""

    def __init__(self, model: HybridCausalLM, cache: KVBufferCache):
        self.model = model
        self.cache = cache

    @classmethod
    def create(cls, model: HybridCausalLM, config: CacheConfig) -> ModelRunner:
        return cls(model, model.make_cache(config))

    @torch.inference_mode()
    def score(self, batch: StepBatch) -> tuple[torch.Tensor, StepContext]:
        """-> (hidden [B, T, D] after the final norm, the step context to commit)."""
        ctx = self.cache.begin_step(batch)
        hidden = self.model(batch.tokens.to(self.cache.device), ctx, self.cache)
        return hidden, ctx

    @torch.inference_mode()
    def prefill(self, req_slots: Sequence[int], prompts: Sequence[Sequence[int]], all_logits: bool = False):
        """Commit the prompts; -> logits [B, V] of each prompt's last token (or [B, T, V] for every token)."""
        batch = StepBatch.chains(req_slots, prompts, prefill=True)
        hidden, ctx = self.score(batch)
        self.cache.commit_all(ctx)
        if all_logits:
            return self.model.compute_logits(hidden)
        last = (batch.num_nodes - 1).to(hidden.device)
        return self.model.compute_logits(hidden[torch.arange(hidden.shape[0], device=hidden.device), last])

    @torch.inference_mode()
    def decode(self, req_slots: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """One token per request, committed; -> logits [B, V]."""
        hidden, ctx = self.score(StepBatch.decode(req_slots, tokens))
        self.cache.commit_all(ctx)
        return self.model.compute_logits(hidden[:, 0])

    def greedy(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> GenerationResult:
        """Plain greedy decoding of a batch of prompts (any lengths), one committed token per step."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        slots = [self.cache.allocate_request() for _ in prompts]
        try:
            start = time.perf_counter()
            logits = self.prefill(slots, prompts)
            prefill_seconds = time.perf_counter() - start
            generated = [[token] for token in logits.argmax(-1).tolist()]
            start = time.perf_counter()
            for _ in range(max_new_tokens - 1):
                logits = self.decode(slots, [row[-1] for row in generated])
                for row, token in zip(generated, logits.argmax(-1).tolist(), strict=True):
                    row.append(token)
            decode_seconds = time.perf_counter() - start
        finally:
            for slot in slots:
                self.cache.release_request(slot)
        return GenerationResult(generated, prefill_seconds, decode_seconds, max_new_tokens - 1)
