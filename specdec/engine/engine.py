"""The speculative decoding loop over a batch of requests, as small named steps:

    admit -> prefill -> propose -> verify -> accept -> commit -> emit -> retire

verify scores every node of every request's tree in one target forward (KVBuffer tree verify in the linear
layers, a tree mask in the attention layers); commit keeps the accepted path's entries. Nothing is snapshotted
and nothing is rolled back. Without a drafter every tree is just the root: plain decoding on the same code.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, replace

import torch

from drafters.base import Drafter, DraftRequest, TreeShape
from specdec.cache.spec import CacheConfig
from specdec.cache.step import StepBatch
from specdec.models.base import HybridCausalLM
from specdec.runner import ModelRunner

from .acceptance import accept_batch
from .cuda_graphs import GraphedForward, capture_blocker
from .request import Request
from .sampling import SamplingParams, sample, target_distribution
from .scheduler import Scheduler
from .tree import DraftTree, accept_greedy


@dataclass(frozen=True)
class EngineConfig:
    """cache: the target's pools; shape: what the drafter proposes per step; cuda_graphs: replay the decode /
    verify steps from CUDA graphs on a GPU where the model allows it (Engine.graph_note says why not otherwise).
    With graphs on, the target's cache holds one request slot more than cache.max_requests, for padding rows."""

    cache: CacheConfig = CacheConfig()
    shape: TreeShape = TreeShape()
    cuda_graphs: bool = True


