"""Token trees: what a drafter proposes for one request, and the walk that accepts a root-to-leaf path of it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .sampling import accept_child, point_mass, residual, sample


@dataclass
class DraftTree:
    """Drafted tokens below a root. Node 0 is the root: the request's newest token, emitted but not yet scored by
    the target. Nodes are topologically ordered (parents[j] < j). draft_probs[j] is the distribution node j's
    token was drawn from (None for the root and for deterministic candidates: a point mass)."""

    tokens: list[int]
    parents: list[int]
    draft_probs: list[torch.Tensor | None] = field(default_factory=list)

    def __post_init__(self):
        if not self.draft_probs:
            self.draft_probs = [None] * len(self.tokens)
        if not (len(self.tokens) == len(self.parents) == len(self.draft_probs)) or not self.tokens:
            raise ValueError("a draft tree needs as many tokens, parents and draft distributions, and a root")
        if self.parents[0] != -1 or any(not 0 <= p < j for j, p in enumerate(self.parents) if j):
            raise ValueError(f"parents must be -1 for the root and point to earlier nodes, got {self.parents}")

    @classmethod
    def chain(cls, root: int, drafts: list[int], draft_probs: list[torch.Tensor | None] | None = None) -> DraftTree:
        return cls([root, *drafts], list(range(-1, len(drafts))), [None, *(draft_probs or [None] * len(drafts))])

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        return [j for j, parent in enumerate(self.parents) if parent == node]


def accept_greedy(tree: DraftTree, target_argmax: list[int]) -> tuple[list[int], int]:
    """Greedy acceptance (the target is a point mass at its argmax): follow the child holding the argmax while
    there is one; the bonus is the argmax at the last accepted node. target_argmax [T]: per node."""
    node, path = 0, [0]
    while True:
        match = [child for child in tree.children(node) if tree.tokens[child] == target_argmax[node]]
        if not match:
            return path, target_argmax[node]
        node = match[0]
        path.append(node)


def accept_path(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator | None
                ) -> tuple[list[int], int]:
    """Walk the tree from the root with recursive rejection sampling (see sampling.py).

    target_probs [T, V]: the target's distribution for the token after each node. Returns the accepted path (node
    indices, root first) and the bonus token drawn at its last node.
    """
    node, path = 0, [0]
    while True:
        p = target_probs[node]
        for child in tree.children(node):
            token, q = tree.tokens[child], tree.draft_probs[child]
            if accept_child(p, token, q, generator):
                node = child
                path.append(child)
                break
            p = residual(p, point_mass(token, p.shape[-1], p.device) if q is None else q)
        else:
            return path, sample(p, generator)
