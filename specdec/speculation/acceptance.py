"""Lossless acceptance of drafted trees: which root-to-leaf path of each tree the target keeps, and the bonus token
after it. docs/design.md section 2.7 has the argument.

Recursive rejection sampling: at a node with target distribution p, its drafted children are tried in order; child
i was drawn from q_i (a point mass for deterministic drafts: greedy or n-gram candidates, EAGLE-2 tree nodes). It is
accepted with probability min(1, p(x_i) / q_i(x_i)); on rejection p becomes norm(max(p - q_i, 0)) and the next child
is tried. If no child is accepted the bonus token is drawn from the current p. Whatever the q_i are (even adapted to
the earlier rejections), each step emits exactly p in distribution, so the output is the target's: lossless. With
temperature 0 the target is a point mass at its argmax: a child is accepted iff it holds the argmax.

Forms of the same walk:
- accept_greedy: argmax ids only (greedy rows; only [B, T] ints leave the device); accept_greedy_chains: all greedy
  chains of a step at once (one small read), or left on the device (greedy_chains, and greedy_trees for trees:
  AcceptedOnDevice, from which the engine launches the commit before it reads them);
- accept_path: one row on its [T, V] distributions, the per-row reference;
- accept_batch: all sampled rows of a step advancing together on the device, each round reading back only the few
  numbers p(x) of the tried tokens (at a 248k vocabulary a row's [T, V] distributions are 5 MB per step);
  accept_chains: the same for chains, every round's numbers read at once (a chain's tried drafts are known ahead):
  walk_chains, then bonus_tokens (on the device; TargetAcceptance.accept_on_device leaves them there, so that the
  engine commits chains of sampled rows, too, before reading their acceptance).
Random numbers come from each request's own generator on the host, drawn in the walk's order (an acceptance test
only where p(x) < q(x), then one for the bonus), so a seed makes a request reproducible. The bonus token is drawn
by inverse CDF with that number, which is exact.

TargetAcceptance puts them together for a step: greedy rows by argmax, sampled rows grouped by their sampling
filters (one target_distribution call per group) and walked in one batch (accept_chains when every one is a
chain). The engine takes any Acceptance, so a benchmark can inject its own (specdec/eval/synthetic.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Protocol

import torch

from specdec.cache.host_buffer import to_device
from specdec.cache.step import host_longs
from verify_kernels.tree import ancestor_mask

from .sampling import SamplingParams, sample, target_distribution
from .tree import DraftTree

# (accepted node indices, root first: read them, never change them, rows may share one; the bonus token after them)
Accepted = tuple[list[int], int]


@dataclass
class AcceptedOnDevice:
    """A step's acceptance still on the device, int64: kept [B] drafts kept per row, bonus [B] the token after them,
    and nodes [B, W] the kept path's node indices, root first, -1 past its end (trees; None for chains, whose path
    is nodes 0 .. kept). The commit can be launched from them before the host reads them: start_read before
    launching it, so that read waits for the acceptance, not for the commit too."""

    kept: torch.Tensor
    bonus: torch.Tensor
    nodes: torch.Tensor | None = None
    _host: torch.Tensor | None = field(default=None, repr=False)  # [B, 2 (+ W)] pinned, once start_read queued it
    _copied: torch.cuda.Event | None = field(default=None, repr=False)

    def columns(self, width: int) -> torch.Tensor:
        """[B, width] the kept nodes, root first, -1 padded (the commit's accepted columns; width >= the tree's)."""
        o_w = torch.arange(width, device=self.kept.device)
        if self.nodes is None:
            return torch.where(o_w <= self.kept[:, None], o_w, -1)
        return torch.nn.functional.pad(self.nodes, (0, width - self.nodes.shape[1]), value=-1)

    def start_read(self) -> None:
        """Queue the copy to the host (CUDA; elsewhere read copies): the work launched after this is not waited for
        by read."""
        if self.kept.is_cuda and self._host is None:
            packed = self._packed()
            self._host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
            self._host.copy_(packed, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()

    def read(self) -> list[Accepted]:
        """One small read (the step's wait for the device) -> per row, its path and bonus token."""
        if self._copied is not None:
            self._copied.synchronize()
            rows = self._host.tolist()
        else:
            rows = self._packed().tolist()
        if self.nodes is not None:
            return [(row[2:row[0] + 3], row[1]) for row in rows]
        # a chain's path is its first nodes: rows that kept as many share one list (read them, never change them:
        # a copy per row cost ~8 us at batch 128 on the path between this read and the next launch)
        paths = [list(range(n + 1)) for n in range(max(row[0] for row in rows) + 1)]
        return [(paths[row[0]], row[1]) for row in rows]

    def _packed(self) -> torch.Tensor:
        """[B, 2 (+ W)]: kept, bonus (, nodes)."""
        parts = [self.kept[:, None], self.bonus[:, None]]
        return torch.cat(parts if self.nodes is None else [*parts, self.nodes], dim=1)


class Acceptance(Protocol):
    def accept(self, trees: list[DraftTree], logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator | None]) -> list[Accepted]:
        """trees: one per row; logits [B, T, V] (T >= every tree's size) of every node -> per row, its path and
        bonus token."""

    def shadow_kept(self, contexts: list[list[int]], drafts: list[int | None], tokens: list[int]) -> list[bool]:
        """Shadow drafts (drafters.base.Drafter.shadow_drafts): whether each request's first draft, made from its
        tokens so far (contexts[i]), would have been kept, given tokens[i], what its plain step emitted there (a
        draft None: none made, not kept)."""


