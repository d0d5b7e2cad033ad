"""Running acceptance per draft position: pooled over requests (RunningAcceptance), per request shrunk toward the
pooled figure (RequestAcceptance) by a weight learnt from how much requests differ (Shrinkage)."""

from __future__ import annotations


class RunningAcceptance:
    """p[k] = P(draft k+1 accepted | drafts 1..k accepted), k < positions, estimated as accepted[k] / reached[k]:
    the steps that offered draft k+1 after k accepted drafts, and those that kept it, each count decayed by `decay`
    per observation of that position (an effective window of 1 / (1 - decay) observations). The policy keeps one
    over every request's drafts (the pooled acceptance). The counts start at `weight` pseudo-observations of the prior
    (the drafter's per-position figures): what a position never reached keeps. The prior decays like any observation,
    so the estimate converges to the observed acceptance (a prior kept at full weight would hold a collapsed
    acceptance of 0.17 at 0.27 for ever, with 0.75 at weight 2 in a window of 10)."""

    def __init__(self, prior: tuple[float, ...], weight: float, decay: float):
        self.prior = prior
        self.weight = weight
        self.decay = decay
        self.reached = [weight] * len(prior)
        self.accepted = [weight * p for p in prior]

    def observe(self, drafted: int, accepted: int) -> None:
        """A chain step: `drafted` drafts offered, the first `accepted` of them kept."""
        for k in range(min(drafted, accepted + 1, len(self.prior))):  # positions up to the first rejection
            self.reached[k] = self.decay * self.reached[k] + 1.0
            self.accepted[k] = self.decay * self.accepted[k] + (1.0 if k < accepted else 0.0)

    def conditional(self, k: int) -> float:
        return self.accepted[k] / self.reached[k]


class RequestAcceptance:
    """One request's acceptance per draft position, shrunk toward the acceptance pooled over requests:

        p_i[k] = (accepted_i[k] + w * pooled[k]) / (reached_i[k] + w)

    accepted_i / reached_i: the request's own counts, decayed by `decay` per observation of a position (a window of
    ~1 / (1 - decay)); w: how many observations the pooled figure is worth against them (`Shrinkage`, learnt from how
    much requests differ). A new request is the pooled figure; one whose text is much harder or easier than the
    others' moves away from it as far as its own steps say, and as requests differ. A step in which the request
    does not draft ages its counts by `decay` too (age: kept as a count of such steps, applied when the counts are
    read, since a batch of 256 plain steps would otherwise scale 256 x 3 lists a step)."""

    def __init__(self, positions: int, decay: float):
        self.decay = decay
        self.reached = [0.0] * positions
        self.accepted = [0.0] * positions
        self.squares = [0.0] * positions  # the sum of the squared weights of reached (the noise of the rate: below)
        self.idle = 0  # steps without drafts since the counts were last scaled

    def observe(self, drafted: int, accepted: int) -> None:
        """A chain step: `drafted` drafts offered, the first `accepted` of them kept."""
        self.settle()
        d = self.decay
        for k in range(min(drafted, accepted + 1, len(self.reached))):  # positions up to the first rejection
            self.reached[k] = d * self.reached[k] + 1.0
            self.squares[k] = d * d * self.squares[k] + 1.0
            self.accepted[k] = d * self.accepted[k] + (1.0 if k < accepted else 0.0)

    def age(self) -> None:
        """A step without drafts: what the request's drafts showed counts `decay` as much (its estimate moves toward
        the pooled one, so that a dip from a few rejections does not hold it off drafting for ever)."""
        self.idle += 1

    def settle(self) -> None:
        """Apply the aging of the idle steps to the counts."""
        if self.idle:
            keep = self.decay ** self.idle
            self.reached = [keep * x for x in self.reached]
            self.accepted = [keep * x for x in self.accepted]
            self.squares = [keep * keep * x for x in self.squares]
            self.idle = 0

    def conditional(self, k: int, pooled: tuple[float, ...], weight: float) -> float:
        keep = self.decay ** self.idle
        return (keep * self.accepted[k] + weight * pooled[k]) / (keep * self.reached[k] + weight)

    def emitted_by_steps(self, longest: int, pooled: tuple[float, ...], weight: float) -> list[float]:
        """Expected tokens a step emits with a chain of s drafts (the bonus included), s = 0..longest: 1 + sum_j
        prod_{k <= j} p[k]."""
        totals = [0.0] * (longest + 1)
        self.add_emitted(totals, tuple(weight * p for p in pooled), weight, 0.0)
        return totals

    def add_emitted(self, totals: list[float], weighted_pooled: tuple[float, ...], weight: float,
                    collapse: float) -> bool:
        """Add emitted_by_steps to `totals` if p[0] >= collapse (weighted_pooled: weight * pooled); -> whether it
        was. One pass, no lists: the policy prices every shape of every row each step (at batch 256 ~0.4 ms of
        Python a step on the CPU with the helpers of before)."""
        accepted, reached = self.accepted, self.reached
        positions = len(reached)
        keep = self.decay ** self.idle if self.idle else 1.0
        first = (keep * accepted[0] + weighted_pooled[0]) / (keep * reached[0] + weight) if positions else 0.0
        if first < collapse:
            return False
        totals[0] += 1.0
        total, reach = 1.0, 1.0
        for k in range(1, len(totals)):
            if k <= positions:
                reach *= first if k == 1 else ((keep * accepted[k - 1] + weighted_pooled[k - 1])
                                               / (keep * reached[k - 1] + weight))
                total += reach
            totals[k] += total
        return True


