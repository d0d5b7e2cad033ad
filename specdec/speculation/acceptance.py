"""Lossless acceptance of drafted trees: which root-to-leaf path of each tree the target keeps, and the bonus token
after it. docs/design.md section 2.7 has the argument.

Recursive rejection sampling: at a node with target distribution p, its drafted children are tried in order; child
i was drawn from q_i (a point mass for deterministic drafts: greedy or n-gram candidates, EAGLE-2 tree nodes). It is
accepted with probability min(1, p(x_i) / q_i(x_i)); on rejection p becomes norm(max(p - q_i, 0)) and the next child
is tried. If no child is accepted the bonus token is drawn from the current p. Whatever the q_i are (even adapted to
the earlier rejections), each step emits exactly p in distribution, so the output is the target's: lossless. With
temperature 0 the target is a point mass at its argmax: a child is accepted iff it holds the argmax.

Three forms of the same walk:
- accept_greedy: argmax ids only (greedy rows; only [B, T] ints leave the device);
- accept_path: one row on its [T, V] distributions, the per-row reference;
- accept_batch: all sampled rows of a step advancing together on the device, each round reading back only the few
  numbers p(x) of the tried tokens (at a 248k vocabulary a row's [T, V] distributions are 5 MB per step).
Random numbers come from each request's own generator on the host, drawn in the walk's order (an acceptance test
only where p(x) < q(x), then one for the bonus), so a seed makes a request reproducible. The bonus token is drawn
by inverse CDF with that number, which is exact.

TargetAcceptance puts them together for a step: greedy rows by argmax, sampled rows grouped by their sampling
filters (one target_distribution call per group) and walked in one batch. The engine takes any Acceptance, so a
benchmark can inject its own (specdec/eval/synthetic.py).
"""

from __future__ import annotations

from typing import Protocol

import torch

from .sampling import SamplingParams, sample, target_distribution
from .tree import DraftTree

Accepted = tuple[list[int], int]  # (accepted node indices, root first; the bonus token after the last one)


class Acceptance(Protocol):
    def accept(self, trees: list[DraftTree], logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator | None]) -> list[Accepted]:
        """trees: one per row; logits [B, T, V] (T >= every tree's size) of every node -> per row, its path and
        bonus token."""


class TargetAcceptance:
    """The target decides: lossless for greedy and sampled requests alike."""

    def accept(self, trees: list[DraftTree], logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator | None]) -> list[Accepted]:
        chains: dict[int, list[int]] = {}  # length -> a chain's parents, built once per step
        if all(p.greedy for p in params) and all(
                tree.parents == chains.setdefault(len(tree.parents), list(range(-1, len(tree.parents) - 1)))
                for tree in trees):
            return accept_greedy_chains(trees, logits)
        argmax = logits.argmax(-1).tolist() if any(p.greedy for p in params) else None  # [B, T] ints
        results: list[Accepted | None] = [accept_greedy(tree, argmax[row]) if p.greedy else None
                                          for row, (tree, p) in enumerate(zip(trees, params, strict=True))]
        sampled = [row for row, result in enumerate(results) if result is None]
        if sampled:
            probs = torch.empty(len(sampled), *logits.shape[1:], device=logits.device)
            groups: dict[tuple, list[int]] = {}  # rows by sampling filters: one target_distribution per group
            for index, row in enumerate(sampled):
                groups.setdefault(params[row].filters, []).append(index)
            for group in groups.values():
                rows = [sampled[index] for index in group]
                probs[group] = target_distribution(logits[rows], params[rows[0]])
            walks = accept_batch([trees[row] for row in sampled], probs, [generators[row] for row in sampled])
            for row, walk in zip(sampled, walks, strict=True):
                results[row] = walk
        return results


def accept_greedy_chains(trees: list[DraftTree], logits: torch.Tensor) -> list[Accepted]:
    """accept_greedy for a batch of chains, at once: draft j + 1 is kept while every draft up to it holds the
    argmax at its parent. logits [B, T, V] -> per row (path 0..n, the argmax after node n); two small reads."""
    width = max(len(tree) for tree in trees)
    argmax = logits[:, :width].argmax(-1)  # [B, T]
    drafts = torch.tensor([tree.tokens[1:] + [-1] * (width - len(tree)) for tree in trees],
                          dtype=torch.long).to(argmax.device)  # [B, T - 1], -1 past a chain's end
    kept = (drafts == argmax[:, :-1]).long().cumprod(-1).sum(-1)  # [B] drafts accepted
    bonus = argmax.gather(1, kept[:, None])[:, 0]
    kept, bonus = torch.stack([kept, bonus]).tolist()
    return [(list(range(n + 1)), token) for n, token in zip(kept, bonus, strict=True)]


# ---- one row ---------------------------------------------------------------------------------------------------
def accept_greedy(tree: DraftTree, target_argmax: list[int]) -> Accepted:
    """Greedy acceptance (the target is a point mass at its argmax): follow the child holding the argmax while
    there is one; the bonus is the argmax at the last accepted node. target_argmax [T]: per node."""
    node, path, kids, tokens = 0, [0], tree.child_lists(), tree.tokens
    while True:
        wanted = target_argmax[node]
        node = next((child for child in kids[node] if tokens[child] == wanted), None)
        if node is None:
            return path, wanted
        path.append(node)