class TargetAcceptance:
    """The target decides: lossless for greedy and sampled requests alike."""

    def shadow_kept(self, contexts: list[list[int]], drafts: list[int | None], tokens: list[int]) -> list[bool]:
        """A first draft is kept iff it is the emitted token: exact for greedy rows; for a sampled row, whose token
        was drawn from p, it holds with probability p(draft), which is what a point-mass draft is accepted with
        (min(1, p / q) at q = 1), so the policy's estimate is unbiased either way."""
        return [draft is not None and draft == token for draft, token in zip(drafts, tokens, strict=True)]

    def accept_on_device(self, trees: list[DraftTree], logits: torch.Tensor, params: list[SamplingParams],
                         generators: list[torch.Generator | None] | None = None) -> AcceptedOnDevice | None:
        """The step's acceptance as AcceptedOnDevice, not read back, so that the commit can be launched before the
        host reads it: greedy trees' (greedy_trees) and chains' (greedy_chains) computed on the device; chains of
        sampled rows (given their generators) walked on the host after one read of their drafts' probabilities
        (walk_chains, the numbers accept_chains draws), their bonus tokens drawn on the device. Else (trees with
        sampled rows, or sampled rows without generators) None."""
        sampled = [row for row, p in enumerate(params) if not p.greedy]
        if not all(tree.is_chain for tree in trees):
            return None if sampled else greedy_trees(trees, logits)
        if not sampled:
            return greedy_chains(trees, logits)
        if generators is None:
            return None
        chosen = [generators[row] for row in sampled]
        kept, p = walk_chains([trees[row] for row in sampled], sampled_probs(logits, params, sampled), chosen)
        kept, bonus = to_device(host_longs(kept), logits.device), bonus_tokens(p, chosen)
        if len(sampled) == len(trees):
            return AcceptedOnDevice(kept, bonus)
        accepted = greedy_chains(trees, logits)  # (every row's; the sampled rows' replaced)
        index = to_device(host_longs(sampled), logits.device)
        return AcceptedOnDevice(accepted.kept.index_copy(0, index, kept), accepted.bonus.index_copy(0, index, bonus))

    def accept(self, trees: list[DraftTree], logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator | None]) -> list[Accepted]:
        on_device = self.accept_on_device(trees, logits, params, generators)
        if on_device is not None:
            return on_device.read()
        argmax = logits.argmax(-1).tolist() if any(p.greedy for p in params) else None  # [B, T] ints
        results: list[Accepted | None] = [accept_greedy(tree, argmax[row]) if p.greedy else None
                                          for row, (tree, p) in enumerate(zip(trees, params, strict=True))]
        sampled = [row for row, result in enumerate(results) if result is None]
        if sampled:
            probs = sampled_probs(logits, params, sampled)
            walk = accept_chains if all(trees[row].is_chain for row in sampled) else accept_batch
            walks = walk([trees[row] for row in sampled], probs, [generators[row] for row in sampled])
            for row, walk in zip(sampled, walks, strict=True):
                results[row] = walk
        return results


