"""Per-request speculation on an engine that drafts one shape for the whole batch.

The engine asks its drafter for trees of one TreeShape every step. PerRequestDrafts wraps that drafter and cuts each
request's tree to the request's own budget: its first `cap` drafted nodes (nodes are topologically ordered, so any
prefix is a tree; cap 0 leaves the root alone, which the target verifies as plain decoding would). Every drafter
in drafters/ indexes its bookkeeping by node number and only ever reads the nodes of the trees it is handed back, so
a prefix is safe for all of them. The cut saves the target's verify work for that request; the drafter still drafts
the full shape (a drafter that took a shape per request would save that too: see the package docstring).

It also reports, per verified tree, how deep it was and how deep the accepted path went, for the metrics.
"""

from __future__ import annotations

from collections.abc import Callable

from drafters.base import Drafter, DraftRequest
from specdec.speculation import DraftTree, TreeShape


def depths(tree: DraftTree) -> list[int]:
    """Each node's depth (root 0)."""
    depth = [0] * len(tree)
    for j, parent in enumerate(tree.parents[1:], 1):
        depth[j] = depth[parent] + 1
    return depth


def prefix(tree: DraftTree, cap: int) -> DraftTree:
    """The root and the first `cap` drafted nodes."""
    if len(tree) <= cap + 1:
        return tree
    return DraftTree(tree.tokens[:cap + 1], tree.parents[:cap + 1], tree.draft_probs[:cap + 1])


class PerRequestDrafts(Drafter):
    """observe(proposed depth, accepted depth) is called once per verified tree (both in drafted levels)."""

    def __init__(self, inner: Drafter, observe: Callable[[int, int], None] | None = None):
        self.inner = inner
        self.observe = observe
        self.caps: dict[int, int] = {}  # request id -> drafted nodes at most; absent: the shape's whole budget
        self.target_features = inner.target_features
        self.supports_dynamic_trees = inner.supports_dynamic_trees

    def limit(self, request_id: int, cap: int) -> None:
        self.caps[request_id] = cap

    def check_shape(self, shape: TreeShape) -> None:
        self.inner.check_shape(shape)

    def start(self, request: DraftRequest, target_hidden=None) -> None:
        self.inner.start(request, target_hidden)

    def propose(self, requests: list[DraftRequest], shape: TreeShape) -> list[DraftTree]:
        trees = self.inner.propose(requests, shape)
        return [prefix(tree, self.caps[r.request_id]) if r.request_id in self.caps else tree
                for r, tree in zip(requests, trees, strict=True)]

    def accepted(self, requests: list[DraftRequest], trees: list[DraftTree], results, target_hidden=None) -> None:
        self.inner.accepted(requests, trees, results, target_hidden)
        if self.observe is not None:
            for tree, (path, _bonus) in zip(trees, results, strict=True):
                self.observe(max(depths(tree)), len(path) - 1)

    def skipped(self, requests: list[DraftRequest], roots: list[int], target_hidden=None) -> None:
        self.inner.skipped(requests, roots, target_hidden)

    def backlog(self, request_ids: list[int]) -> int:
        return self.inner.backlog(request_ids)

    def finish(self, request_id: int) -> None:
        self.caps.pop(request_id, None)
        self.inner.finish(request_id)