def accept_path(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator | None) -> Accepted:
    """The walk on one row. target_probs [T, V]: the target's distribution for the token after each node."""
    node, path, kids = 0, [0], tree.child_lists()
    while True:
        p = target_probs[node]
        for child in kids[node]:
            token, q = tree.tokens[child], tree.draft_probs[child]
            if accept_child(p, token, q, generator):
                node = child
                path.append(child)
                break
            p = residual(p, point_mass(token, p.shape[-1], p.device) if q is None else q)
        else:
            return path, sample(p, generator)


def accept_child(p: torch.Tensor, token: int, q: torch.Tensor | None, generator: torch.Generator | None) -> bool:
    """Accept a drafted token x drawn from q (None: a point mass at x) with probability min(1, p(x) / q(x))."""
    q_x = 1.0 if q is None else float(q[token])
    p_x = float(p[token])
    if p_x >= q_x:
        return True
    if p_x == 0:
        return False
    return float(torch.rand((), generator=generator)) < p_x / q_x


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)): the target conditioned on rejecting a draw from q. If p <= q everywhere (only when
    p == q, where a rejection cannot happen) p is returned to stay a distribution."""
    rest = (p - q).clamp_min(0)
    total = rest.sum()
    return rest / total if total > 0 else p


def point_mass(token: int, size: int, device) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(token, device=device), size).float()


# ---- all sampled rows of a step at once --------------------------------------------------------------------------
def accept_batch(trees: list[DraftTree], probs: torch.Tensor, generators: list[torch.Generator | None]
                 ) -> list[Accepted]:
    """accept_path on every row together. probs [B, T, V] (T >= every tree's size); generators: each row's (None:
    torch's default). Each round tries, in every row still walking, the next child of its current node."""
    rows, vocab = len(trees), probs.shape[-1]
    device = probs.device
    node = [0] * rows
    rank = [0] * rows  # which child of the current node is tried next
    paths = [[0] for _ in trees]
    kids = [tree.child_lists() for tree in trees]
    p = probs[:, 0].clone()  # [B, V] each row's current distribution
    walking = list(range(rows))
    while walking:
        tries = [(row, kids[row][node[row]]) for row in walking]
        tries = [(row, children[rank[row]]) for row, children in tries if rank[row] < len(children)]
        walking = [row for row, _ in tries]  # the others ran out of children: their bonus comes from p
        if not tries:
            break
        index = torch.tensor(walking, device=device)
        tokens = [trees[row].tokens[child] for row, child in tries]
        p_x = p[index, torch.tensor(tokens, device=device)]
        q_x = [_law_at(trees[row].draft_probs[child], token, device)
               for (row, child), token in zip(tries, tokens, strict=True)]
        p_x, q_x = torch.stack([p_x, torch.stack(q_x)]).tolist()  # one read for the round
        accepted, rejected = [], []
        for (row, child), px, qx in zip(tries, p_x, q_x, strict=True):
            keep = px >= qx or (px > 0 and float(torch.rand((), generator=generators[row])) < px / qx)
            (accepted if keep else rejected).append((row, child))
        if accepted:
            acc_rows = [row for row, _ in accepted]
            for row, child in accepted:
                node[row], rank[row] = child, 0
                paths[row].append(child)
            p[acc_rows] = probs[acc_rows, [child for _, child in accepted]]
        if rejected:
            rej_rows = [row for row, _ in rejected]
            drafts = torch.stack([_law(trees[row], child, vocab, device) for row, child in rejected])
            rest = (p[rej_rows] - drafts).clamp_min(0)
            total = rest.sum(-1, keepdim=True)
            # norm(max(p - q, 0)); p itself where nothing is left (p == q, where a rejection cannot happen)
            p[rej_rows] = torch.where(total > 0, rest / total.clamp_min(1e-30), p[rej_rows])
            for row in rej_rows:
                rank[row] += 1
    uniforms = torch.tensor([float(torch.rand((), generator=gen)) for gen in generators], dtype=torch.float64,
                            device=device)
    cdf = p.double().cumsum(-1)  # [B, V]
    bonus = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).clamp_max(vocab - 1)
    return [(path, token) for path, token in zip(paths, bonus[:, 0].tolist(), strict=True)]


def _law_at(q: torch.Tensor | None, token: int, device: torch.device) -> torch.Tensor:
    """q(token) as a 0-d fp32 tensor on device (1 for a point mass), read back with the round's other numbers."""
    if q is None:
        return torch.ones((), device=device)
    return q[token].to(device=device, dtype=torch.float32)


def _law(tree: DraftTree, child: int, vocab: int, device: torch.device) -> torch.Tensor:
    """The distribution child's token was drawn from, on device: its draft law, or a point mass."""
    q = tree.draft_probs[child]
    if q is None:
        return torch.nn.functional.one_hot(torch.tensor(tree.tokens[child], device=device), vocab).float()
    return q.to(device=device, dtype=torch.float32)