def sampled_probs(logits: torch.Tensor, params: list[SamplingParams], sampled: list[int]) -> torch.Tensor:
    """The target's distributions [S, T, V] of the sampled rows (in that order): one target_distribution per group of
    rows sharing their sampling filters."""
    probs = torch.empty(len(sampled), *logits.shape[1:], device=logits.device)
    groups: dict[tuple, list[int]] = {}
    for index, row in enumerate(sampled):
        groups.setdefault(params[row].filters, []).append(index)
    for group in groups.values():
        rows = [sampled[index] for index in group]
        probs[group] = target_distribution(logits[rows], params[rows[0]])
    return probs


def accept_greedy_chains(trees: list[DraftTree], logits: torch.Tensor) -> list[Accepted]:
    """accept_greedy for a batch of chains, at once: draft j + 1 is kept while every draft up to it holds the
    argmax at its parent. logits [B, T, V] -> per row (path 0..n, the argmax after node n); one small read."""
    return greedy_chains(trees, logits).read()


def greedy_trees(trees: list[DraftTree], logits: torch.Tensor) -> AcceptedOnDevice:
    """accept_greedy on every row's tree at once, left on the device: a node is kept when it and each of its
    ancestors holds the argmax at its parent, the first such sibling where several do (accept_greedy follows the
    first child holding it); the kept nodes form one path from the root. logits [B, T, V], T >= every tree's size."""
    rows, width, device = len(trees), max(len(tree.tokens) for tree in trees), logits.device
    argmax = logits[:, :width].argmax(-1)  # [B, W]
    padding = [[-1] * (width - len(tree.tokens)) for tree in trees]
    tokens = to_device(host_longs([t for tree, pad in zip(trees, padding, strict=True) for t in tree.tokens + pad],
                                  rows, width), device)
    parents = to_device(host_longs([p for tree, pad in zip(trees, padding, strict=True) for p in tree.parents + pad],
                                   rows, width), device)
    num_nodes = to_device(host_longs([len(tree.tokens) for tree in trees]), device)
    o_w = torch.arange(width, device=device)
    valid = o_w < num_nodes[:, None]
    holds = (tokens == argmax.gather(1, parents.clamp(min=0))) & valid
    holds[:, 0] = True  # the root
    # an earlier sibling with the same token shadows a node
    shadowed = ((o_w[:, None] > o_w[None, :]) & (parents[:, :, None] == parents[:, None, :])
                & (tokens[:, :, None] == tokens[:, None, :]) & valid[:, None, :]).any(-1)
    holds &= ~shadowed
    on_path = ~(ancestor_mask(parents, num_nodes, check=False) & ~holds[:, None, :]).any(-1) & valid  # [B, W]
    kept = on_path.sum(-1) - 1
    # parents come before their children: the path's nodes in index order are root first
    position = torch.where(on_path, on_path.long().cumsum(-1) - 1, width)  # (off the path: a spare column)
    nodes = torch.full((rows, width + 1), -1, dtype=torch.long, device=device)
    nodes = nodes.scatter(1, position, o_w.expand(rows, width))[:, :width]
    return AcceptedOnDevice(kept, argmax.gather(1, nodes.gather(1, kept[:, None]))[:, 0], nodes)


def greedy_chains(trees: list[DraftTree], logits: torch.Tensor) -> AcceptedOnDevice:
    """accept_greedy_chains left on the device: the drafts go to it, the kept counts and bonus tokens stay."""
    width = max(len(tree.tokens) for tree in trees)
    argmax = logits[:, :width].argmax(-1)  # [B, T]
    if all(len(tree.tokens) == width for tree in trees):  # chains of one length: no padding
        flat = list(chain.from_iterable(tree.tokens[1:] for tree in trees))
    else:
        flat = list(chain.from_iterable(tree.tokens[1:] + [-1] * (width - len(tree.tokens)) for tree in trees))
    drafts = to_device(host_longs(flat, len(trees), width - 1), argmax.device)  # [B, T - 1], -1 past a chain's end
    kept = (drafts == argmax[:, :-1]).long().cumprod(-1).sum(-1)  # [B] drafts accepted
    return AcceptedOnDevice(kept, argmax.gather(1, kept[:, None])[:, 0])


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
    return list(zip(paths, bonus_tokens(p, generators).tolist(), strict=True))