class Shrinkage:
    """The weight w of the pooled acceptance in each request's estimate (RequestAcceptance), by empirical Bayes on
    the first draft position: requests' true acceptances spread with a variance tau^2 around the pooled p, and a
    request's own rate adds the binomial noise p (1 - p) sum(weights^2) / reached^2 of its counts, so

        tau^2 = (the variance of the requests' own rates) - (their mean noise),   w = p (1 - p) / tau^2 - 1

    (the prior's pseudo-count of a beta-binomial with that mean and variance), clipped to [low, high] and smoothed
    over steps. Where requests differ little the pooled figure holds and a request's few steps move it little: in
    the H200 study of 2026-12-03 (synthetic acceptance, the same for every request) the requests left last in a
    shrinking batch were those whose draws had been unlucky, their own estimates (a prior of 2 observations) fell
    under the worth of drafting, and the batch's tail decoded plainly: 10-13 plain steps at batches 1-7 against
    4-chains 1.8x faster. Where they differ (texts of different kinds) w falls and a request's own steps decide."""

    def __init__(self, initial: float, low: float = 1.0, high: float = 30.0, smoothing: float = 0.2,
                 min_requests: int = 4, min_reached: float = 2.0):
        self.weight = initial
        self.low, self.high = low, high
        self.smoothing = smoothing
        self.min_requests = min_requests
        self.min_reached = min_reached
        self.spread: float | None = None  # the smoothed tau^2

    def update(self, requests: list[RequestAcceptance], pooled: float) -> float:
        """Learn from the requests of a step (their own first-position counts); -> the weight."""
        for r in requests:
            r.settle()
        seen = [r for r in requests if r.reached and r.reached[0] >= self.min_reached]
        if len(seen) < self.min_requests:
            return self.weight
        rates = [r.accepted[0] / r.reached[0] for r in seen]
        mean = sum(rates) / len(rates)
        variance = sum((x - mean) ** 2 for x in rates) / (len(rates) - 1)
        binomial = pooled * (1.0 - pooled)
        noise = binomial * sum(r.squares[0] / r.reached[0] ** 2 for r in seen) / len(seen)
        spread = max(variance - noise, 0.0)
        self.spread = spread if self.spread is None else (1 - self.smoothing) * self.spread + self.smoothing * spread
        self.weight = self.high if self.spread <= 0 else min(max(binomial / self.spread - 1.0, self.low), self.high)
        return self.weight
