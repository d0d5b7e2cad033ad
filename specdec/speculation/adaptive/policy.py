"""The per-step choice of the speculation shape for a batch: no drafting, a chain of 1..S drafts, or the configured
tree, one width for the whole batch (the engine verifies one width per step, each a captured CUDA graph width
on a GPU).

    rate(s) = sum_i E_i(s) / cost(B, s + 1),   E_i(s) = expected tokens request i emits with s drafts

A tree's E_i comes from the same per-position acceptance as the chains' and a sibling acceptance pooled over
requests (tree_yield.py: the rank model), both learnt from its steps as well as the chains'.

In a drafting step every row drafts: the step's width, and so its cost, is the batch's, and a row left out of it would
emit one token where drafting costs the target nothing more. (The first policy switched rows off one by one; in the H200
study of 2026-12-02 at batch 64 and acceptance 2.72 its batch took 49 steps where fixed chains took 31, each step still
paying the widest row's width: 0.65x the fixed chains' tokens/s.) A request whose first draft is rarely accepted (p[0] <
collapse, and its tree's first level as rarely) counts as emitting one token in the rates, its drafts not worth a wider
step (one whose tree alone keeps a first draft more often: one token in every chain's rate, and collapsed where the tree
is not offered, above tree_max_batch, where rows are priced as if none were configured); once a batch holding such
requests has run `probe_every` steps without drafting, a probe step drafts again, so that requests that recovered are
seen (and twice as long after each probe that changed nothing, up to PROBE_BACKOFF times). Where drafting costs nothing
(n-gram, synthetic drafts), plain steps check each collapsed row's first draft against the token they emit (shadow
drafts, observe_shadows), and such a batch is probed only when its shadows say it may have recovered, nor does it
explore or refresh a drafting shape meanwhile; they hold the chains of a row whose own drafts collapsed, too
(chains_collapsed), which relaxing toward the pooled acceptance (below) brought back every ~15 plain steps. A
request's acceptance is learnt from its drafting steps, and while it does not draft it relaxes toward the pooled
acceptance (RunningAcceptance.relax): a short run of rejections can make drafting look worse than plain decoding while
it is not (at batch 1 a 4-chain step costs ~1.8 plain ones; the H200 study of 2026-12-02 held a batch of one on plain
steps for the rest of its run after three). The shapes are compared at their hopeful yields (each row's acceptance
a deviation higher: AdaptiveConfig.optimism), so that a shape some unlucky drafts undersold is drafted again; but
where the estimates prefer plain decoding to every drafting shape, the batch decodes plainly and drafts what hope
prefers only in trials, every probe_every such steps and twice as far apart after each: near the break-even, a
batch of one would otherwise draft on hope in most steps. A batch that decodes plainly because drafting costs more
than it brings even on hope is not probed. A new request's acceptance starts from the acceptance pooled
over the requests seen (the drafter's figures before any): at 1.2 accepted, the H200 study's new requests drafted
4-chains for their first steps from the drafter's 0.75.

Step costs (step_cost.py) are measured per batch bucket; a shape not yet measured in the batch's bucket borrows a
factor, and is measured there once the bucket has run a few steps, the batch not shrinking, if it may be the best
(_explore); a shape chosen to be measured is held until a step of it teaches a cost (_held: plain steps teach one
from the third of a run).
"""

from __future__ import annotations

import functools
from collections import Counter, deque
from collections.abc import Sequence

from .acceptance_stats import SURE_OF, RunningAcceptance
from .config import AdaptiveConfig
from .plan import PlannedStep, StepPlan
from .shadows import ShadowDrafts
from .step_cost import CatchUpCost, StepCost, StepCostPrior, StepRows, batch_bucket, flat_prior, unpadded
from .tree_yield import SiblingAcceptance, child_lists, rank_outcome
from .tuning import (
    BORROWED_CONTENDER,
    CATCH_UP_STEPS,
    CONTENDER,
    EXPLORE_AFTER,
    MEASURE_FOR,
    POPULATION_DECAY,
    PROBE_BACKOFF,
    REFRESH_BACKOFF,
    REFRESH_CONTENDER,
    SETTLED_MARGIN,
    SETTLED_REPLAN,
    SINGLE_TRUSTED,
)


