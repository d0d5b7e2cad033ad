"""The server's Prometheus metrics, in a registry of its own (two servers in one process do not share counters).

Counters and histograms are updated by the engine thread (prometheus_client's metrics are thread-safe); the gauges
of the engine's state (queue, batch, pools) are read when /metrics is scraped, under the engine loop's lock.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

PREFIX = "specdec"
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    """max_depth: the deepest draft level the server proposes (the accepted-length histogram's last bucket is
    max_depth + 1: every draft accepted plus the bonus token)."""

    def __init__(self, max_depth: int):
        disable_created_metrics()  # no `_created` timestamp series beside every counter (process-wide switch)
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "Requests finished, by endpoint and finish reason "
                                "(stop, length, abort: the client went away)", ["endpoint", "finish_reason"],
                                registry=r)
        self.rejected = Counter(f"{PREFIX}_requests_rejected", "Requests refused with a 4xx error", registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of admitted requests", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated", registry=r)
        self.accepted_length = Histogram(
            f"{PREFIX}_accepted_length", "Tokens one target step emitted for one request (accepted drafts + bonus)",
            buckets=tuple(range(1, max_depth + 2)), registry=r)
        self.position_proposed = Counter(f"{PREFIX}_draft_position_proposed", "Verified trees that reached this "
                                         "draft depth (1 = the first drafted token)", ["position"], registry=r)
        self.position_accepted = Counter(f"{PREFIX}_draft_position_accepted", "Verified trees whose accepted path "
                                         "reached this draft depth", ["position"], registry=r)
        self.draft_tokens = Counter(f"{PREFIX}_draft_tokens", "Drafted tokens the target verified", registry=r)
        self.accepted_tokens = Counter(f"{PREFIX}_accepted_draft_tokens", "Drafted tokens the target accepted",
                                       registry=r)
        self.acceptance_rate = Gauge(f"{PREFIX}_draft_acceptance_rate", "Accepted over drafted tokens since start",
                                     registry=r)
        self.speculation_shapes = Counter(
            f"{PREFIX}_speculation_shape_steps", "Request-steps by the speculation shape the adaptive policy chose "
            "(plain, chain-N, tree-N; none with --speculation fixed)", ["shape"], registry=r)
        self.step_seconds = Histogram(f"{PREFIX}_step_seconds", "Wall time of one engine step (a prefill and / or "
                                      "one speculative step of the batch)", buckets=STEP_BUCKETS, registry=r)
        self.request_seconds = Histogram(f"{PREFIX}_request_seconds", "Arrival to last token",
                                         buckets=LATENCY_BUCKETS, registry=r)
        self.first_token_seconds = Histogram(f"{PREFIX}_time_to_first_token_seconds", "Arrival to first token",
                                             buckets=LATENCY_BUCKETS, registry=r)
        self.waiting = Gauge(f"{PREFIX}_requests_waiting", "Requests queued for a slot", registry=r)
        self.running = Gauge(f"{PREFIX}_requests_running", "Requests in the batch", registry=r)
        self.prefilling = Gauge(f"{PREFIX}_requests_prefilling", "Requests in the batch whose prompts are still "
                                "prefilling (a forward of at most --max-prefill-tokens a step)", registry=r)
        self.request_slots_used = Gauge(f"{PREFIX}_request_slots_used", "Request slots in use", registry=r)
        self.request_slots = Gauge(f"{PREFIX}_request_slots", "Request slots in the pool", registry=r)
        self.state_slots_used = Gauge(f"{PREFIX}_state_slots_used", "Committed-state slots in use", registry=r)
        self.state_slots = Gauge(f"{PREFIX}_state_slots", "Committed-state slots in the pool", registry=r)
        self._drafted = self._accepted = 0  # the acceptance rate's terms

    def observe_tree(self, proposed_depth: int, accepted_depth: int) -> None:
        for position in range(1, proposed_depth + 1):
            self.position_proposed.labels(str(position)).inc()
            if position <= accepted_depth:
                self.position_accepted.labels(str(position)).inc()

    def observe_steps(self, emitted: list[int], drafted: list[int]) -> None:
        """One request's new steps: tokens emitted and nodes drafted per step."""
        for count in emitted:
            self.accepted_length.observe(count)
        self._drafted += sum(drafted)
        self._accepted += sum(emitted) - len(emitted)
        self.draft_tokens.inc(sum(drafted))
        self.accepted_tokens.inc(sum(emitted) - len(emitted))
        if self._drafted:
            self.acceptance_rate.set(self._accepted / self._drafted)

    def observe_shapes(self, shapes: dict[str, int], seen: dict[str, int]) -> None:
        """One request's steps per shape so far (Request.stats.shapes) against those already counted (`seen`,
        updated)."""
        for shape, steps in shapes.items():
            if steps > seen.get(shape, 0):
                self.speculation_shapes.labels(shape).inc(steps - seen.get(shape, 0))
                seen[shape] = steps

    def render(self) -> bytes:
        return generate_latest(self.registry)
