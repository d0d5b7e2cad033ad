"""Running acceptance per draft position, for every request of a batch at once, as exponentially weighted counts
with a prior, in arrays: the policy reads and updates the whole batch in a few array operations a step. (A Python
object per request, looped over, cost 0.23 / 0.43 ms of host time a step at 128 / 256 rows on the CPU of 2026-12-04,
plan and observe together: time between a step's acceptance read and the next launch, where the GPU waits.)"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class AcceptanceTable:
    """Per key (a request, or one pooled row), p[k] = P(draft k+1 accepted | drafts 1..k accepted), k < positions,
    estimated as accepted[k] / reached[k]: the steps that offered draft k+1 after k accepted drafts, and those that
    kept it, each count decayed by `decay` per observation of that position (an effective window of 1 / (1 - decay)
    observations), so a request whose text turns hard stops looking good after a few steps. A row starts at `weight`
    pseudo-observations of a prior (what a new request starts from, and what a position never reached keeps); the
    prior decays like any observation, so the estimate converges to the request's own acceptance (a prior kept at
    full weight would hold a collapsed acceptance of 0.17 at 0.27 for ever, with 0.75 at weight 2 in a window of
    10). Rows are reused once their key is removed."""

    def __init__(self, positions: int, weight: float, decay: float, capacity: int = 64):
        self.positions, self.weight, self.decay = positions, weight, decay
        self.reached = np.zeros((capacity, positions))  # [rows, positions] decayed counts
        self.accepted = np.zeros((capacity, positions))
        self.index: dict[int, int] = {}  # key -> row
        self.free = list(range(capacity - 1, -1, -1))
        self._position = np.arange(positions)

    def rows(self, keys: Sequence[int], prior: Sequence[float]) -> np.ndarray:
        """The rows of these keys [n], a new key's row starting at `weight` pseudo-observations of `prior`."""
        index = self.index
        return np.fromiter((index[key] if key in index else self._add(key, prior) for key in keys), np.intp,
                           len(keys))

    def remove(self, key: int) -> None:
        row = self.index.pop(key, None)
        if row is not None:
            self.free.append(row)

    def conditional(self, key: int) -> np.ndarray:
        """p of one key [positions]."""
        row = self.index[key]
        return self.accepted[row] / self.reached[row]

    def emitted(self, rows: np.ndarray, collapse: float, max_steps: int) -> tuple[list[float], int]:
        """(totals, worth): totals[s], s = 0..max_steps, the expected tokens a step with a chain of s drafts emits
        (1 + sum_j prod_{k <= j} p[k], the bonus token included), summed over the rows whose p[0] >= collapse;
        worth: how many rows those are (the others are the policy's collapsed rows)."""
        p = self.accepted[rows] / self.reached[rows]
        p = p[p[:, 0] >= collapse]
        worth = len(p)
        expected = p.cumprod(axis=1).cumsum(axis=1).sum(axis=0).tolist()  # chains of 1..positions drafts
        return [float(worth)] + [worth + expected[min(s, self.positions) - 1] for s in range(1, max_steps + 1)], worth

    def observe(self, rows: np.ndarray, drafted: np.ndarray, accepted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """A chain step per row: drafted[i] drafts offered, the first accepted[i] of them kept; each position up to
        the first rejection observed. -> (reached, kept) [positions]: how many rows observed each position, and
        kept it."""
        position = self._position
        reached = position < np.minimum(drafted, accepted + 1)[:, None]  # [n, positions]
        kept = reached & (position < accepted[:, None])
        factor = 1.0 - (1.0 - self.decay) * reached  # decay where observed, 1 elsewhere
        self.reached[rows] = self.reached[rows] * factor + reached
        self.accepted[rows] = self.accepted[rows] * factor + kept
        return reached.sum(axis=0), kept.sum(axis=0)

    def observe_counts(self, key: int, reached: np.ndarray, kept: np.ndarray) -> None:
        """n = reached[k] observations of position k at once, kept[k] of them kept (the pooled row: a batch's rows
        of one step): the counts decay by decay^n and gain n observations' weight after their own decay at their
        mean outcome. Exactly n observe calls' counts where the outcomes are alike; where they differ, the same
        reached count and the accepted count that averages over their orders."""
        row = self.index[key]
        decay_n = self.decay ** reached
        added = (1.0 - decay_n) / (1.0 - self.decay)  # 0 where nothing was observed
        self.reached[row] = decay_n * self.reached[row] + added
        self.accepted[row] = decay_n * self.accepted[row] + added * kept / np.maximum(reached, 1)

    def relax(self, rows: np.ndarray, prior: Sequence[float], rate: float) -> None:
        """A step without drafts: the rows' counts move toward `weight` pseudo-observations of `prior` by `rate`,
        so that what a request's drafts showed ages with the tokens it emits since, and an estimate that a short run
        of rejections pushed below its worth comes back to try drafting again."""
        keep = 1.0 - rate
        self.reached[rows] = keep * self.reached[rows] + rate * self.weight
        self.accepted[rows] = keep * self.accepted[rows] + rate * self.weight * np.asarray(prior)

    def _add(self, key: int, prior: Sequence[float]) -> int:
        if not self.free:  # twice the rows
            grown = len(self.reached)
            self.reached = np.concatenate([self.reached, np.zeros_like(self.reached)])
            self.accepted = np.concatenate([self.accepted, np.zeros_like(self.accepted)])
            self.free = list(range(2 * grown - 1, grown - 1, -1))
        row = self.free.pop()
        self.reached[row] = self.weight
        self.accepted[row] = self.weight * np.asarray(prior)
        self.index[key] = row
        return row
