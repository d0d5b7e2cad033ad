"""Runs a model on its KVBuffer cache: score a step (nothing committed), commit it, and the prefill / decode steps
whose nodes are accepted by construction. Decode and verify steps replay from CUDA graphs where the model allows it
(cuda_graphs.py); callers never know which way a step ran: score_all hands back a step handle and commit takes it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from specdec.cache.host_buffer import HostBuffer
from specdec.cache.model_cache import KVBufferCache
from specdec.cache.spec import CacheConfig
from specdec.cache.step import StepBatch, StepContext
from specdec.models.base import HybridCausalLM
from specdec.speculation.acceptance import Accepted, AcceptedOnDevice
from specdec.speculation.sampler import SamplerRows, SamplerShape, sample_rows

from .cuda_graphs import GraphStep, StepGraphs, capture_blocker


class DecodeHandle:
    """A launched decode step's sampled tokens: on the host once the step is done."""

    def __init__(self, host: torch.Tensor, done: torch.cuda.Event | None):
        self.host = host
        self.done = done

    def tokens(self) -> list[int]:
        """Waits for the step (and nothing after it) -> its next token per row."""
        if self.done is not None:
            self.done.synchronize()
        return self.host.tolist()


class ModelRunner:
    """Owns a model, its cache and, once enable_graphs ran, the CUDA graphs of its steps.

    feature_layers: what score_all and prefill_with_features hand back as the nodes' features for a drafter: the
    final hidden states when empty, else the outputs of those decoder layers concatenated (EAGLE-3).
    graphs: the decode (width 1) or verify steps' graphs; decode_graphs: those that decode steps replay, `graphs`
    itself at width 1, or graphs of their own beside the verify ones (decode_steps: adaptive speculation's plain
    steps), else None. graph_note: why the steps do not replay from CUDA graphs (None when they do)."""

    def __init__(self, model: HybridCausalLM, cache: KVBufferCache, feature_layers: tuple[int, ...] = ()):
        self.model = model
        self.cache = cache
        self.feature_layers = feature_layers
        self.graphs: StepGraphs | None = None
        self.decode_graphs: StepGraphs | None = None
        self.graph_note: str | None = "not enabled"
        # [R] each request slot's newest token, not yet scored: what decode steps read and write on the device
        self.tokens = torch.zeros(cache.config.max_requests, dtype=torch.long, device=cache.device)
        self._sampled = [HostBuffer(cache.config.max_requests, torch.long, cache.device) for _ in range(2)]
        self._sampled_turn = 0

    @classmethod
    def create(cls, model: HybridCausalLM, config: CacheConfig, step_width: int | None = None,
               cuda_graphs: bool = False, feature_layers: tuple[int, ...] = (),
               decode_steps: bool = False) -> ModelRunner:
        """A runner with a fresh cache of `config`. cuda_graphs: replay decode / verify steps of up to step_width
        nodes per row from CUDA graphs where the model allows it; the cache then holds one request slot more than
        config.max_requests, for the graphs' padding rows. decode_steps: decode steps too beside verify steps
        (enable_graphs)."""
        note = "turned off" if not cuda_graphs else capture_blocker(model)
        if note is None and step_width is None:
            raise ValueError("CUDA graphs need the widest step (step_width)")
        if note is None:
            config = replace(config, max_requests=config.max_requests + 1)
        runner = cls(model, model.make_cache(config), feature_layers)
        runner.graph_note = note
        if note is None:
            runner.enable_graphs(step_width, max_batch=config.max_requests - 1, decode_steps=decode_steps)
        return runner

    def enable_graphs(self, width: int, max_batch: int, capture: bool = True, decode_steps: bool = False) -> None:
        """Run decode / verify steps of up to `width` nodes and `max_batch` rows as static, padded steps: captured
        in CUDA graphs, or (capture=False, the CPU tests) the very same steps run eagerly. Takes a request slot for
        the padding rows. decode_steps (width > 1): decode graphs too, beside the verify ones, for steps that draft
        nothing (adaptive speculation's plain steps: decode_next); they share the verify graphs' padding slot and
        memory pool (no two steps replay at once)."""
        self.graphs = StepGraphs(self, width, max_batch, capture)
        self.decode_graphs = self.graphs if self.graphs.decodes else None
        if decode_steps and not self.graphs.decodes:
            self.decode_graphs = StepGraphs(self, 1, max_batch, capture, share=self.graphs)
        self.graph_note = None if capture else "static steps run eagerly"

    def capture(self, rows: int, shortest: int, longest: int, built_one=None) -> int:
        """Build now every graph that batches of up to `rows` requests will replay while their longest row needs
        `shortest` to `longest` key positions (a server's or a benchmark's warm-up; `shortest`: the widest step's
        first, so decode graphs beside verify ones start that width less one lower), calling built_one() after
        each (a server's progress). -> graphs built (0 without)."""
        if self.graphs is None:
            return 0
        built = self.graphs.capture_buckets(rows, shortest, longest, built_one)  # verify graphs first: more scratch
        if self.decode_graphs is not None and self.decode_graphs is not self.graphs:
            built += self.decode_graphs.capture_buckets(rows, max(1, shortest - self.graphs.width + 1), longest,
                                                        built_one)
        return built

    # ---- a step: score, then commit ----------------------------------------------------------------------------
    @torch.inference_mode()
    def score_all(self, batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor, StepContext | GraphStep]:
        """-> (logits [B, T, vocab] of every node, features [B, T, F], the step to commit). From a graph the
        logits (in model.logits_dtype) and features are its outputs (T its width >= batch.width), valid until the
        step's next replay; else fp32 logits."""
        if self.graphs is not None and self.graphs.fits(batch, decode=False):
            return self.graphs.score_all(batch)
        ctx = self.cache.begin_step(batch)
        hidden, features = self.forward_step(batch.tokens.to(self.cache.device), ctx)
        return self.model.compute_logits(hidden), features, ctx

    def score_logits(self, batch: StepBatch) -> tuple[torch.Tensor, StepContext | GraphStep]:
        """-> (logits [B, T, vocab] of every node (score_all's), the step to commit)."""
        logits, _, step = self.score_all(batch)
        return logits, step

    @torch.inference_mode()
    def commit_on_device(self, step: StepContext | GraphStep, accepted: AcceptedOnDevice) -> list[Accepted] | None:
        """A static step committed from its acceptance on the device, then read (StepGraphs.commit_on_device) -> per
        row its path and bonus token; None for an eager step (the caller reads, then commits)."""
        if isinstance(step, GraphStep):
            return self.graphs.commit_on_device(step, accepted)
        return None

    @torch.inference_mode()
    def commit(self, step: StepContext | GraphStep, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Keep the accepted paths of a scored step: accepted [B, A] node indices root first (-1 padded),
        num_accepted [B] (KVBufferCache.commit)."""
        if isinstance(step, GraphStep):
            self.graphs.commit(step, accepted, num_accepted)
        else:
            self.cache.commit(step, accepted, num_accepted)

    @torch.inference_mode()
    def score(self, batch: StepBatch) -> tuple[torch.Tensor, StepContext]:
        """An eager step -> (hidden [B, T, D] after the final norm, the step context to commit)."""
        ctx = self.cache.begin_step(batch)
        hidden = self.model(batch.tokens.to(self.cache.device), ctx, self.cache)
        return hidden, ctx

    def forward_step(self, tokens: torch.Tensor, ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        """The model on a begun step -> (hidden [B, T, D], features [B, T, F] per feature_layers)."""
        hidden, captured = self.model.forward_features(tokens, ctx, self.cache, self.feature_layers)
        return hidden, hidden if captured is None else captured

    # ---- steps accepted by construction ---------------------------------------------------------------------------
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
        """Plain decoding: one token per request, committed in the same forward (the linear layers' fused
        decode-commit, KVBufferCache.begin_decode); -> logits [B, V] (fp32, or a graph's in model.logits_dtype)."""
        self.set_tokens(req_slots, tokens)
        return self._decode(req_slots)[0]

    def set_tokens(self, req_slots: Sequence[int], tokens: Sequence[int]) -> None:
        """The requests' newest tokens (a prefill's first ones), for the decode steps to read on the device."""
        slots = torch.tensor(list(req_slots), dtype=torch.long).to(self.cache.device)
        self.tokens[slots] = torch.tensor(list(tokens), dtype=torch.long).to(self.cache.device)

    @torch.inference_mode()
    def decode_next(self, req_slots: Sequence[int], rows: SamplerRows, shape: SamplerShape) -> DecodeHandle:
        """Plain decoding launched without waiting for the device: each request's newest token (self.tokens) through
        the model, committed in the forward; its next token sampled on the device (sampler.py; rows: the
        requests' parameters and uniforms) into self.tokens, ready for the next step, and copied to the host in the
        background. -> a handle whose tokens() waits for this step alone."""
        logits, slots = self._decode(req_slots)
        sampled = sample_rows(logits, rows.to(logits.device) if shape.sampled else rows, shape)  # (greedy: unread)
        self.tokens[slots] = sampled
        self._sampled_turn ^= 1  # the other buffer may still hold the step before, not yet read
        host = self._sampled[self._sampled_turn].host[: len(req_slots)]
        host.copy_(sampled, non_blocking=True)
        done = torch.cuda.Event() if sampled.is_cuda else None
        if done is not None:
            done.record()
        return DecodeHandle(host, done)

    def _decode(self, req_slots: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode step of these requests on their newest tokens -> (logits [B, V], their slots on the device)."""
        graphs = self.decode_graphs
        if graphs is not None and len(req_slots) <= graphs.buckets[-1]:
            return graphs.decode(StepBatch.decode(req_slots, [0] * len(req_slots)))  # (tokens: on the device)
        slots = torch.tensor(list(req_slots), dtype=torch.long).to(self.cache.device)
        batch = StepBatch.decode(req_slots, self.tokens[slots].tolist())
        ctx, folds = self.cache.begin_decode(batch)
        hidden, _ = self.forward_step(batch.tokens.to(self.cache.device), ctx)
        self.cache.finish_decode(batch.req_slots, folds)
        return self.model.compute_logits(hidden[:, 0]), slots
