"""Token trees: what a drafter proposes for one request (DraftTree), and what the engine asks a drafter for per step
(TreeShape)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

# The verify kernels take trees of up to 64 nodes (verify_kernels/{gdn,mamba2}/verify.py MAX_NODES): the root and at
# most 63 drafted tokens per request and step.
MAX_TREE_NODES = 64


@dataclass(slots=True)
class DraftTree:
    """Drafted tokens below a root. Node 0 is the root: the request's newest token, emitted but not yet scored by
    the target. Nodes are topologically ordered (parents[j] < j). draft_probs[j] is the distribution node j's
    token was drawn from (None for the root and for deterministic candidates: a point mass)."""

    tokens: list[int]
    parents: list[int]
    draft_probs: list[torch.Tensor | None] | None = None  # (None or empty: a point mass at every node)

    def __post_init__(self):
        # (a drafter makes a tree per request each step, on the path between the target's acceptance read and its
        # next launch: one list made here, lengths read once, the chain checked by one list comparison)
        count = len(self.tokens)
        if not self.draft_probs:
            self.draft_probs = [None] * count
        if not count or len(self.parents) != count or len(self.draft_probs) != count:
            raise ValueError("a draft tree needs as many tokens, parents and draft distributions, and a root")
        if self.parents == chain_parents(count):  # (is_chain: the common case)
            return
        if self.parents[0] != -1 or not all(0 <= p < j for j, p in enumerate(self.parents[1:], 1)):
            raise ValueError(f"parents must be -1 for the root and point to earlier nodes, got {self.parents}")

    @classmethod
    def chain(cls, root: int, drafts: list[int], draft_probs: list[torch.Tensor | None] | None = None) -> DraftTree:
        """root, then drafts[j] as node j + 1 below node j. A chain is a tree by construction, so __init__'s checks
        are left out but the distributions' count (0.6 us a chain of 5 against 0.88: drafters make a tree per request
        every step, on the path between the target's acceptance read and its next launch)."""
        if draft_probs and len(draft_probs) != len(drafts):
            raise ValueError(f"{len(drafts)} drafts but {len(draft_probs)} draft distributions")
        tree = object.__new__(cls)
        tree.tokens = [root, *drafts]
        tree.parents = list(range(-1, len(drafts)))  # (its own: a drafter may grow it)
        tree.draft_probs = [None, *draft_probs] if draft_probs else [None] * (len(drafts) + 1)
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        """Node j's parent is j - 1 for every node (a chain of drafts, or the root alone)."""
        return self.parents == chain_parents(len(self.parents))

    def children(self, node: int) -> list[int]:
        return [j for j, parent in enumerate(self.parents) if parent == node]

    def child_lists(self) -> list[list[int]]:
        """Every node's children in order, [T] lists: one pass, for walks that visit many nodes (a finished tree;
        drafters still growing it ask children())."""
        kids: list[list[int]] = [[] for _ in self.parents]
        for j, parent in enumerate(self.parents[1:], 1):
            kids[parent].append(j)
        return kids


@functools.cache
def chain_parents(length: int) -> list[int]:
    """The parents of a chain of `length` nodes, [-1, 0, 1, ...]: one shared list per length (read it, never change
    it)."""
    return list(range(-1, length - 1))


@dataclass(frozen=True)
class TreeShape:
    """How much to draft per step: a chain of `steps` tokens (topk = 1), or a static tree expanding the `topk`
    most likely children of each frontier node for `steps` levels, capped at `max_tokens` drafted nodes.

    dynamic (EAGLE-2): each level expands the `topk` nodes of highest cumulative draft log-probability by their
    `topk` most likely children; the `max_tokens` best nodes of all levels (default steps * topk) are drafted."""

    steps: int = 4
    topk: int = 1
    max_tokens: int | None = None
    dynamic: bool = False

    def __post_init__(self):
        if self.steps < 1 or self.topk < 1:
            raise ValueError(f"num_steps and topk must be >= 1, got steps={self.steps}, topk={self.topk}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {self.max_tokens}")

    @property
    def budget(self) -> int:
        """Drafted nodes at most (not counting the root)."""
        if self.dynamic:
            return self.max_tokens if self.max_tokens is not None else self.steps * self.topk
        full = sum(self.topk**level for level in range(1, self.steps + 1)) if self.topk > 1 else self.steps
        return full if self.max_tokens is None else min(full, self.max_tokens)

    @property
    def depth(self) -> int:
        """Drafts on the longest path: a chain's length, a static tree's levels within the budget, a dynamic
        tree's steps (at most)."""
        if self.dynamic:
            return self.steps
        parents = static_tree_parents(self)
        depth = [0] * len(parents)
        for node in range(1, len(parents)):
            depth[node] = depth[parents[node]] + 1
        return max(depth)


@functools.cache
def static_tree_parents(shape: TreeShape) -> list[int]:
    """The parents of a static tree of `shape` (root first): level by level, each frontier node gets shape.topk
    children while the budget lasts, as the drafters grow theirs (drafters/draft_model.py expand_level), its
    children in rank order (the most likely first). One shared list per shape: read it, never change it."""
    parents, frontier = [-1], [0]
    for _ in range(shape.steps):
        grown = []
        for node in frontier:
            for _ in range(min(shape.topk, shape.budget + 1 - len(parents))):
                parents.append(node)
                grown.append(len(parents) - 1)
        frontier = grown
    return parents
