"""Shadow drafts (AdaptivePolicy.observe_shadows): each collapsed row's first draft, made for free while it decodes
plainly (a drafter that drafts for nothing: Drafter.shadow_drafts), checked against the token its plain step emitted.
They tell whether a collapsed row may have recovered, so a probe (a drafting step, the only other way to see it)
comes only when one looks so; they do not enter the acceptance the shapes are priced at, which holds every position
(a first position observed alone and deeper ones left at the drafter's figures overpriced chains in the replay of
the H200 traces: Nemotron-3-Nano at batch 1 and 1.2 accepted, 0.96x -> 0.91x of plain)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from .tuning import SHADOW_DECAY, SHADOW_SURE


class ShadowDrafts:
    """Per request, its shadow drafts' (seen, kept), decayed by SHADOW_DECAY; `collapse`: the first-draft acceptance
    under which a row is collapsed (AdaptiveConfig.collapse)."""

    def __init__(self, collapse: float):
        self.collapse = collapse
        self.counts: dict[int, tuple[float, float]] = {}

    def __bool__(self) -> bool:
        return bool(self.counts)

    def __iter__(self) -> Iterator[int]:
        return iter(self.counts)

    def observe(self, request_ids: Sequence[int], kept: Sequence[bool]) -> None:
        for rid, hit in zip(request_ids, kept, strict=True):
            seen, hits = self.counts.get(rid, (0.0, 0.0))
            self.counts[rid] = (SHADOW_DECAY * seen + 1.0, SHADOW_DECAY * hits + float(hit))

    def forget(self, request_id: int) -> None:
        self.counts.pop(request_id, None)

    def pooled_kept(self, request_ids: Sequence[int]) -> float | None:
        """The share of these rows' shadow drafts kept, pooled (None: no row has any)."""
        shadowed = [self.counts[rid] for rid in request_ids if rid in self.counts]
        return sum(h for _, h in shadowed) / sum(n for n, _ in shadowed) if shadowed else None

    def call_a_probe(self, request_ids: Sequence[int], worth: Sequence[bool]) -> bool:
        """Whether a probe is due: where the batch's collapsed rows (worth False) have no shadows (a drafter without
        them), as before shadows; else where their first drafts, pooled, were kept more often than the collapse by
        SHADOW_SURE deviations (a drafting step is the batch's: one row in 64 that recovered would not make it pay,
        and a test per row called a probe every time at batch 64, some row above by chance)."""
        seen = hits = 0.0
        for rid, row_worth in zip(request_ids, worth, strict=True):
            if not row_worth and rid in self.counts:
                row_seen, row_hits = self.counts[rid]
                seen, hits = seen + row_seen, hits + row_hits
        return not seen or self._above_collapse(seen, hits)

    def recovered(self, request_id: int) -> bool:
        """Whether a request's shadow drafts show its first draft kept more often than the collapse by SHADOW_SURE
        deviations (True where it has none: a drafter without shadows, or none checked yet)."""
        return request_id not in self.counts or self._above_collapse(*self.counts[request_id])

    def _above_collapse(self, seen: float, hits: float) -> bool:
        """Whether first drafts kept `hits` times in `seen` (decayed counts) lie SHADOW_SURE deviations above the
        collapse."""
        p = hits / seen
        return p - SHADOW_SURE * (p * (1.0 - p) / seen) ** 0.5 >= self.collapse