class Engine:
    def __init__(self, target: HybridCausalLM, drafter: Drafter | None = None, config: EngineConfig = EngineConfig()):
        if config.shape.dynamic and not (drafter is not None and drafter.supports_dynamic_trees):
            raise ValueError("dynamic trees need a drafter that scores its drafts: use --draft mtp or eagle3:PATH, "
                             "or a static tree (leave out --dynamic-tree)")
        if drafter is not None:
            drafter.check_shape(config.shape)
        self.target = target
        self.drafter = drafter
        self.config = config
        self.graph_note = capture_blocker(target) if config.cuda_graphs else "turned off"
        cache = config.cache
        if self.graph_note is None:
            cache = replace(cache, max_requests=cache.max_requests + 1)  # + the graphs' padding slot
        self.runner = ModelRunner.create(target, cache)
        if drafter is not None and drafter.target_features is not None:
            self.runner.feature_layers = drafter.target_features
        width = config.shape.budget + 1 if drafter else 1  # nodes per verify step: the root and its drafts
        if cache.intermediate_states and width > 1:  # the baseline's one state per node, for every request slot
            self.runner.cache.reserve_node_states(width)
        self.forward: ModelRunner | GraphedForward = self.runner
        if self.graph_note is None:
            self.forward = GraphedForward(self.runner, width, max_batch=config.cache.max_requests)
        self.scheduler = Scheduler(self.runner.cache, draft_budget=config.shape.budget if drafter else 0)
        self._ids = itertools.count()
        self.context_length = getattr(target.hf_config, "max_position_embeddings", None)

    def capture_graphs(self, rows: int, prompt_tokens: int, max_new_tokens: int) -> int:
        """Capture the CUDA graphs that batches of up to `rows` requests of these lengths will replay, ahead of
        time (benchmarks, servers that warm up); the steps not captured here are captured when first needed.
        Returns how many were captured (0 without graphs)."""
        if not isinstance(self.forward, GraphedForward):
            return 0
        width = self.forward.width
        return self.forward.capture_buckets(rows, prompt_tokens + width, prompt_tokens + max_new_tokens + width)

    # ---- requests ----------------------------------------------------------------------------------------
    def add_request(self, prompt: list[int], params: SamplingParams = SamplingParams(), max_new_tokens: int = 64,
                    eos_token_ids=()) -> Request:
        """Queue a request; everything that could make it fail later is checked here, before any work."""
        self.check_request(prompt, max_new_tokens)
        request = Request(next(self._ids), list(prompt), params, max_new_tokens, frozenset(eos_token_ids))
        if self.scheduler.may_fold(request) and self.config.cache.state_slots == 0:
            raise ValueError(
                f"this request may fill its buffer (flush length {self.config.cache.flush_length}) and need a "
                "committed state, but the cache has no state slots; raise CacheConfig.num_state_slots"
            )
        self.scheduler.add(request)
        return request

    def check_request(self, prompt: list[int], max_new_tokens: int) -> None:
        if not prompt:
            raise ValueError("the prompt is empty; give at least one token (or a non-empty text)")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        vocab = self.target.hf_config.vocab_size
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise ValueError(f"prompt token ids must lie in [0, {vocab}) for this model")
        tree = self.scheduler.draft_budget + 1  # the widest step: a root and its drafts
        needed = len(prompt) + max_new_tokens + tree
        if self.context_length is not None and len(prompt) + max_new_tokens > self.context_length:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context of "
                f"{self.context_length} tokens; shorten the prompt or lower max_new_tokens"
            )
        if needed > self.config.cache.max_seq_len:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({max_new_tokens}) + one step's tree ({tree}) "
                f"needs {needed} cache positions but the cache holds "
                f"{self.config.cache.max_seq_len}; raise max_seq_len or shorten the request"
            )

    def abort(self, request_id: int) -> Request | None:
        request = self.scheduler.abort(request_id)
        if request is not None and self.drafter is not None:
            self.drafter.finish(request_id)
        return request

    # ---- the loop --------------------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """One round: admit and prefill new requests, then one speculative step for the others. Returns the
        requests that finished in this round."""
        admitted = self.scheduler.admit()
        if admitted:
            self.prefill(admitted)
        ready = [r for r in self.scheduler.running if not r.finished and r not in admitted]
        if ready:
            trees = self.propose(ready)
            paths, features = self.verify_accept_commit(ready, trees)
            self.emit(ready, trees, paths, features)
        finished = self.scheduler.retire()
        if self.drafter is not None:
            for request in finished:
                self.drafter.finish(request.request_id)
        return finished

    def run(self) -> None:
        while not self.scheduler.idle:
            self.step()

    def prefill(self, requests: list[Request]) -> None:
        """Commit the prompts; the first new token is sampled from each prompt's last logits."""
        start = time.perf_counter()
        logits, features = self.runner.prefill_with_features([r.slot for r in requests],
                                                             [r.prompt for r in requests])
        for index, (request, row) in enumerate(zip(requests, logits, strict=True)):
            request.emit([sample(target_distribution(row, request.params), request.generator)])
            request.stats.prefill_seconds = time.perf_counter() - start
            if self.drafter is not None:
                wanted = self.drafter.target_features is not None
                self.drafter.start(self._draft_view(request), features[index, :len(request.prompt)] if wanted else None)

    def propose(self, requests: list[Request]) -> list[DraftTree]:
        """A tree per request rooted at its newest token (emitted, not yet scored by the target)."""
        if self.drafter is None:
            return [DraftTree([r.output[-1]], [-1]) for r in requests]
        trees = self.drafter.propose([self._draft_view(r) for r in requests], self.config.shape)
        for tree, request in zip(trees, requests, strict=True):
            if tree.tokens[0] != request.output[-1]:
                raise RuntimeError(f"drafter {type(self.drafter).__name__} rooted a tree at the wrong token")
        return trees

    def verify_accept_commit(self, requests: list[Request], trees: list[DraftTree]):
        """Score every tree in one target forward, accept a path per request, commit those paths. -> (per request
        (accepted path, bonus token), the nodes' target features [B, T, F] for a drafter that takes them, else None)."""
        batch = StepBatch.trees([r.slot for r in requests], [t.tokens for t in trees], [t.parents for t in trees])
        logits, features, ctx = self.forward.score_all(batch)  # [B, T, V], [B, T, F] on the model's device
        argmax = logits.argmax(-1).tolist()  # greedy requests need only this: [B, T] ints leave the device
        results = []
        for row, (request, tree) in enumerate(zip(requests, trees, strict=True)):
            forced = self.drafter.forced_path(tree) if self.drafter is not None else None
            if forced is not None:  # a benchmark drafter's synthetic acceptance; the bonus is the target's argmax
                results.append((forced, argmax[row][forced[-1]]))
            else:
                results.append(accept_greedy(tree, argmax[row]) if request.params.greedy else None)
        sampled = [row for row, result in enumerate(results) if result is None]
        if sampled:  # all sampled rows walk together on the device (acceptance.py)
            probs = torch.empty(len(sampled), *logits.shape[1:], device=logits.device)
            groups: dict[tuple, list[int]] = {}  # rows by (temperature, top_k, top_p): one call per group
            for index, row in enumerate(sampled):
                params = requests[row].params
                groups.setdefault((params.temperature, params.top_k, params.top_p), []).append(index)
            for group in groups.values():
                rows = [sampled[index] for index in group]
                probs[group] = target_distribution(logits[rows], requests[rows[0]].params)
            walks = accept_batch([trees[row] for row in sampled], probs, [requests[row].generator for row in sampled])
            for row, walk in zip(sampled, walks, strict=True):
                results[row] = walk
        width = max(len(path) for path, _ in results)
        accepted = torch.tensor([path + [-1] * (width - len(path)) for path, _ in results])
        self.forward.commit(ctx, accepted, torch.tensor([len(path) for path, _ in results]))
        wanted = self.drafter is not None and self.drafter.target_features is not None
        return results, features.clone() if wanted else None  # graph outputs are overwritten by the next step

    def emit(self, requests: list[Request], trees: list[DraftTree], results, features=None) -> None:
        for request, tree, (path, bonus) in zip(requests, trees, results, strict=True):
            request.emit([tree.tokens[j] for j in path[1:]] + [bonus])
            request.stats.steps += 1
            request.stats.emitted_per_step.append(len(path))
            request.stats.drafted_per_step.append(len(tree) - 1)
        if self.drafter is not None:
            self.drafter.accepted([self._draft_view(r) for r in requests], trees, results, features)

    @staticmethod
    def _draft_view(request: Request) -> DraftRequest:
        return DraftRequest(request.request_id, request.tokens, request.params, request.generator)
