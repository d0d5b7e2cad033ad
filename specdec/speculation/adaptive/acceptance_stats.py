"""A request's running acceptance per draft position, as exponentially weighted counts with a prior."""

from __future__ import annotations


class RunningAcceptance:
    """p[k] = P(draft k+1 accepted | drafts 1..k accepted), k < positions, estimated as accepted[k] / reached[k]:
    the steps that offered draft k+1 after k accepted drafts, and those that kept it, each count decayed by `decay`
    per observation of that position (an effective window of 1 / (1 - decay) observations), so a request whose text
    turns hard stops looking good after a few steps. The counts start at `weight` pseudo-observations of the prior
    (the drafter's per-position figures): what a new request starts from and what a position never reached keeps.
    The prior decays like any observation, so the estimate converges to the request's own acceptance (a prior kept
    at full weight would hold a collapsed acceptance of 0.17 at 0.27 for ever, with 0.75 at weight 2 in a window
    of 10)."""

    def __init__(self, prior: tuple[float, ...], weight: float, decay: float):
        self.prior = prior
        self.weight = weight
        self.decay = decay
        self.reached = [weight] * len(prior)
        self.accepted = [weight * p for p in prior]
        # relax steps not yet applied to the counts, all toward _toward at _rate (relax: applied when read)
        self._idle, self._toward, self._rate = 0, prior, 0.0

    def observe(self, drafted: int, accepted: int) -> None:
        """A chain step: `drafted` drafts offered, the first `accepted` of them kept."""
        self._settle()
        for k in range(min(drafted, accepted + 1, len(self.prior))):  # positions up to the first rejection
            self.reached[k] = self.decay * self.reached[k] + 1.0
            self.accepted[k] = self.decay * self.accepted[k] + (1.0 if k < accepted else 0.0)

    def relax(self, prior: tuple[float, ...], rate: float) -> None:
        """A step without drafts: the counts move toward `weight` pseudo-observations of `prior` by `rate`, so
        that what a request's drafts showed ages with the tokens it emits since, and an estimate that a short run
        of rejections pushed below its worth comes back to try drafting again. Counted, and applied in closed form
        when the counts are read: n steps toward the same prior keep (1 - rate)^n of the counts (at batch 256 the
        plain steps of adaptive speculation spent ~0.3 ms of Python a step relaxing every row's lists)."""
        if self._idle and (prior != self._toward or rate != self._rate):
            self._settle()
        self._idle, self._toward, self._rate = self._idle + 1, prior, rate

    def _settle(self) -> None:
        if self._idle:
            keep = (1 - self._rate) ** self._idle
            shift = (1 - keep) * self.weight
            self.reached = [keep * r + shift for r in self.reached]
            self.accepted = [keep * a + shift * p for a, p in zip(self.accepted, self._toward, strict=True)]
            self._idle = 0

    def conditional(self, k: int) -> float:
        self._settle()
        return self.accepted[k] / self.reached[k]

    def add_emitted(self, totals: list[float], collapse: float) -> bool:
        """Add to totals[s], s = 0..len(totals) - 1, the expected tokens a step with a chain of s drafts emits (as
        expected_emitted), if p[0] >= collapse; -> whether it did. One pass, no lists: the policy prices every shape
        of every row each step."""
        accepted, reached, toward = self.accepted, self.reached, self._toward
        positions = len(reached)
        keep = (1 - self._rate) ** self._idle if self._idle else 1.0  # (relax's pending steps, read not applied)
        shift = (1 - keep) * self.weight
        first = (keep * accepted[0] + shift * toward[0]) / (keep * reached[0] + shift) if positions else 0.0
        if first < collapse:
            return False
        totals[0] += 1.0
        total, reach = 1.0, 1.0
        for k in range(1, len(totals)):
            if k <= positions:
                j = k - 1
                reach *= first if k == 1 else (keep * accepted[j] + shift * toward[j]) / (keep * reached[j] + shift)
                total += reach
            totals[k] += total
        return True

    def expected_emitted(self, steps: int) -> float:
        """Expected tokens a step with a chain of `steps` drafts emits (the bonus token included):
        1 + sum_j prod_{k <= j} p[k]."""
        total, reach = 1.0, 1.0
        for k in range(min(steps, len(self.prior))):
            reach *= self.conditional(k)
            total += reach
        return total
