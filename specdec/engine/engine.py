"""The speculative decoding loop over a batch of requests, as small named steps:

    admit -> prefill -> propose -> score -> accept -> commit -> emit -> retire

score runs every node of every request's tree through the target in one forward (the linear layers' tree verify,
a tree mask in the attention layers), through the runner, which replays it from a CUDA graph where it can;
accept picks a path per tree (specdec/speculation/acceptance.py); commit keeps that path's entries. Nothing is
snapshotted and nothing is rolled back. Without a drafter every tree is just the root: plain decoding on the same
code. docs/design.md section 3 has the data flow.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

import torch

from drafters.base import Drafter
from specdec.cache.step import StepBatch, host_longs
from specdec.models.base import HybridCausalLM
from specdec.parallel import broadcast_seconds
from specdec.runner import ModelRunner
from specdec.speculation import (
    Acceptance,
    DraftTree,
    SamplingParams,
    TargetAcceptance,
    sample,
)
from specdec.speculation.adaptive import AdaptivePolicy, StepCostPrior, StepPlan, flat_prior, unpadded
from specdec.speculation.sampler import SamplerRows, SamplerShape
from specdec.speculation.sampling import target_distribution
from specdec.speculation.tree import MAX_TREE_NODES, TreeShape

from .config import EngineConfig
from .heap import freeze_heap
from .prefill import PrefillQueue
from .request import Request
from .scheduler import Scheduler


class Engine:
    """acceptance: who decides which drafts are kept (default: the target, losslessly; benchmarks on random
    weights inject a synthetic one, specdec/eval/synthetic.py). step_cost: the adaptive policy's prior step cost
    (specdec/eval/step_cost.py: the roofline of the target's step; default flat, every shape measured first)."""

    def __init__(self, target: HybridCausalLM, drafter: Drafter | None = None, config: EngineConfig = EngineConfig(),
                 acceptance: Acceptance | None = None, step_cost: StepCostPrior | None = None):
        if config.shape.dynamic and not (drafter is not None and drafter.supports_dynamic_trees):
            raise ValueError("dynamic trees need a drafter that scores its drafts: use --draft mtp or eagle3:PATH, "
                             "or a static tree (leave out --dynamic-tree)")
        if drafter is not None:
            drafter.check_shape(config.shape)  # (the drafter's own limits first: its message is the more precise)
            if config.shape.budget + 1 > MAX_TREE_NODES:
                raise ValueError(f"this draft shape drafts {config.shape.budget} tokens per step, more than the "
                                 f"{MAX_TREE_NODES - 1} a step verifies: cap it with num_draft_tokens (at most "
                                 f"{MAX_TREE_NODES - 1}) or lower num_steps / topk")
        self.target = target
        self.drafter = drafter
        self.config = config
        self.acceptance = acceptance or TargetAcceptance()
        width = config.shape.budget + 1 if drafter else 1  # nodes per verify step: the root and its drafts
        features = drafter.target_features if drafter is not None else None
        adaptive = drafter is not None and config.speculation == "adaptive"
        # adaptive speculation's plain steps (nobody drafts) run plain decoding's decode steps (plain_step), unless
        # the drafter takes the target's features of every token scored (EAGLE-3, MTP): a decode step hands none
        # back, so theirs stay verify steps of width 1, whose features drafter.skipped reads
        self.plain_decodes = adaptive and features is None
        self.runner = ModelRunner.create(target, config.cache, step_width=width, cuda_graphs=config.cuda_graphs,
                                         feature_layers=features or (), decode_steps=self.plain_decodes)
        self.runner.cache.reserve(width)
        self.scheduler = Scheduler(self.runner.cache, draft_budget=config.shape.budget if drafter else 0,
                                   max_batch=config.cache.max_requests)
        self.prefills = PrefillQueue(self.runner, config.max_prefill_tokens)  # admitted, prompts not all committed
        self._ids = itertools.count()
        self._decoding = None  # (requests, DecodeHandle, adaptive) of the plain decoding step in flight
        self._plain_run = 0  # adaptive: plain steps in a row so far, no speculative step nor emit draining them since
        # adaptive: whether the runner's tokens on the device are every running request's newest (a speculative step
        # leaves them behind; a prefill writes its own requests', a plain step samples its rows')
        self._device_tokens_current = True
        self._greedy_rows: dict[int, SamplerRows] = {}  # batch size -> the sampler's rows of a greedy batch
        self.context_length = getattr(target.hf_config, "max_position_embeddings", None)
        self.policy = None  # chooses each step's shape (adaptive speculation)
        self._pending_outcome = None  # the last speculative step's outcome, not yet told to the policy (hold_outcome)
        self._unrecorded = None  # the last speculative step's rows, their stats not yet recorded (record_stats)
        if adaptive:
            # chains up to the configured shape's depth, and the shape itself where it is a tree that branches
            shape = config.shape
            tree = shape if shape.topk > 1 and shape.budget > shape.depth else None
            adaptive = replace(config.adaptive, max_steps=shape.depth, tree=tree)
            graphs = self.runner.graphs  # (a step of B requests costs the graph batch it pads up to)
            self.policy = AdaptivePolicy(adaptive, step_cost or flat_prior,
                                         graphs.padded_rows if graphs is not None else unpadded)
            if graphs is not None:  # a graph per width the policy may choose: none padded to the widest
                graphs.set_widths(self.verify_widths, adaptive.width_max_batch)

    @property
    def verify_widths(self) -> tuple[int, ...]:
        """Adaptive speculation: the verify steps' widths (nodes per row) its plans may choose; plain steps are
        decode steps where plain_decodes."""
        return tuple(w for w in self.policy.config.widths if w > 1 or not self.plain_decodes)

    def prepare_steps(self, rows: int, prompt_tokens: int, max_new_tokens: int, built_one=None) -> int:
        """Build ahead of time whatever the steps of up to `rows` requests of these lengths will need (CUDA graphs
        on a GPU; built_one() after each), as benchmarks and `specdec serve` do; the rest is built when first needed.
        Then freeze the heap (heap.py: a full garbage collection over all that was built stalls a step for hundreds
        of ms). -> how many step graphs were built."""
        width, longest = (self.config.shape.budget + 1 if self.drafter else 1), prompt_tokens + max_new_tokens
        if self.policy is not None:  # (its step costs' prior too: computed on first use, on the steps' critical path)
            self.policy.prepare(rows, prompt_tokens, longest + width)
        built = self.runner.capture(rows, prompt_tokens + width, longest + width, built_one)
        freeze_heap()
        return built

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
        self.record_stats()
        self.prefills.drop(request_id)
        request = self.scheduler.abort(request_id)
        if request is not None and self.drafter is not None:
            self.drafter.finish(request_id)
        if request is not None and self.policy is not None:  # (its last step's outcome first: the policy then forgets
            self.observe_pending()  # it, where an aborted request's acceptance stayed for the server's lifetime)
            self.policy.finish(request_id)
        return request

    # ---- the loop --------------------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """One round: admit new requests and run one prefill forward of the waiting prompts (prefill.py), then one
        speculative step for the prefilled others (propose -> score -> accept -> commit -> emit; plain decoding:
        launch a decode step that commits and samples on the device, then emit the step before it; adaptive
        speculation's plain steps likewise: adaptive_step).
        Returns the requests that finished in this round."""
        self.prefills.add(self.scheduler.admit())
        started = []
        if self.prefills.waiting:
            self.finish_decode()
            started = self.prefill_forward()
        # (not the requests still prefilling, nor those whose first token the prefill just emitted)
        ready = [r for r in self.scheduler.running if r.finish_reason is None and r.output and r not in started]
        if self.drafter is None:  # plain decoding, one step ahead of the host (decode_step)
            self.decode_step([r for r in ready if len(r.output) + r.in_flight < r.max_new_tokens])
        elif self.plain_decodes:
            self.adaptive_step([r for r in ready if len(r.output) + r.in_flight < r.max_new_tokens])
        elif ready:
            self.speculative_step(ready, time.perf_counter(), self.plan(ready))
        finished = self.scheduler.retire()
        if finished:  # (their rows' outcome and stats first: the policy forgets a request when it finishes, and the
            self.observe_pending()  # caller reads its stats)
            self.record_stats()
        if self.drafter is not None:
            for request in finished:
                self.drafter.finish(request.request_id)
                if self.policy is not None:
                    self.policy.finish(request.request_id)
        return finished

    def speculative_step(self, requests: list[Request], start: float, plan: StepPlan | None) -> None:
        """propose -> score -> accept -> commit -> emit, and the step's outcome to the adaptive policy (its wall time
        since `start`, planning included), told while the device verifies the next step (observe_pending)."""
        trees = self.propose(requests, plan)
        logits, features, scored = self.score(requests, trees)
        self.record_stats()  # (the step before's, and its outcome: host work while the device verifies this step)
        self.observe_pending()
        if self.policy is not None:  # (the next plan's rows worked out now, off the path between read and launch)
            self.policy.warm([r.request_id for r in requests])
        results = self.accept_and_commit(requests, trees, logits, scored)
        self.emit(requests, trees, results, features, plan)
        self.hold_outcome(requests, trees, results, time.perf_counter() - start)
        self._plain_run = 0
        self._device_tokens_current = False

    def adaptive_step(self, requests: list[Request]) -> None:
        """Adaptive speculation whose plain steps decode (plain_decodes): the plan's plain step, or a speculative
        one. A plain step may leave its tokens in flight; a speculative step first emits them (its drafters read
        the requests' tokens) and plans again (its rows and their lengths may have changed)."""
        start = time.perf_counter()
        if not requests:  # (every row's last token in flight)
            self.finish_decode()
            return
        plan = self.plan(requests)
        if plan.steps > 0 and self._decoding is not None:
            self.finish_decode()
            requests = [r for r in requests if not r.finished]
            if not requests:  # (the plan goes unobserved: the next one replaces it)
                return
            start, plan = time.perf_counter(), self.plan(requests)  # (the wait: the plain step's, measured there)
        if plan.steps == 0:
            self.plain_step(requests, start)
        else:
            self.speculative_step(requests, start, plan)

    def plain_step(self, requests: list[Request], start: float) -> None:
        """A step in which nobody drafts, as plain decoding runs it (decode_step: committed in its forward, the next
        token sampled on the device, the host one step ahead). The first plain step after a speculative step writes
        the rows' newest tokens to the device first (the runner's tokens, which a speculative step leaves behind; a
        prefill writes its own requests'); every step, the first too, emits the step before
        it while the device runs it (the first was waited for and emitted at once until 2026-12-06: after every
        drafting step the device idled through a plain step's host work). The policy is told the time of a
        pipelined step only, from the third of a run on (the time between two steps: what a plain step costs in a
        run of them, which is what choosing plain decoding buys): the first's includes the pipeline's refill, the
        second's only what is left of the first (the H200 study of 2026-12-02: at batch 256 the first of a run took
        15.5-20.5 ms where a pipelined step takes 14.0, and plain decoding, priced from first steps, lost to
        2-chains it beats by 8%; at batch 1 the second took 0.6 ms of a 6 ms step). Emitted tokens are told to the
        drafter as skipped rows' are (emit_decoded)."""
        run = self._plain_run  # (the plain steps before this one in its run)
        if not self._device_tokens_current:  # (not after a prefill alone: it wrote its requests', 2026-12-07)
            self.runner.set_tokens([r.slot for r in requests], [r.output[-1] for r in requests])
            self._device_tokens_current = True
        self.decode_step(requests, adaptive=True)
        self._plain_run = run + 1
        zeros = [0] * len(requests)
        # (a pipelined step only; under tensor parallelism rank 0's time on every rank: parallel.broadcast_seconds)
        seconds = broadcast_seconds(time.perf_counter() - start, self.target.tp) if run >= 2 else None
        self.observe_pending()  # (outcomes in the order of their steps)
        self.policy.observe([r.request_id for r in requests], zeros, zeros, seconds)

    def run(self) -> None:
        while not self.scheduler.idle:
            self.step()

    def prefill_forward(self) -> list[Request]:
        """One prefill forward of the waiting prompts (PrefillQueue: at most config.max_prefill_tokens padded
        tokens); each prompt it finishes gets its first new token, sampled from its last logits. -> those requests."""
        wanted = self.drafter is not None and self.drafter.target_features is not None
        done = self.prefills.forward(wanted)
        for request, logits, features in done:
            request.emit([sample(target_distribution(logits, request.params), request.generator)])
            request.stats.prefill_seconds = time.perf_counter() - request.stats.admitted
            if self.drafter is not None:
                self.drafter.start(request.drafter_view(), features)
        if done and (self.drafter is None or self.plain_decodes):  # decode steps read the newest tokens on the device
            self.runner.set_tokens([r.slot for r, _, _ in done], [r.output[-1] for r, _, _ in done])
        return [request for request, _, _ in done]

    def admit_and_prefill(self) -> None:
        """Admit what fits and prefill all of it now, with no decode step between (benchmarks: timed steps that
        start from a whole prefilled batch)."""
        self.prefills.add(self.scheduler.admit())
        self.finish_decode()
        while self.prefills.waiting:
            self.prefill_forward()

    def plan(self, requests: list[Request]) -> StepPlan | None:
        """Adaptive speculation: this step's chain length and drafting rows (None: every row drafts config.shape).
        A request's context counts its token in flight (a plain step's, not emitted yet)."""
        if self.policy is None:
            return None
        ids = [r.request_id for r in requests]
        backlog = self.drafter.backlog(ids) if self.drafter is not None else 0
        return self.policy.plan(ids, [len(r.tokens) + r.in_flight for r in requests], backlog)

    def propose(self, requests: list[Request], plan: StepPlan | None = None) -> list[DraftTree]:
        """A tree per request rooted at its newest token (emitted, not yet scored by the target); a row the plan
        leaves out of drafting is its root alone."""
        if self.drafter is None:
            return [DraftTree([r.output[-1]], [-1]) for r in requests]
        if plan is None:  # fixed speculation: every row drafts the configured shape
            trees = self.drafter.propose([r.drafter_view() for r in requests], self.config.shape)
        elif all(plan.drafting):  # (the policy's drafting plans: every row, the plan's chain or the tree)
            trees = self.drafter.propose([r.drafter_view() for r in requests], self._plan_shape(plan))
        else:
            trees = [DraftTree([r.output[-1]], [-1]) for r in requests]
            drafting = [i for i in range(len(requests)) if plan.drafting[i]]
            if drafting:
                shape = self._plan_shape(plan)
                drafted = self.drafter.propose([requests[i].drafter_view() for i in drafting], shape)
                for i, tree in zip(drafting, drafted, strict=True):
                    trees[i] = tree
        for tree, request in zip(trees, requests, strict=True):
            if tree.tokens[0] != request.output[-1]:
                raise RuntimeError(f"drafter {type(self.drafter).__name__} rooted a tree at the wrong token")
        return trees

    def _plan_shape(self, plan: StepPlan) -> TreeShape:
        """What a drafting plan drafts: the configured tree, or a chain of the plan's length."""
        return self.config.shape if plan.tree else TreeShape(steps=plan.steps)

    def decode_step(self, requests: list[Request], adaptive: bool = False) -> None:
        """Plain decoding, overlapped with the host: launch this step for `requests` (each newest token, on the
        device, through the target, committed in the same forward; the next token sampled on the device:
        ModelRunner.decode_next), then, while the device runs it, emit what the step before it sampled. The host
        never waits for the step it just launched: its bookkeeping for a step needs no result of it (one token per
        request, known in advance), and a step's tokens come from the one before it on the device. A request that
        ends (end of sequence, a stop string) takes part in one step more, whose token is dropped, and keeps its
        slots until then (Scheduler.retire). adaptive: a plain step of adaptive speculation (plain_step)."""
        previous, self._decoding = self._decoding, None
        if requests:
            rows, shape = self._sampler_rows(requests)
            handle = self.runner.decode_next([r.slot for r in requests], rows, shape)
            for request in requests:
                request.in_flight += 1
            self._decoding = (requests, handle, adaptive)
        if previous is not None:
            self.emit_decoded(*previous)

    def _sampler_rows(self, requests: list[Request]) -> tuple[SamplerRows, SamplerShape]:
        """The sampler's inputs for a decode step of these requests: a greedy batch draws no uniforms and reads only
        its argmax, so its (all-zero) rows are made once per batch size (four tensors of a list each cost more than
        the rest of the step's set-up at a batch of 256)."""
        params = [r.params for r in requests]
        if not all(p.greedy for p in params):
            return SamplerRows.of(params, [r.generator for r in requests]), SamplerShape.of(params)
        if len(requests) not in self._greedy_rows:
            self._greedy_rows[len(requests)] = SamplerRows.of(params, [None] * len(requests))
        return self._greedy_rows[len(requests)], SamplerShape()

    def finish_decode(self) -> None:
        """Emit the step in flight, if any (before a prefill, a speculative step, and at the end); a plain step
        after it then starts a new run (plain_step)."""
        self._plain_run = 0
        if self._decoding is not None:
            previous, self._decoding = self._decoding, None
            self.emit_decoded(*previous)

    def emit_decoded(self, requests: list[Request], handle, adaptive: bool = False) -> None:
        """A plain decoding step's tokens, one per request (waiting for that step only); a request that ended after
        the step was launched drops its token. adaptive: a plain step of adaptive speculation, told to the drafter
        as the roots its rows scored without drafting (as _tell_skipped)."""
        emitted, roots, tokens = [], [], handle.tokens()
        self.record_stats()  # (a speculative step's before this one's: the stats keep the steps' order)
        if adaptive and self.policy.wants_shadows:
            self._observe_shadows(requests, tokens)
        for request, token in zip(requests, tokens, strict=True):
            request.in_flight -= 1
            if request.finished:
                continue
            if adaptive:
                emitted.append(request)
                roots.append(request.output[-1])
                request.stats.shapes["plain"] += 1
            request.emit([token])
            request.stats.steps += 1
            request.stats.emitted_per_step.append(1)
            request.stats.drafted_per_step.append(0)
        if emitted:
            self.drafter.skipped([r.drafter_view() for r in emitted], roots, None)

    def _observe_shadows(self, requests: list[Request], tokens: list[int]) -> None:
        """Adaptive speculation's plain step: each live row's first draft, where the drafter drafts for nothing
        (Drafter.shadow_drafts: n-gram, synthetic), checked against the token the step emitted
        (Acceptance.shadow_kept) and told to the policy (AdaptivePolicy.observe_shadows), which then probes a
        collapsed batch only when its shadows say it may have recovered (replayed on the H200 traces at 1.2 accepted:
        0.96-0.99x of plain decoding -> 0.98-1.00x, benchmarks/results/adaptive_shadow_replay_cpu_2026-12-04.md)."""
        live = [row for row, request in enumerate(requests) if not request.finished]
        if not live:
            return
        views = [requests[row].drafter_view() for row in live]
        drafts = self.drafter.shadow_drafts(views)
        if drafts is None:
            return
        kept = self.acceptance.shadow_kept([view.tokens for view in views], drafts, [tokens[row] for row in live])
        self.policy.observe_shadows([view.request_id for view in views], kept)

    def score(self, requests: list[Request], trees: list[DraftTree]):
        """Every node of every tree in one target forward. -> (logits [B, T, V], the nodes' features [B, T, F] for
        a drafter that takes them (else None), the scored step to commit)."""
        batch = StepBatch.trees([r.slot for r in requests], [t.tokens for t in trees], [t.parents for t in trees])
        logits, features, scored = self.runner.score_all(batch)
        wanted = self.drafter is not None and self.drafter.target_features is not None
        return logits, features.clone() if wanted else None, scored  # the runner reuses its outputs next step

    def accept_and_commit(self, requests: list[Request], trees: list[DraftTree], logits: torch.Tensor, scored):
        """The target's acceptance of the step, and the commit of what it kept -> per row its path and bonus token.
        Chains (greedy and sampled rows: TargetAcceptance.accept_on_device; the synthetic benchmark's) on the static
        path are committed before the host reads their acceptance, so the device runs the commit while the host
        waits, emits and drafts; trees are read first, then committed."""
        params, generators = [r.params for r in requests], [r.generator for r in requests]
        on_device = getattr(self.acceptance, "accept_on_device", None)
        accepted = on_device(trees, logits, params, generators) if on_device is not None else None
        if accepted is not None:
            results = self.runner.commit_on_device(scored, accepted)
            if results is None:  # an eager step: read, then commit
                results = accepted.read()
                self.commit(scored, results)
            return results
        results = self.acceptance.accept(trees, logits, params, generators)
        self.commit(scored, results)
        return results

    def commit(self, scored, results: list[tuple[list[int], int]]) -> None:
        """Keep each row's accepted path (root first) of the scored step."""
        counts = [len(path) for path, _ in results]
        width = max(counts)
        num_accepted = host_longs(counts)
        if all(path[-1] == count - 1 for (path, _), count in zip(results, counts, strict=True)):
            # every path is its tree's first nodes 0..count-1 (a chain's paths: node indices grow along a path)
            nodes = torch.arange(width)
            accepted = torch.where(nodes < num_accepted[:, None], nodes, -1)
        else:
            accepted = host_longs([j for path, _ in results for j in (*path, *[-1] * (width - len(path)))],
                                  len(results), width)
        self.runner.commit(scored, accepted, num_accepted)

    def emit(self, requests: list[Request], trees: list[DraftTree], results, features=None,
             plan: StepPlan | None = None) -> None:
        """Each row's accepted tokens and bonus token to its request, then what the drafter must know before it
        drafts again. The rows' stats wait for record_stats (off the path between the acceptance read and the next
        launch: ~0.03 ms a step at batch 128 on a 2-core CPU)."""
        self.record_stats()
        for request, tree, (path, bonus) in zip(requests, trees, results, strict=True):
            count = len(path)  # a path 0..count-1 (every chain's) is a slice of the tree's tokens
            tokens = tree.tokens[1:count] if path[-1] == count - 1 else [tree.tokens[j] for j in path[1:]]
            tokens.append(bonus)
            request.emit(tokens)
        self._unrecorded = (requests, trees, results, plan.label if plan is not None else None)
        if self.drafter is None:
            return
        if plan is None or all(plan.drafting):  # every row drafted (fixed speculation, the policy's plans)
            self._tell_accepted(requests, trees, results, features)
            return
        drafting = [i for i in range(len(requests)) if plan.drafting[i]]
        skipped = [i for i in range(len(requests)) if not plan.drafting[i]]
        for rows, tell in ((drafting, self._tell_accepted), (skipped, self._tell_skipped)):
            if rows:
                tell([requests[i] for i in rows], [trees[i] for i in rows], [results[i] for i in rows],
                     features[rows] if features is not None else None)

    def record_stats(self) -> None:
        """Record the last speculative step's stats in its requests (RequestStats: tokens emitted and drafts offered
        per step, the shape chosen), if not yet done: after the next step's launch, and before anything reads them or
        records a later step's (a finished request's, an aborted one's, a plain step's)."""
        if self._unrecorded is None:
            return
        requests, trees, results, label = self._unrecorded
        self._unrecorded = None
        for request, tree, (path, _) in zip(requests, trees, results, strict=True):
            stats = request.stats
            stats.steps += 1
            stats.emitted_per_step.append(len(path))
            stats.drafted_per_step.append(len(tree.tokens) - 1)
            if label is not None:
                stats.shapes[label] += 1

    def _tell_accepted(self, requests: list[Request], trees, results, features) -> None:
        self.drafter.accepted([r.drafter_view() for r in requests], trees, results, features)

    def _tell_skipped(self, requests: list[Request], trees, results, features) -> None:
        roots = [tree.tokens[0] for tree in trees]
        self.drafter.skipped([r.drafter_view() for r in requests], roots,
                             features[:, 0] if features is not None else None)

    def hold_outcome(self, requests: list[Request], trees: list[DraftTree], results, seconds: float) -> None:
        """Keep what a speculative step did for the adaptive policy (drafts offered and kept per row, the step's wall
        time, its plan) until observe_pending tells it: the next step is planned and launched first, so the policy's
        bookkeeping (~0.6 ms of Python at batch 128 on a 2-core CPU: benchmarks.host_step --adaptive-drafting) runs
        while the device verifies, not between a step's acceptance and the next launch, where the device idles; so
        do the lists of what each row drafted and kept, and the next plan's rows (AdaptivePolicy.warm, after the
        outcome before is told): that critical path 0.65 -> 0.56 ms, against 0.48 for fixed chains."""
        if self.policy is not None:  # (the rows' figures listed when told: that too is host work off the path)
            self._pending_outcome = (requests, trees, results, seconds, self.policy.take_planned())

    def observe_pending(self) -> None:
        """Tell the adaptive policy the held outcome of the last speculative step, if any."""
        if self._pending_outcome is not None:
            requests, trees, results, seconds, planned = self._pending_outcome
            self._pending_outcome = None
            paths = None  # (a tree step's: what the rank model learns from)
            if planned is not None and planned.plan.tree:
                paths = [(tree.parents, path) for tree, (path, _) in zip(trees, results, strict=True)]
            self.policy.observe([r.request_id for r in requests], [len(t) - 1 for t in trees],
                                [len(path) - 1 for path, _ in results],
                                broadcast_seconds(seconds, self.target.tp), planned, trees=paths)
