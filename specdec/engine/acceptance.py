"""Lossless acceptance for the sampled requests of a step, all rows at once, on the device that holds the target's
distributions.

The walk is tree.accept_path's recursive rejection sampling (sampling.py has the lemma), with every row advancing
together: each round tries, in every row still walking, the next child of its current node. A round reads only
the few numbers p(x) of the tried tokens back to the host, and the bonus tokens come back in one read at the end,
instead of each row's [T, V] distributions crossing to the host (at a 248k vocabulary, 5 MB per row per step).

Random numbers come from each request's own generator on the host, drawn in the walk's order (an acceptance test
only where p(x) < q(x), then one for the bonus), so a seed still makes a request reproducible. The bonus token is
drawn by inverse CDF with that number, which is exact.
"""

from __future__ import annotations

import torch

from .tree import DraftTree


def accept_batch(trees: list[DraftTree], probs: torch.Tensor, generators: list[torch.Generator | None]
                 ) -> list[tuple[list[int], int]]:
    """trees: one per row; probs [B, T, V] (T >= every tree's size): the target's distribution for the token after
    each node; generators: each row's (None: torch's default). -> per row, the accepted path (node indices, root
    first) and the bonus token drawn at its last node."""
    rows, vocab = len(trees), probs.shape[-1]
    device = probs.device
    node = [0] * rows
    rank = [0] * rows  # which child of the current node is tried next
    paths = [[0] for _ in trees]
    p = probs[:, 0].clone()  # [B, V] each row's current distribution
    walking = list(range(rows))
    while walking:
        tries = [(row, trees[row].children(node[row])) for row in walking]
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
