"""A request's running acceptance per draft position, as exponentially weighted counts with a prior."""

from __future__ import annotations

from collections.abc import Sequence

from .tree_yield import TreeLayout

# observations an estimate's deviation (RunningAcceptance.expected) counts beyond its row's own, which is also
# the most the deviation can be: sqrt(p (1 - p) / (n + 1 + SURE_OF)). Without it a new request, at its prior's two
# pseudo-observations, looked worth a 4-chain at any acceptance until a few steps of its own had shown otherwise (the
# replay of the H200 traces, Nemotron-3-Nano at batch 1 and 1.2 accepted: 0.92x of plain against 0.94x with 5)
SURE_OF = 5.0


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
        # the request's own observations per position, decayed as reached is and untouched by relax: how sure its
        # estimate is (relax moves it toward the pooled figure, which rests on many requests, not on fewer steps)
        self.observed = [weight] * len(prior)
        # relax steps not yet applied to the counts, all toward _toward at _rate (relax: applied when read)
        self._idle, self._toward, self._rate = 0, prior, 0.0
        self._expected: tuple | None = None  # (its arguments, expected()'s answer) until the counts next change
        self.untouched = True  # nothing observed nor relaxed yet: the prior's figures, as every new request's

    def copy(self) -> RunningAcceptance:
        """A new request's running acceptance like this untouched one, its figures worked out too (built, not copied:
        an instance whose __dict__ was copied in reads its attributes slower: plan + observe at batch 128 took 0.75 ms a
        step against 0.59, benchmarks.policy_host_time, 2026-12-07)."""
        if not self.untouched:
            raise ValueError("only an untouched running acceptance (a new request's) is copied")
        twin = RunningAcceptance(self.prior, self.weight, self.decay)
        twin._expected = self._expected
        return twin

    def observe(self, drafted: int, accepted: int) -> None:
        """A chain step: `drafted` drafts offered, the first `accepted` of them kept."""
        self._expected, self.untouched = None, False
        self._settle()
        for k in range(min(drafted, accepted + 1, len(self.prior))):  # positions up to the first rejection
            self.reached[k] = self.decay * self.reached[k] + 1.0
            self.observed[k] = self.decay * self.observed[k] + 1.0
            self.accepted[k] = self.decay * self.accepted[k] + (1.0 if k < accepted else 0.0)

    def observe_levels(self, first_kept: Sequence[bool]) -> None:
        """A tree step (tree_yield.rank_outcome): per depth along its accepted path, whether the node there had its
        first-ranked child kept, the chain's draft at that position (the rank model)."""
        self._expected, self.untouched = None, False
        self._settle()
        for k, kept in enumerate(first_kept[:len(self.prior)]):
            self.reached[k] = self.decay * self.reached[k] + 1.0
            self.observed[k] = self.decay * self.observed[k] + 1.0
            self.accepted[k] = self.decay * self.accepted[k] + (1.0 if kept else 0.0)

    def relax(self, prior: tuple[float, ...], rate: float) -> None:
        """A step without drafts: the counts move toward `weight` pseudo-observations of `prior` by `rate`, so
        that what a request's drafts showed ages with the tokens it emits since, and an estimate that a short run
        of rejections pushed below its worth comes back to try drafting again. Counted, and applied in closed form
        when the counts are read: n steps toward the same prior keep (1 - rate)^n of the counts (at batch 256 the
        plain steps of adaptive speculation spent ~0.3 ms of Python a step relaxing every row's lists)."""
        self._expected, self.untouched = None, False
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

    def expected(self, shapes: int, collapse: float, optimism: float, tree: TreeLayout | None = None,
                 sibling: float = 0.0, hoped_sibling: float | None = None,
                 chains_held: bool = False) -> tuple[tuple[float, ...], ...] | None:
        """None if p[0] < collapse and the tree, if any, keeps a first draft less often than that too (a collapsed
        row: the synthetic drafts' trees keep later siblings at 0.5 whatever p[0], and at 1.2 accepted a tree step at
        batch 16 emitted 1.6x a plain step's tokens, priced as one token a row); where only the tree keeps one that
        often, every chain's figure is still one token (at p[0] = 0.17 a 1-chain's step emits 1.17x a plain step's
        tokens at 1.12x its time on the H100 at batch 64, but the requests' ends spread: 17 steps of a ragged tail
        made it 0.986x of plain decoding, 2026-12-06e); else, for s = 0..shapes - 1, the expected tokens a step with
        a chain of s drafts emits (as expected_emitted) and the square of what it would emit more with each p[k] taken
        `optimism` deviations higher: the deviation of p[k]'s estimate sqrt(p (1 - p) / (n + 1 + SURE_OF)) after n
        observations of its own (`observed`), at most the first position's (a later position is reached through the
        first, so seldom in a collapsed request that its deviation would stay large, and its drafts look worth
        trying, for ever): how far this row's figure may be short, which the policy adds over rows in quadrature
        (AdaptivePolicy.plan). Kept until the counts next change (observe, relax): the policy prices every shape of
        every row each step, and a drafting step's plan, between the acceptance read and the next launch while the
        device idles, finds them worked out by the observe of the step before (which runs while the device
        verifies). tree: the tree offered too, priced by the rank model at sibling acceptance `sibling`
        (tree_yield), its figures a last column after the chains' (positions: at least the tree's depth).
        chains_held: priced as if p[0] < collapse whatever the estimate (AdaptivePolicy: a row whose drafts showed it
        collapsed, its shadow drafts not recovered since)."""
        arguments = (shapes, collapse, optimism, tree, sibling, chains_held)
        if self._expected is not None and self._expected[0] == arguments:
            return self._expected[1]
        accepted, reached, toward = self.accepted, self.reached, self._toward
        positions = len(reached)
        keep = (1 - self._rate) ** self._idle if self._idle else 1.0  # (relax's pending steps, read not applied)
        shift = (1 - keep) * self.weight
        first = (keep * accepted[0] + shift * toward[0]) / (keep * reached[0] + shift) if positions else 0.0
        figures = None
        chains_collapsed = first < collapse or chains_held
        if not chains_collapsed or (tree is not None and tree.keeps_a_first_draft(first, sibling) >= collapse):
            totals, spread = [1.0], [0.0]
            total, reach, hoped, hope, level = 1.0, 1.0, 1.0, 1.0, 1.0
            p_at, hoped_at = [], []  # (per position: the estimate, and at its hopeful yield)
            for k in range(1, max(shapes, tree.depth + 1 if tree else 0)):
                if k <= positions:
                    j = k - 1
                    p = first if k == 1 else (keep * accepted[j] + shift * toward[j]) / (keep * reached[j] + shift)
                    reach *= p
                    total += reach
                    level = min(level, (p * (1.0 - p) / (self.observed[j] + 1.0 + SURE_OF)) ** 0.5)
                    p_at.append(p)
                    hoped_at.append(min(1.0, p + optimism * level))
                    hope *= hoped_at[-1]
                    hoped += hope
                if k < shapes:
                    totals.append(total)
                    spread.append((hoped - total) ** 2)
            if chains_collapsed:  # (the tree alone is worth drafting: the chains still count one token)
                totals, spread = [1.0] * len(totals), [0.0] * len(spread)
            if tree is not None:
                tokens, hoped_tokens = tree.expected_pair(p_at, hoped_at, sibling,
                                                          sibling if hoped_sibling is None else hoped_sibling)
                totals.append(tokens)
                spread.append((hoped_tokens - tokens) ** 2)
            figures = (tuple(totals), tuple(spread))
        self._expected = (arguments, figures)
        return figures

    def expected_emitted(self, steps: int) -> float:
        """Expected tokens a step with a chain of `steps` drafts emits (the bonus token included):
        1 + sum_j prod_{k <= j} p[k]."""
        total, reach = 1.0, 1.0
        for k in range(min(steps, len(self.prior))):
            reach *= self.conditional(k)
            total += reach
        return total
