"""Reranking a drafted tree to its budget (EAGLE-2's dynamic trees): keep the nodes of highest cumulative draft
log-probability. A child's score is its parent's plus a log-probability <= 0, so the kept set holds every kept
node's parents (ties go to the earlier node, and parents come before their children)."""

from __future__ import annotations

from specdec.speculation import DraftTree


def best_nodes(scores: list[float], budget: int) -> list[int]:
    """The root and the `budget` best other nodes by score, in tree order."""
    ranked = sorted(range(1, len(scores)), key=lambda j: (-scores[j], j))
    return [0, *sorted(ranked[:budget])]


def prune(tree: DraftTree, keep: list[int]) -> DraftTree:
    """The subtree of nodes `keep` (tree order, closed under parents), renumbered."""
    index = {node: i for i, node in enumerate(keep)}
    if any(tree.parents[node] >= 0 and tree.parents[node] not in index for node in keep):
        raise ValueError("the kept nodes must include every kept node's parent")
    return DraftTree([tree.tokens[j] for j in keep], [index.get(tree.parents[j], -1) for j in keep],
                     [tree.draft_probs[j] for j in keep])
