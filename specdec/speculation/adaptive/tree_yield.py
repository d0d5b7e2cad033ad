"""What a draft tree is expected to emit, priced from a request's chain acceptance and a pooled sibling
acceptance (the rank model), and what a verified tree tells of both (rank_outcome).

The rank model: below an accepted node at depth d, its first-ranked child (the drafter's most likely token) is kept
with the chain's conditional acceptance p[d], exactly as a chain's draft at that position; each later-ranked sibling,
reached only when those ranked before it were not kept, is kept with probability q, one figure for every depth and
rank, pooled over requests. A tree then keeps what the chain along its first-ranked path keeps, and more where a
sibling catches a rejection. The synthetic drafter's trees follow it by construction (specdec/eval/synthetic.py);
the shipped MTP's static trees fit q = 0.52, its EAGLE-3 head's 0.15 (the CPU fits of 2026-12-05, docs/design.md).
A dynamic tree (EAGLE-2: the drafter keeps its likeliest nodes, a new shape each step) is priced at the shape the
rank model keeps most of at the drafter's figures (likeliest_tree_parents).

    E[tokens] = 1 + sum over drafted nodes j of P(j kept),
    P(j kept) = P(parent kept) * (p[depth(parent)] if j is its parent's first child
                                  else (1 - p[depth(parent)]) * (1 - q)^(rank - 2) * q)
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from specdec.speculation.tree import TreeShape, static_tree_parents


@dataclass(frozen=True, eq=False)  # (compared by identity: a policy holds one, a memo key of every row's figures)
class TreeLayout:
    """A tree's drafted nodes (the root left out), topologically ordered: each node's parent (its index in the whole
    tree, root first: 0 the root, node j of this layout j + 1), its parent's depth (the chain position deciding its
    first-ranked child) and its rank among its siblings (0: the first-ranked)."""

    parents: tuple[int, ...]
    parent_depths: tuple[int, ...]
    ranks: tuple[int, ...]

    @classmethod
    def of(cls, shape: TreeShape, p: Sequence[float] | None = None, q: float | None = None) -> TreeLayout:
        """A static tree's layout; a dynamic tree's at chain acceptance p (per depth, at least shape.steps values)
        and sibling acceptance q, the figures it is priced at: likeliest_tree_parents."""
        if not shape.dynamic:
            return cls.from_parents(static_tree_parents(shape))
        if p is None or q is None:
            raise ValueError("a dynamic tree's layout needs the acceptance it is drafted at (p, q)")
        return cls.from_parents(likeliest_tree_parents(shape, p, q))

    @classmethod
    def from_parents(cls, full: Sequence[int]) -> TreeLayout:
        """From a tree's parents, root first (-1), each node after its parent and siblings in rank order."""
        depth, seen = [0] * len(full), [0] * len(full)
        parents, parent_depths, ranks = [], [], []
        for node in range(1, len(full)):
            parent = full[node]
            depth[node] = depth[parent] + 1
            parents.append(parent)
            parent_depths.append(depth[parent])
            ranks.append(seen[parent])
            seen[parent] += 1
        return cls(tuple(parents), tuple(parent_depths), tuple(ranks))

    @property
    def depth(self) -> int:
        return max(self.parent_depths, default=-1) + 1

    def expected_tokens(self, p: Sequence[float], q: float) -> float:
        """Expected tokens a step of this tree emits (the bonus token included), at chain acceptance p[d] per depth
        d (at least self.depth values) and sibling acceptance q."""
        return self.expected_pair(p, p, q, q)[0]

    def expected_pair(self, p: Sequence[float], hoped: Sequence[float], q: float,
                      hoped_q: float) -> tuple[float, float]:
        """expected_tokens at (p, q) and at (`hoped`, `hoped_q`) (the row's hopeful acceptance and the pooled sibling
        acceptance's: RunningAcceptance.expected, SiblingAcceptance.hoped), in one walk of the nodes: the policy
        prices every row this way whenever its counts change (~3 us a row at 16 nodes on a 2-core CPU, half of it
        the walk)."""
        sibling = [0.0] + [q * (1.0 - q) ** (rank - 1) for rank in range(1, self.widest)]  # (rank >= 1)
        hoped_sibling = [0.0] + [hoped_q * (1.0 - hoped_q) ** (rank - 1) for rank in range(1, self.widest)]
        kept, hope = [1.0], [1.0]  # (index 0: the root; node j of the layout is at j + 1)
        total = hoped_total = 1.0
        for parent, depth, rank in self._nodes:  # (kept[parent]: the parent's chance, the root's 1)
            if rank == 0:
                chance, hoped_chance = kept[parent] * p[depth], hope[parent] * hoped[depth]
            else:
                chance = kept[parent] * (1.0 - p[depth]) * sibling[rank]
                hoped_chance = hope[parent] * (1.0 - hoped[depth]) * hoped_sibling[rank]
            kept.append(chance)
            hope.append(hoped_chance)
            total += chance
            hoped_total += hoped_chance
        return total, hoped_total

    def keeps_a_first_draft(self, p0: float, q: float) -> float:
        """The chance that a step of this tree keeps one of the root's children, at first-position acceptance p0 and
        sibling acceptance q: where a chain's first draft is rarely kept (a collapsed row), the tree's siblings may
        still be (RunningAcceptance.expected)."""
        return 1.0 - (1.0 - p0) * (1.0 - q) ** max(self._root_children - 1, 0)

    @functools.cached_property
    def _root_children(self) -> int:
        return sum(1 for parent in self.parents if parent == 0)

    @functools.cached_property
    def _nodes(self) -> tuple[tuple[int, int, int], ...]:
        """(parent, parent's depth, rank) per drafted node, walked by expected_pair."""
        return tuple(zip(self.parents, self.parent_depths, self.ranks, strict=True))

    @functools.cached_property
    def widest(self) -> int:
        """The most children any node has."""
        return max(self.ranks, default=-1) + 1