class AdaptivePolicy:
    """Chooses each step's plan (plan), learns from its outcome (observe); counts: steps per shape label."""

    def __init__(self, config: AdaptiveConfig = AdaptiveConfig(), prior: StepCostPrior = flat_prior,
                 step_rows: StepRows = unpadded):
        self.config = config
        self.cost = StepCost(prior, rows=step_rows)  # (step_rows: the rows a batch's step runs, StepCost)
        self.catch_up = CatchUpCost()  # what the drafter's backlog costs (a draft model's missed steps, prompts)
        self.acceptance: dict[int, RunningAcceptance] = {}
        self.population = RunningAcceptance(config.prior_at(config.max_steps), config.prior_weight, POPULATION_DECAY)
        self.siblings = SiblingAcceptance(config.sibling_prior, config.prior_weight, POPULATION_DECAY)  # (trees)
        self.counts: Counter[str] = Counter()
        self.steps = 0
        self.since_drafting = 0  # batch steps since the last step in which anyone drafted
        self.last_measured: dict[tuple[int, int], int] = {}  # (bucket, shape) -> step it last ran
        self.bucket_steps: Counter[int] = Counter()  # steps run per batch bucket
        self.recent_batches: deque[int] = deque(maxlen=EXPLORE_AFTER)  # the batches of the last steps observed
        self.probe_interval = config.probe_every  # plain steps before the next probe (doubled while probes fail)
        self.trial_interval = config.probe_every  # steps drafting best only on hope waits for a trial (doubled each)
        self.hope_waited = 0  # steps since drafting best only on hope was last tried (or was not so)
        self.trace: list[dict] | None = None  # a list to record each step's decision in (`specdec bench
        # --policy-trace`): batch, steps chosen, each shape's estimated ms and tokens/s, then its measured ms
        self._in_flight: tuple[int, int] | None = None  # (bucket, shape) of a taken plan whose outcome is not told yet
        self._measuring: tuple[int, int] | None = None  # (bucket, shape) chosen to be measured, until it is
        self._measure_steps = 0  # steps held for it so far
        self.refresh_interval = config.refresh_every  # steps between refreshes (doubled while they confirm the best)
        self._last_refresh = 0  # the step of the last refresh
        self._best_at_refresh: int | None = None  # the best shape when the last refresh ran, until it is judged
        self._probed = False  # the last plan was a probe
        self._planned: PlannedStep | None = None  # the last plan, awaiting its outcome
        self.shadows = ShadowDrafts(config.collapse)  # (observe_shadows)
        # requests whose first draft their own drafts last showed collapsed (p[0] < collapse): while their shadow
        # drafts, where the drafter makes them, do not show them recovered, their chains stay priced at one token,
        # whatever relaxing toward the pooled acceptance made of their estimate since (_row_figures)
        self.chains_collapsed: set[int] = set()
        # whether the last plan's batch held a collapsed row, whose shadows could call a probe: the engine checks
        # them only then (0.13-0.26 ms of Python a plain step at batch 256 on a 2-core CPU: benchmarks.host_step,
        # benchmarks/results/adaptive_shadow_replay_cpu_2026-12-04.md)
        self.wants_shadows = False
        # the rows' figures of the last batch priced (_batch_tokens), and a count of the changes to any row's figures
        self._batch_memo: tuple[tuple, tuple[dict[int, float], dict[int, float], list[bool]]] | None = None
        # a new request's running acceptance, at the pooled figures (_stats copies it), until they change (observe):
        # the rows of a new batch are priced once, not once each (the first plan of 64 new requests, in the step that
        # refills the pipeline after a prefill: 0.28 ms of Python on a 2-core CPU priced row by row, 0.10 so;
        # benchmarks/results/adaptive_first_plan_cpu_2026-12-07.md)
        self._new_request: RunningAcceptance | None = None
        self._figures_version = 0
        # a settled plain run: (its requests, the step from which it is planned in full again), plan
        self._settled: tuple[tuple[int, ...], int] | None = None
        self._pooled_memo: tuple[float, ...] | None = None  # _pooled, until the population next learns

    def prepare(self, rows: int, shortest: int, longest: int) -> None:
        """Price now every step this policy may plan for batches of up to `rows` requests whose mean context lies in
        [shortest, longest] tokens (a server's or a benchmark's warm-up, beside its graph captures). A roofline prior
        builds its figures on first use, 1.5-2.6 ms of Python each at real shapes (specdec/eval/step_cost.py), and a
        shrinking batch's tail meets new batches every few steps: in the H200 study of 2026-12-03 (Nemotron-3-Nano,
        batch 16) tail steps planned at batches 5-7 took 16-40 ms against ~12 for their like."""
        contexts = {shortest, longest} | {1 << k for k in range(shortest.bit_length(), longest.bit_length())}
        for batch in range(1, rows + 1):
            for width in self.config.widths:
                for context in contexts:
                    self.cost.prior(self.cost.rows(batch), width, float(context))

    def plan(self, request_ids: Sequence[int], contexts: Sequence[int], backlog: int = 0) -> StepPlan:
        """The plan for a step of these requests (their tokens so far: contexts). backlog: the tokens the drafter
        must read before it drafts for them (Drafter.backlog: a draft model's steps sat out, unread prompts), which a
        drafting step pays on top of its shape's cost, spread over CATCH_UP_STEPS."""
        batch, context = len(request_ids), sum(contexts) / max(len(contexts), 1)
        if (self._settled is not None and self._settled[0] == tuple(request_ids) and self.steps < self._settled[1]
                and self.trace is None):  # (what the last full plan chose, as it would choose again: below)
            plan = StepPlan(0, (False,) * batch, False)
            self._planned = PlannedStep(batch, context, plan, backlog, None)
            return plan
        self._settled = None
        emitted, hoped, worth = self._batch_tokens(request_ids)
        collapsed = batch - sum(worth)  # a collapsed row counts one token, whatever it drafts
        self.wants_shadows = collapsed > 0 or not self.chains_collapsed.isdisjoint(request_ids)
        catch_up = self.catch_up.seconds(backlog)
        shapes = self.config.shapes if self._tree_offered(batch) else self.config.chain_shapes
        seconds = {s: self.cost.seconds(batch, s + 1, context) for s in shapes}

        def per_second(tokens: dict[int, float], catch_up_share: float) -> dict[int, float]:
            return {s: (tokens[s] + collapsed) / (seconds[s] + (catch_up_share if s else 0.0)) for s in shapes}

        # the shapes are compared at their hopeful yields (each row's acceptance `optimism` deviations higher: a
        # request whose first drafts undersold it, a tree whose first siblings were rejected, is drafted again), but
        # drafting against plain decoding, which the estimates prefer, only in trials (below): near the break-even a
        # batch of one drafted on hope in most steps (on the 2-core CPU the shipped draft model's 2-chain step cost
        # 2.2 plain ones for 2.2 tokens: adaptive drafted in 39-59% of its steps and ran at 0.92-0.93x of plain
        # decoding at batch 1; benchmarks/results/adaptive_optimism_cpu_2026-12-07.md)
        estimated_rates = per_second(emitted, catch_up / CATCH_UP_STEPS)
        rates = per_second(hoped, catch_up / CATCH_UP_STEPS)
        # a shape tried for a step or two (_explore) pays the whole catch-up: on the CPU, refreshes of a draft model's
        # chains read 391 tokens of prompts in a 71 ms step among plain ones of 10
        trial_rates = per_second(hoped, catch_up)
        # (a margin that drafting must beat plain decoding by, against the pipeline's refill and the ragged end of a
        # batch whose requests end together, was replayed on the H200 traces of 2026-12-04: 6% lifted Qwen3.5-9B at
        # batch 256 from 0.94 to 0.975 of the best and cost the points where drafting wins by a little, Qwen3.5-9B at
        # 1.2 accepted and batch 16 1.01 -> 0.985, Nemotron-3-Nano at 1.2 and 64 1.11 -> 1.08; the mean over the
        # replayed points 0.990 -> 0.988, at 10% 0.981: not kept)
        hoped_best = max(rates, key=lambda s: (rates[s], -s))
        # plain decoding where the estimates prefer it to every drafting shape and only hope prefers one
        best = 0 if max(estimated_rates, key=lambda s: (estimated_rates[s], -s)) == 0 else hoped_best
        steps = self._held(batch)
        if steps is None and self._best_at_refresh is not None:  # the refreshed shape measured: judge the refresh
            confirmed = best == self._best_at_refresh
            self.refresh_interval = (min(2 * self.refresh_interval, REFRESH_BACKOFF * self.config.refresh_every)
                                     if confirmed else self.config.refresh_every)
            self._best_at_refresh = None
        if steps is None:
            # (a batch whose every row collapsed, each watched by its shadow drafts, explores and refreshes no drafting
            # shape: such a step doubled as a probe, which the shadows now call when one is worth it)
            watched = not any(worth) and bool(self.shadows)
            steps = self._explore(batch, trial_rates, best, drafting=not watched)
            if steps is not None:
                self._measuring, self._measure_steps = (self._bucket(batch), steps), 1
        if steps is None:
            steps = best
        # a trial: the drafting shape that only hope prefers to plain decoding, every trial_interval steps that it is
        # so, twice as far apart after each, up to PROBE_BACKOFF times probe_every
        hopeful = best == 0 and hoped_best > 0
        self.hope_waited = self.hope_waited + 1 if hopeful else 0
        if not hopeful:
            self.trial_interval = self.config.probe_every
        trying = steps == 0 and hopeful and self.hope_waited >= self.trial_interval
        if trying:
            steps, self.hope_waited = hoped_best, 0
            self.trial_interval = min(2 * self.trial_interval, PROBE_BACKOFF * self.config.probe_every)
        probing = (steps == 0 and not all(worth) and self.since_drafting >= self.probe_interval
                   and self.shadows.call_a_probe(request_ids, worth))
        if probing:  # a probe: the best drafting shape (the cheapest when nobody's drafts count), every row drafting
            steps = max(self.config.chain_lengths, key=lambda s: (rates[s], -s))
        elif self._probed and best == 0:  # the last probe changed nothing: wait twice as long for the next
            self.probe_interval = min(2 * self.probe_interval, PROBE_BACKOFF * self.config.probe_every)
        elif best > 0:  # drafting pays again (a step that measures a shape says nothing of that: in the replay of
            # the H200 traces at acceptance 1.2 such steps reset the backoff, probes came every 16-33 steps)
            self.probe_interval = self.config.probe_every
        self._probed = probing
        if steps == 0 and hoped_best == 0 and not (trying or probing or self.wants_shadows) and all(worth):
            self._settle(request_ids, rates)
        plan = StepPlan(steps, (steps > 0,) * batch, self.config.is_tree(steps))
        decision = None
        if self.trace is not None:  # (recorded with its outcome: a plan the engine replaces is never observed)
            decision = {"batch": batch, "steps": steps, "drafting_worth": sum(worth), "backlog": backlog,
                        "estimated_ms": {s: 1e3 * seconds[s] for s in rates},
                        "tokens_per_second": rates, "estimated_tokens_per_second": estimated_rates,
                        "probe": probing,
                        "trial": trying,
                        # the rows' shadow drafts kept, pooled (None: no row has any)
                        "shadow_kept": self.shadows.pooled_kept(request_ids)}
        self._planned = PlannedStep(batch, context, plan, backlog, decision)
        return plan

    def _settle(self, request_ids: Sequence[int], rates: dict[int, float]) -> None:
        """After a full plan of plain decoding, best even on hope: plan the next SETTLED_REPLAN - 1 steps of these
        requests plainly without pricing them, where nothing in them could make this plan choose otherwise but a
        drift of the rates by SETTLED_MARGIN (a drafting step, a new or finished request, shadows, a trace end it):
        nothing is being measured, the batch's bucket is explored (EXPLORE_AFTER) and no refresh comes due."""
        drafting = max((rate for shape, rate in rates.items() if shape), default=0.0)
        refresh_due = (self.config.refresh_every
                       and self.steps + SETTLED_REPLAN - self._last_refresh >= self.refresh_interval)
        if (self._measuring is None and self._best_at_refresh is None and not refresh_due
                and self.bucket_steps[self._bucket(len(request_ids))] >= EXPLORE_AFTER
                and rates[0] >= SETTLED_MARGIN * drafting):
            self._settled = (tuple(request_ids), self.steps + SETTLED_REPLAN)

    def warm(self, request_ids: Sequence[int]) -> None:
        """Work out the rows' figures for the next plan of these requests now (_batch_tokens), while the device
        verifies, off the critical path between the acceptance read and the next launch (0.11 ms of 0.65 at batch
        128 on a 2-core CPU: benchmarks.host_step --adaptive-drafting). The next plan finds them if its batch holds
        the same requests and no outcome was told in between (in a run of drafting steps none is)."""
        self._batch_tokens(request_ids)

    def _batch_tokens(self, request_ids: Sequence[int]) -> tuple[dict[int, float], dict[int, float], list[bool]]:
        """-> (per drafts per row of each chain length up to max_steps and the tree where it is offered: the batch's
        expected tokens; the same at each shape's hopeful yield (optimism); per row: whether it is worth drafting for,
        not collapsed). Rows' shortfalls add in quadrature, so a batch of one tries a chain that a few unlucky drafts
        undersold, and a batch of 256 is hoped for within ~1/16 of a row's. Kept for the same requests until the
        figures next change (observe, finish: warm)."""
        key = (tuple(request_ids), self._figures_version)
        if self._batch_memo is not None and self._batch_memo[0] == key:
            return self._batch_memo[1]
        tree = self._tree_offered(len(request_ids))
        columns = self._columns if tree else self._columns[:self.config.max_steps + 1]
        figures = [self._row_figures(rid, tree) for rid in request_ids]
        worth = [f is not None for f in figures]
        kept = [f for f in figures if f is not None] or [((0.0,) * len(columns),) * 2]
        rows = Counter(map(id, kept))
        if len(rows) < len(kept):  # rows sharing their figures (new requests: _new_request) summed once, times n
            distinct = {id(f): f for f in kept}
            kept = [tuple(tuple(n * x for x in part) for part in distinct[key]) for key, n in rows.items()]
        tokens = zip(*(f[0] for f in kept), strict=True)  # (columns: a shape's figures over the rows)
        shortfalls = zip(*(f[1] for f in kept), strict=True)
        emitted, hoped = {}, {}
        for s, t, v in zip(columns, tokens, shortfalls, strict=True):
            emitted[s] = sum(t)
            hoped[s] = emitted[s] + sum(v) ** 0.5
        self._batch_memo = (key, (emitted, hoped, worth))
        return emitted, hoped, worth

    def _row_figures(self, request_id: int, tree: bool) -> tuple[tuple[float, ...], ...] | None:
        """A row's expected tokens and squared shortfalls per column (_columns, the tree's left out where `tree` is
        False), or None where it collapsed."""
        c = self.config
        held = request_id in self.chains_collapsed and not self.shadows.recovered(request_id)
        stats = self._stats(request_id)
        if stats.untouched and self._new_request is not None and stats.prior is self._new_request.prior:
            stats = self._new_request  # (the same figures: worked out once for a batch of new requests)
        if not tree or c.tree_layout is None:
            return stats.expected(c.max_steps + 1, c.collapse, c.optimism, chains_held=held)
        return stats.expected(c.max_steps + 1, c.collapse, c.optimism, c.tree_layout, self.siblings.value,
                              self.siblings.hoped(c.optimism, SURE_OF), held)

    def _tree_offered(self, batch: int) -> bool:
        """Whether a batch of this many rows is offered the tree and its rows priced for it (tree_max_batch: above,
        no CUDA graph of its width is captured, and pricing it was ~30% of the policy's host time a step)."""
        return self.config.tree is not None and batch <= self.config.tree_max_batch

    @functools.cached_property
    def _columns(self) -> tuple[int, ...]:
        """The drafts per row of the rows' figures (RunningAcceptance.expected): each chain length 0..max_steps, then
        the tree's budget where one is offered."""
        tree = self.config.tree
        return (*range(self.config.max_steps + 1), *((tree.budget,) if tree is not None else ()))

    def take_planned(self) -> PlannedStep:
        """The last plan, to be observed later (observe(..., planned=)): the engine tells a speculative step's outcome
        once the next step's verify is on the device, and plans that step first."""
        planned, self._planned = self._planned, None
        if planned is not None and any(planned.plan.drafting):  # a drafting step: the next plan is no probe
            self.since_drafting = 0
        if planned is not None and planned.plan.steps > 0 and not planned.backlog:  # (its outcome will teach its cost)
            key = (self._bucket(planned.batch), planned.plan.steps)
            self._in_flight = key  # counted as measured until told (_kept): the next plan does not pick it again
            if self._measuring == key:
                self._measuring = None
        return planned

    def observe(self, request_ids: Sequence[int], drafted: Sequence[int], accepted: Sequence[int],
                seconds: float | None, planned: PlannedStep | None = None,
                trees: Sequence[tuple[Sequence[int], Sequence[int]]] | None = None) -> None:
        """The outcome of a planned step: drafts offered and accepted per row, the step's wall time (None: a step
        whose time says nothing of its cost, e.g. a pipelined plain step that waited for no earlier one). planned:
        that step's take_planned() (default: the last plan). Outcomes are observed in the order of their steps; the
        plan of the step after may come first (its plan then has this outcome's figures one step late). trees: a
        tree step's rows as drafted, each (its tree's parents, its accepted path's nodes), which the rank model
        learns from (tree_yield.rank_outcome)."""
        if planned is None:
            planned, self._planned = self._planned, None
        else:
            self._in_flight = None
        batch, context, plan, backlog = planned.batch, planned.context, planned.plan, planned.backlog
        bucket = self._bucket(batch)
        self.bucket_steps[bucket] += 1
        self.recent_batches.append(batch)
        if self.trace is not None:
            self.trace.append({**(planned.decision or {}), "measured_ms": None if seconds is None else 1e3 * seconds,
                               "accepted": sum(accepted)})
        if seconds is not None and plan.steps > 0 and backlog > 0:
            # the step read the drafter's backlog too: what it took beyond its shape's cost is the catch-up's (a
            # shape not measured yet tells neither apart), and it teaches the shape no cost
            if self.cost.measured_in(bucket, plan.steps + 1) >= 1:
                self.catch_up.observe(backlog, seconds - self.cost.seconds(batch, plan.steps + 1, context))
            seconds = None
        if seconds is not None:
            if self._measuring == (bucket, plan.steps):
                self._measuring = None
            self.cost.observe(batch, plan.steps + 1, context, seconds)
            self.last_measured[(bucket, plan.steps)] = self.steps
        self._figures_version += 1  # (the rows' figures change below)
        if any(drafted):
            self._settled = None
        self.counts[plan.label] += 1
        self.steps += 1
        self.since_drafting = 0 if any(plan.drafting) else self.since_drafting + 1
        pooled = self._pooled()
        if plan.tree:
            if trees is None:
                raise ValueError("a tree step's outcome needs its rows' trees and accepted paths")
            shared: dict[int, list[list[int]]] = {}  # id(parents) -> its child lists (rows share one tree's parents)
            outcomes = [rank_outcome(parents, path, shared.get(id(parents))
                                     or shared.setdefault(id(parents), child_lists(parents)))
                        for parents, path in trees]
            for _, tried, kept in outcomes:  # (first: every row's figures below are priced at the new figure)
                self.siblings.observe(tried, kept)
        for i, (rid, drafts, kept) in enumerate(zip(request_ids, drafted, accepted, strict=True)):
            if drafts:
                stats = self._stats(rid)
                if plan.tree:
                    stats.observe_levels(outcomes[i][0])
                    self.population.observe_levels(outcomes[i][0])
                else:
                    stats.observe(drafts, kept)
                    self.population.observe(drafts, kept)
                if stats.conditional(0) < self.config.collapse:
                    self.chains_collapsed.add(rid)
                else:
                    self.chains_collapsed.discard(rid)
                # (worked out now, for the next plan: see RunningAcceptance.expected)
                self._row_figures(rid, self._tree_offered(batch))
            else:  # (what its drafts showed ages: a dip from a few rejections does not hold it on plain steps)
                self._stats(rid).relax(pooled, 1 - self.config.decay)
        if any(drafted):  # (the pooled figures moved: a new request starts from them)
            self._new_request = self._pooled_memo = None

    def observe_shadows(self, request_ids: Sequence[int], kept: Sequence[bool]) -> None:
        """Shadow drafts (shadows.py): each collapsed row's first draft, made for free beside its plain step, kept or
        not; they call probes (ShadowDrafts.call_a_probe) and hold a row's chains (chains_collapsed)."""
        self._figures_version += 1  # (a row whose chains collapsed is priced by its shadows: _row_figures)
        self._settled = None
        self.shadows.observe(request_ids, kept)

    def forget_acceptance(self) -> None:
        """Back to the drafter's figures: the pooled acceptance (a new request's prior), the trees' sibling
        acceptance and the shapes counted, as at the start; the step costs measured stay (`specdec serve`'s start-up
        warm-up, whose prompts of no text say nothing of the requests to come: specdec/serve/cli.py warm_kernels)."""
        c = self.config
        self.population = RunningAcceptance(c.prior_at(c.max_steps), c.prior_weight, POPULATION_DECAY)
        self.siblings = SiblingAcceptance(c.sibling_prior, c.prior_weight, POPULATION_DECAY)
        self._new_request = self._pooled_memo = None
        self.counts.clear()
        self._figures_version += 1
        self._settled = None

    def finish(self, request_id: int) -> None:
        self._figures_version += 1
        self._settled = None
        self.chains_collapsed.discard(request_id)
        self.acceptance.pop(request_id, None)
        self.shadows.forget(request_id)

    def _stats(self, request_id: int) -> RunningAcceptance:
        if request_id not in self.acceptance:
            if self._new_request is None:
                c = self.config
                self._new_request = RunningAcceptance(self._pooled(), c.prior_weight, c.decay)
            self.acceptance[request_id] = self._new_request.copy()
        return self.acceptance[request_id]

    def _pooled(self) -> tuple[float, ...]:
        """The acceptance per position pooled over the requests' recent drafts (the drafter's figures before any);
        worked out once between drafting steps (every plain step relaxes the rows toward it)."""
        if self._pooled_memo is None:
            self._pooled_memo = tuple(self.population.conditional(k) for k in range(self.config.max_steps))
        return self._pooled_memo

    def _bucket(self, batch: int) -> int:
        """The cost bucket of a step of `batch` requests: that of the rows it runs (StepCost)."""
        return batch_bucket(self.cost.rows(batch))

    def _held(self, batch: int) -> int | None:
        """The shape being measured, while it has not taught a cost yet (for MEASURE_FOR steps at most, and only in
        the bucket it was chosen in): a plain step teaches none until the third of a run."""
        if self._measuring is None or self._measuring[0] != self._bucket(batch) or self._measure_steps >= MEASURE_FOR:
            self._measuring = None
            return None
        self._measure_steps += 1
        return self._measuring[1]

    def _explore(self, batch: int, rates: dict[int, float], best_shape: int, drafting: bool = True) -> int | None:
        """A shape to measure now: one never measured (twice: the first is a warm-up; the tree only where its rate is
        within CONTENDER of the best, as priced by the prior: at batch 512 a tree's 17 nodes a row cost a step ~2x a
        4-chain's). Else nothing while the batch shrinks (EXPLORE_AFTER). Else, once the batch's bucket has run
        EXPLORE_AFTER steps, a shape not yet measured in it whose rate is within BORROWED_CONTENDER of the best (only a
        shape that runs corrects its cost: the H200 study of 2026-12-02 kept Nemotron-3-Nano at batch 128 on 4-chains
        accepted at 1.2, plain decoding borrowed at 1.6x its cost), the tree within CONTENDER (in the H100 runs of
        2026-12-06, ten of 11 trees explored at 0.50-0.75 of the best stayed below it once measured, each a step of up
        to 2x a 4-chain's). Else every refresh_every steps (twice as long after each refresh that left the best shape
        the best, up to REFRESH_BACKOFF times), of the contenders (_contender), the one measured least recently in this
        bucket (a cost measured while the machine was busy is not trusted for ever). drafting False: no drafting shape
        is explored or refreshed (a batch whose rows collapsed, watched by their shadow drafts)."""
        bucket, best = self._bucket(batch), max(rates.values())
        for steps in rates:  # (the shapes offered at this batch; the tree only where it may pay)
            if (not self.config.is_tree(steps) or rates[steps] >= CONTENDER * best) and self._kept(steps) < 1:
                return steps
        if any(earlier > batch for earlier in self.recent_batches):  # (shrinking: requests end, none take their place)
            return None
        if self.bucket_steps[bucket] >= EXPLORE_AFTER:
            for steps in rates if drafting else (0,):
                needed = CONTENDER if self.config.is_tree(steps) else BORROWED_CONTENDER
                if rates[steps] >= needed * best and self._kept(steps, bucket) < 1:
                    return steps
        if self.config.refresh_every and self.steps - self._last_refresh >= self.refresh_interval:
            self._last_refresh = self.steps
            contenders = [s for s in (rates if drafting else (0,))
                          if rates[s] >= self._contender(bucket, s) * best]
            if contenders:  # (none where a watched batch's plain decoding, its one shape, is far behind the best)
                self._best_at_refresh = best_shape
                return min(contenders, key=lambda s: self.last_measured.get((bucket, s), -1))
        return None

    def _contender(self, bucket: int, steps: int) -> float:
        """The share of the best rate a shape needs to be refreshed: BORROWED_CONTENDER while its cost in the bucket
        rests on a single step that may be far off (on the CPU, plain decoding measured once in a warm-up at 1.5x
        its cost was not refreshed for 33 steps of drafting that lost to it), REFRESH_CONTENDER (CONTENDER for plain
        decoding) from the second on (a wider net for every shape cost the H200 traces' replay 1-3%: their costs are
        steady), always for the tree, and for a single step no dearer than SINGLE_TRUSTED times what the bucket's
        other measurements make of it under a model of the step (a stall makes a step dearer, never cheaper; the flat
        prior says nothing of how widths' costs compare). In the H100 study of 2026-12-06 13:43 UTC such refreshes
        of 2-chains at 0.67x of the tree's rate (Qwen3.5-9B at batch 1) and of 4-chains at 0.66x of plain decoding's
        (Nemotron-3-Nano at 1.2 accepted and batch 64) each cost a step; replayed:
        benchmarks/results/adaptive_replay_single_trusted_cpu_2026-12-06.md."""
        if self.config.is_tree(steps):
            return REFRESH_CONTENDER
        narrowed = CONTENDER if steps == 0 else REFRESH_CONTENDER
        kept = self._kept(steps, bucket)
        if kept >= 2:
            return narrowed
        factor = self.cost.factors.get((bucket, steps + 1))
        if (kept == 1 and factor is not None and self.cost.prior is not flat_prior
                and factor <= SINGLE_TRUSTED * self.cost.borrowed(bucket, steps + 1)):
            return narrowed
        return BORROWED_CONTENDER

    def _kept(self, steps: int, bucket: int | None = None) -> int:
        """Measurements of a shape its cost keeps (a bucket's first is its warm-up), in one bucket or all, the step in
        flight counted: its outcome, told after the next step is planned (take_planned), will be one."""
        samples = self.cost.samples_by_width.get(steps + 1, {})
        flying = self._in_flight[0] if self._in_flight is not None and self._in_flight[1] == steps else None
        if bucket is not None:
            return max(samples.get(bucket, 0) + (bucket == flying) - 1, 0)
        # (the step in flight adds one where its bucket's warm-up is already measured)
        return self.cost.kept_by_width.get(steps + 1, 0) + (flying is not None and samples.get(flying, 0) >= 1)
