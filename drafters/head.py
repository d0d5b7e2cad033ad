"""A draft head fed with the target's features drafts the tree on its own attention-only KVBuffer cache: Qwen3.5's
MTP layer (drafters/mtp.py) and EAGLE-3 heads (drafters/eagle3.py).

A head row pairs a hidden input for position p - 1 with the token at p: head.project(the target's features of
p - 1), or, for a draft node, the output of its parent's row. The root row pairs the target's features of the last
scored position with the newest token. Only rows built from target features are ever committed: after the target
accepts a path, the accepted drafts wait as pending rows with the target's features of their parents and are scored
at the front of the next tree (SGLang's "draft extend"), so the head's cache always holds what the target computed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specdec.cache.spec import CacheConfig
from specdec.cache.step import StepBatch
from specdec.speculation import DraftTree, TreeShape

from .base import Drafter, DraftRequest
from .draft_model import expand_level
from .dynamic_tree import best_nodes, prune

MAX_DRAFT_ROWS = 512  # rows of one drafting step past a request's committed ones


@dataclass
class _Rows:
    """A request's rows waiting for the head's cache: tokens and the hidden inputs paired with them ([n, D])."""

    tokens: list[int]
    hidden: torch.Tensor
    root_hidden: torch.Tensor  # [D]: paired with the tree's root (the newest token)


class HeadDrafter(Drafter):
    """head: forward(tokens, hidden_in, ctx, cache) -> out, project(target features) -> hidden_in,
    compute_logits(out) -> [.., V], make_cache; target_features: which target features it reads."""

    supports_dynamic_trees = True

    def __init__(self, head, cache: CacheConfig, target_features: tuple[int, ...]):
        self.head = head
        self.target_features = target_features
        # a drafting step holds pending rows and a whole expanded tree beyond the request's tokens
        self.cache = head.make_cache(replace(cache, max_seq_len=cache.max_seq_len + MAX_DRAFT_ROWS))
        self.slots: dict[int, int] = {}
        self.rows: dict[int, _Rows] = {}
        self._last = None  # (step context, pending rows per request) of the last proposal

    @torch.inference_mode()
    def start(self, request: DraftRequest, target_hidden: torch.Tensor | None = None) -> None:
        """target_hidden: [n, F] the target's features of the prompt's n tokens."""
        slot = self.cache.allocate_request()
        self.slots[request.request_id] = slot
        prompt = request.tokens[:-1]
        hidden = self.head.project(target_hidden)
        # rows (h_t, x_{t+1}) for t < n - 1, committed now; h_{n-1} goes with the root, the first emitted token
        if len(prompt) > 1:
            batch = StepBatch.chains([slot], [prompt[1:]], prefill=True)
            ctx = self.cache.begin_step(batch)
            self.head(batch.tokens.to(self.cache.device), hidden[None, :-1], ctx, self.cache)
            self.cache.commit_all(ctx)
        self.rows[request.request_id] = _Rows([], hidden[:0], hidden[-1])

    def check_shape(self, shape: TreeShape) -> None:
        expanded = shape.topk + (shape.steps - 1) * shape.topk**2 if shape.dynamic else shape.budget
        if shape.budget + 1 + expanded > MAX_DRAFT_ROWS:  # pending rows (<= budget), the root, the drafts
            raise ValueError(f"{shape.steps} steps of top-{shape.topk} draft {expanded} nodes per step, more than "
                             f"this drafter's {MAX_DRAFT_ROWS} rows hold: lower --num-steps or --topk")

    def finish(self, request_id: int) -> None:
        slot = self.slots.pop(request_id, None)
        if slot is not None:
            self.cache.release_request(slot)
        self.rows.pop(request_id, None)

    @torch.inference_mode()
    def propose(self, requests: list[DraftRequest], shape: TreeShape) -> list[DraftTree]:
        """Level by level, as the draft model does: score pending rows + the tree so far, give each newest node
        its `topk` children; a child's row takes the output of its parent's row as its hidden state."""
        if shape.dynamic:
            return self._propose_dynamic(requests, shape)
        trees = [DraftTree([r.tokens[-1]], [-1]) for r in requests]
        node_hidden = [[self.rows[r.request_id].root_hidden] for r in requests]  # per tree node: its row's hidden
        frontiers = [[0] for _ in requests]
        for _ in range(shape.steps):
            if not any(frontiers):
                break
            out, ctx = self._score(requests, trees, node_hidden)
            logits = self.head.compute_logits(out)
            top = logits.topk(shape.topk, dim=-1).indices.tolist()
            for row, (request, tree) in enumerate(zip(requests, trees, strict=True)):
                offset = len(self.rows[request.request_id].tokens)
                added = expand_level(tree, frontiers[row], logits[row, offset:], top[row][offset:], shape, request)
                node_hidden[row] += [out[row, offset + parent] for parent, _ in added]
                frontiers[row] = [child for _, child in added]
            self._last = ctx
        return trees

    def _propose_dynamic(self, requests: list[DraftRequest], shape: TreeShape) -> list[DraftTree]:
        """EAGLE-2: every level, the `topk` newest nodes of highest cumulative log-probability each get their
        `topk` most likely children; at the end the shape.budget best nodes are kept (dynamic_tree.best_nodes).
        Children are point masses (deterministic candidates), which the acceptance walk handles for sampling too."""
        trees = [DraftTree([r.tokens[-1]], [-1]) for r in requests]
        node_hidden = [[self.rows[r.request_id].root_hidden] for r in requests]
        scores = [[0.0] for _ in requests]  # cumulative draft log-probability per node
        frontiers = [[0] for _ in requests]
        for _ in range(shape.steps):
            out, ctx = self._score(requests, trees, node_hidden)
            logprobs = torch.log_softmax(self.head.compute_logits(out), dim=-1)
            values, tokens = (t.tolist() for t in logprobs.topk(shape.topk, dim=-1))
            for row, request in enumerate(requests):
                offset, tree = len(self.rows[request.request_id].tokens), trees[row]
                new = []
                for node in frontiers[row]:
                    for value, token in zip(values[row][offset + node], tokens[row][offset + node], strict=True):
                        tree.tokens.append(token)
                        tree.parents.append(node)
                        tree.draft_probs.append(None)
                        node_hidden[row].append(out[row, offset + node])
                        scores[row].append(scores[row][node] + value)
                        new.append(len(tree) - 1)
                frontiers[row] = sorted(new, key=lambda j: -scores[row][j])[:shape.topk]
            self._last = ctx
        return [prune(tree, best_nodes(score, shape.budget)) for tree, score in zip(trees, scores, strict=True)]

    @torch.inference_mode()
    def accepted(self, requests: list[DraftRequest], trees: list[DraftTree], results,
                 target_hidden: torch.Tensor | None = None) -> None:
        """Commit each request's pending rows and root row (built from target features); the accepted drafts
        become pending rows paired with the target's features of their parents. target_hidden: [B, T, F] the
        target's features of the verified trees' nodes."""
        ctx, keep = self._last, []
        for row, (request, (path, _bonus)) in enumerate(zip(requests, results, strict=True)):
            rows = self.rows[request.request_id]
            keep.append(len(rows.tokens) + 1)
            hidden = self.head.project(target_hidden[row])
            self.rows[request.request_id] = _Rows([trees[row].tokens[j] for j in path[1:]],
                                                  hidden[path[:-1]], hidden[path[-1]])
        width = max(keep)
        accepted = torch.tensor([list(range(n)) + [-1] * (width - n) for n in keep])
        self.cache.commit(ctx, accepted, torch.tensor(keep))
        self._last = None

    @torch.inference_mode()
    def skipped(self, requests: list[DraftRequest], roots: list[int],
                target_hidden: torch.Tensor | None = None) -> None:
        """Each root row (its hidden input built from target features) waits as a pending row; the new root pairs
        with the target's features of the old one. target_hidden: [B, F]."""
        hidden = self.head.project(target_hidden)
        for row, (request, root) in enumerate(zip(requests, roots, strict=True)):
            rows = self.rows[request.request_id]
            pending = torch.cat([rows.hidden, rows.root_hidden[None]])
            self.rows[request.request_id] = _Rows(rows.tokens + [root], pending, hidden[row])

    def _score(self, requests: list[DraftRequest], trees: list[DraftTree], node_hidden):
        """Pending rows + tree per request as one token tree each; -> (outputs [B, T, D], context)."""
        tokens, parents, hidden = [], [], []
        for request, tree, nodes in zip(requests, trees, node_hidden, strict=True):
            rows = self.rows[request.request_id]
            chain = list(range(-1, len(rows.tokens) - 1))
            tokens.append(rows.tokens + tree.tokens)
            parents.append(chain + [len(rows.tokens) - 1 if p < 0 else p + len(rows.tokens) for p in tree.parents])
            hidden.append(torch.cat([rows.hidden, torch.stack(nodes)]))
        batch = StepBatch.trees([self.slots[r.request_id] for r in requests], tokens, parents)
        hidden_in = torch.zeros(len(requests), batch.tokens.shape[1], hidden[0].shape[-1],
                                dtype=hidden[0].dtype, device=self.cache.device)
        for row, rows in enumerate(hidden):
            hidden_in[row, :rows.shape[0]] = rows
        ctx = self.cache.begin_step(batch)
        return self.head(batch.tokens.to(self.cache.device), hidden_in, ctx, self.cache), ctx
