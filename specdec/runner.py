"""Runs a model on its KVBuffer cache: score a step (nothing committed), commit, and the prefill / decode steps
whose nodes are accepted by construction. The engine (specdec/engine) builds generation on top."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specdec.cache.model_cache import KVBufferCache
from specdec.cache.spec import CacheConfig
from specdec.cache.step import StepBatch, StepContext
from specdec.models.base import HybridCausalLM


class ModelRunner:
    """Owns a model and its cache. `score` runs the forward over a step (nothing committed); `commit` keeps
    the accepted paths; `prefill` / `decode` do both for chains that are accepted by construction.

    feature_layers: what score_all and prefill_with_features hand back as the nodes' features for a drafter: the
    final hidden states when empty, else the outputs of those decoder layers concatenated (EAGLE-3)."""

    def __init__(self, model: HybridCausalLM, cache: KVBufferCache, feature_layers: tuple[int, ...] = ()):
        self.model = model
        self.cache = cache
        self.feature_layers = feature_layers

    @classmethod
    def create(cls, model: HybridCausalLM, config: CacheConfig) -> ModelRunner:
        return cls(model, model.make_cache(config))

    @torch.inference_mode()
    def score(self, batch: StepBatch) -> tuple[torch.Tensor, StepContext]:
        """-> (hidden [B, T, D] after the final norm, the step context to commit)."""
        ctx = self.cache.begin_step(batch)
        hidden = self.model(batch.tokens.to(self.cache.device), ctx, self.cache)
        return hidden, ctx

    def forward_step(self, tokens: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The model on a begun step -> (hidden [B, T, D], features [B, T, F] per feature_layers)."""
        hidden, captured = self.model.forward_features(tokens, ctx, self.cache, self.feature_layers)
        return hidden, hidden if captured is None else captured

    @torch.inference_mode()
    def score_all(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor, StepContext]:
        """-> (fp32 logits [B, T, vocab] of every node, features [B, T, F], the step context to commit)."""
        ctx = self.cache.begin_step(batch)
        hidden, features = self.forward_step(batch.tokens.to(self.cache.device), ctx)
        return self.model.compute_logits(hidden), features, ctx

    def score_logits(self, batch: StepBatch) -> tuple[torch.Tensor, StepContext]:
        """-> (fp32 logits [B, T, vocab] of every node, the step context to commit)."""
        logits, _, ctx = self.score_all(batch)
        return logits, ctx

    @torch.inference_mode()
    def commit(self, ctx: StepContext, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Keep the accepted paths of a scored step (KVBufferCache.commit)."""
        self.cache.commit(ctx, accepted, num_accepted)

    @torch.inference_mode()
    def prefill(self, req_slots: Sequence[int], prompts: Sequence[Sequence[int]], all_logits: bool = False):
        """Commit the prompts; -> logits [B, V] of each prompt's last token (or [B, T, V] for every token)."""
        if all_logits:
            batch = StepBatch.chains(req_slots, prompts, prefill=True)
            hidden, ctx = self.score(batch)
            self.cache.commit_all(ctx)
            return self.model.compute_logits(hidden)
        return self.prefill_with_features(req_slots, prompts)[0]

    @torch.inference_mode()
    def prefill_with_features(self, req_slots: Sequence[int],
                              prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Commit the prompts; -> (logits [B, V] of each prompt's last token, features [B, T, F] of every token
        per feature_layers; rows past a prompt's end are padding)."""
        batch = StepBatch.chains(req_slots, prompts, prefill=True)
        ctx = self.cache.begin_step(batch)
        hidden, features = self.forward_step(batch.tokens.to(self.cache.device), ctx)
        self.cache.commit_all(ctx)
        last = (batch.num_nodes - 1).to(hidden.device)
        return self.model.compute_logits(hidden[torch.arange(hidden.shape[0], device=hidden.device), last]), features

    @torch.inference_mode()
    def decode(self, req_slots: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """One token per request, committed; -> logits [B, V]."""
        hidden, ctx = self.score(StepBatch.decode(req_slots, tokens))
        self.cache.commit_all(ctx)
        return self.model.compute_logits(hidden[:, 0])