def accept_chains(trees: list[DraftTree], probs: torch.Tensor, generators: list[torch.Generator | None]
                  ) -> list[Accepted]:
    """accept_batch for chains (any lengths), the same walk drawing the same numbers, with one read of every draft's
    p(x) and q(x) instead of a read per round: along a chain a tried draft's p is the target's own distribution at
    its parent (a rejection ends the walk), so all of them are gathered at once and the walk runs on the host over
    those floats, round by round and row by row as accept_batch draws its uniforms (walk_chains); then the bonus
    tokens (bonus_tokens)."""
    kept, p = walk_chains(trees, probs, generators)
    paths = [list(range(n + 1)) for n in range(max(kept, default=0) + 1)]
    return [(paths[n][:], token) for n, token in zip(kept, bonus_tokens(p, generators).tolist(), strict=True)]


def walk_chains(trees: list[DraftTree], probs: torch.Tensor, generators: list[torch.Generator | None]
                ) -> tuple[list[int], torch.Tensor]:
    """accept_chains' walk -> (drafts kept per row, [B, V] on the device: the distribution each row's bonus token
    is drawn from, the residual after a rejected draft)."""
    rows, vocab, device = len(trees), probs.shape[-1], probs.device
    lengths = [len(tree.tokens) for tree in trees]
    depth = max(lengths) - 1
    kept, rejected = [0] * rows, []  # drafts kept per row; rows whose walk ended on a rejected draft
    if depth:
        drafted = list(chain.from_iterable(tree.tokens[1:] + [0] * (depth + 1 - len(tree.tokens)) for tree in trees))
        tokens = host_longs(drafted, rows, depth)  # [B, D] each row's drafts, 0 past its end
        p_x = probs[:, :depth].gather(-1, tokens.to(device)[..., None])[..., 0]  # [B, D] p at each draft's parent
        q_x = torch.ones_like(p_x)
        laws = [(row, j) for row, tree in enumerate(trees) for j in range(1, len(tree.tokens))
                if tree.draft_probs[j] is not None]
        if laws:
            at = host_longs([row for row, _ in laws]).to(device), host_longs([j - 1 for _, j in laws]).to(device)
            q_x[at] = torch.stack(
                [_law_at(trees[row].draft_probs[j], trees[row].tokens[j], device) for row, j in laws])
        p_x, q_x = torch.stack([p_x, q_x]).tolist()  # the one read
        walking = [row for row in range(rows) if lengths[row] > 1]
        for j in range(depth):
            going = []
            for row in walking:
                px, qx = p_x[row][j], q_x[row][j]
                if px >= qx or (px > 0 and float(torch.rand((), generator=generators[row])) < px / qx):
                    kept[row] = j + 1
                    if j + 2 < lengths[row]:
                        going.append(row)
                else:
                    rejected.append(row)
            walking = going
    p = probs[torch.arange(rows, device=device), host_longs(kept).to(device)]  # [B, V] at each last kept node
    if rejected:
        rejected.sort()
        index = host_longs(rejected).to(device)  # (indexing by a list of ints converts them one by one)
        if all(trees[row].draft_probs[kept[row] + 1] is None for row in rejected):  # point masses, in one op
            rejected_tokens = host_longs([trees[row].tokens[kept[row] + 1] for row in rejected]).to(device)
            drafts = torch.nn.functional.one_hot(rejected_tokens, vocab).float()
        else:
            drafts = torch.stack([_law(trees[row], kept[row] + 1, vocab, device) for row in rejected])
        before = p[index]
        rest = (before - drafts).clamp_min(0)
        total = rest.sum(-1, keepdim=True)
        p[index] = torch.where(total > 0, rest / total.clamp_min(1e-30), before)  # as accept_batch
    return kept, p


def bonus_tokens(p: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """A token per row from p [B, V] by inverse CDF, one uniform from each row's generator in row order -> [B]
    int64 on p's device (sent there without waiting for it: the host need not read them yet)."""
    uniforms = to_device(torch.tensor([float(torch.rand((), generator=gen)) for gen in generators],
                                      dtype=torch.float64), p.device)
    cdf = p.double().cumsum(-1)  # [B, V]
    bonus = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).clamp_max(p.shape[-1] - 1)
    return bonus[:, 0]


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