def likeliest_tree_parents(shape: TreeShape, p: Sequence[float], q: float) -> list[int]:
    """The parents (root first: -1) of the shape.budget drafted nodes a step keeps most often under the rank model at
    chain acceptance p[d] per depth and sibling acceptance q, at most shape.steps deep, each node with at most
    shape.topk children: chosen best first, a node's first-ranked child offered once it is chosen, a sibling once
    the one ranked before it is (a node's chance is at most its parent's, a sibling's at most the one before it but
    for the first child where p < (1 - p) q, and a drafter's likeliest child comes first).

    What a dynamic tree is priced at: an EAGLE-2 drafter keeps the nodes of highest cumulative draft probability,
    which are these where its confidence tracks the target's acceptance. A step whose confidences single out better
    nodes keeps more, so this prices a dynamic tree low rather than high (the shipped MTP at batch 1 on the CPU,
    benchmarks/results/shapes_cpu_2026-12-05.md: a dynamic tree of 16 drafts, --topk 4, kept 4.02 tokens a step, a
    static one of 16, --topk 2, 3.73)."""
    parents, depths, chances = [-1], [0], [1.0]
    # candidates: (-chance, parent, rank), each a node's first child or the sibling after a chosen one
    frontier = [(-p[0], 0, 0)]
    while frontier and len(parents) <= shape.budget:
        negative, parent, rank = heapq.heappop(frontier)
        node, depth = len(parents), depths[parent] + 1
        parents.append(parent)
        depths.append(depth)
        chances.append(-negative)
        if rank + 1 < shape.topk:  # its next-ranked sibling: reached where this one and those before are not kept
            sibling = chances[parent] * (1.0 - p[depth - 1]) * (1.0 - q) ** rank * q
            heapq.heappush(frontier, (-sibling, parent, rank + 1))
        if depth < shape.steps:  # its first-ranked child
            heapq.heappush(frontier, (-chances[node] * p[depth], node, 0))
    return parents


def child_lists(parents: Sequence[int]) -> list[list[int]]:
    """Every node's children in rank order, from a tree's parents (root first)."""
    kids: list[list[int]] = [[] for _ in parents]
    for node, parent in enumerate(parents[1:], 1):
        kids[parent].append(node)
    return kids


def rank_outcome(parents: Sequence[int], path: Sequence[int],
                 children: list[list[int]] | None = None) -> tuple[list[bool], int, int]:
    """What a verified tree (its parents, root first) and its accepted path (node indices from the root) tell the
    rank model: per depth along the path, whether the node there had its first-ranked child kept (depths whose node
    has no children tell nothing and end the list); and the later-ranked siblings tried and kept (a sibling is tried
    where every sibling ranked before it was not kept). A chain of s drafts with a kept gives [True] * a + [False]
    (a < s) and no siblings. children: child_lists(parents), where the caller has them (a batch's rows share one
    tree's parents)."""
    children = children if children is not None else child_lists(parents)
    first_kept, tried, kept = [], 0, 0
    for at, node in enumerate(path):
        kids = children[node]
        if not kids:
            break
        nxt = path[at + 1] if at + 1 < len(path) else None
        rank = kids.index(nxt) if nxt is not None else len(kids)  # (len: every child rejected)
        first_kept.append(rank == 0)
        if rank > 0:  # siblings ranked 1..rank tried (the last of them kept, unless every child was rejected)
            tried += min(rank, len(kids) - 1)
            kept += nxt is not None
    return first_kept, tried, kept


class SiblingAcceptance:
    """q of the rank model, pooled over requests: later-ranked siblings kept / tried, as counts decayed by `decay`
    per sibling tried, starting at `weight` pseudo-observations of `prior`."""

    def __init__(self, prior: float, weight: float, decay: float):
        self.tried, self.kept, self.decay = weight, weight * prior, decay

    def observe(self, tried: int, kept: int) -> None:
        if tried:
            keep = self.decay**tried
            self.tried = keep * self.tried + tried
            self.kept = keep * self.kept + kept

    @property
    def value(self) -> float:
        return self.kept / self.tried

    def hoped(self, optimism: float, sure_of: float) -> float:
        """q taken `optimism` deviations of its estimate higher, sqrt(q (1 - q) / (n + 1 + sure_of)) after n siblings
        tried (the prior's pseudo-observations counted), as a row's chain acceptance is (RunningAcceptance.expected):
        a tree whose first few siblings were all rejected would else be priced at a q too low to be drafted again,
        and q is learnt from tree steps alone (the H100 study of 2026-12-06, Qwen3.5-9B at batch 1: q fell from its
        prior of 0.3 to ~0.15 in four tree steps, where the drafts kept siblings at 0.5, and the policy drafted
        4-chains in 91% of the steps where the tree made 1.16x their tokens/s; replayed, 3 seeds of 30 stuck so)."""
        q = self.value
        return min(1.0, q + optimism * (q * (1.0 - q) / (self.tried + 1.0 + sure_of)) ** 0.5)
