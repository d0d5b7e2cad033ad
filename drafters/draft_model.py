"""A smaller model of the target's family drafts the tree, run by the same runtime on its own KVBuffer cache.

Nothing is ever rolled back. Each drafting level scores the request's whole tree so far as one token tree (the
KVBuffer verify of the draft model), without committing; only after the target has accepted a path does the
draft cache commit the accepted nodes it has scored. Its last level's leaves were never scored by the draft
model: if the target accepts one, that token waits in `pending` and is scored at the front of the next tree.
"""

from __future__ import annotations

import torch

from specdec.cache.spec import CacheConfig
from specdec.cache.step import StepBatch
from specdec.models.base import HybridCausalLM
from specdec.runner import ModelRunner
from specdec.speculation import DraftTree, TreeShape
from specdec.speculation.sampling import target_distribution

from .base import Drafter, DraftRequest


class DraftModelDrafter(Drafter):
    """shape: the trees it will be asked for; on a GPU (cuda_graphs) its drafting steps up to that shape's widest
    replay from CUDA graphs (runner.graph_note says why not otherwise), wider ones run eagerly."""

    def __init__(self, model: HybridCausalLM, cache: CacheConfig, shape: TreeShape = TreeShape(),
                 cuda_graphs: bool = True):
        self.model = model
        # the widest drafting step: an accepted leaf still pending, the root, the whole draft budget
        self.runner = ModelRunner.create(model, cache, step_width=shape.budget + 2, cuda_graphs=cuda_graphs)
        self.slots: dict[int, int] = {}
        self.pending: dict[int, list[int]] = {}
        self.unread_prompts: set[int] = set()  # requests whose prompt is still pending (start)
        self._last: tuple[object, list[int]] | None = None  # (step context, scored tree nodes per row)

    def start(self, request: DraftRequest, target_hidden=None) -> None:
        """A cache slot for the request, its prompt pending: the draft model reads it in the first step that drafts
        (_catch_up, one forward for every row starting then), so a request that never drafts (adaptive
        speculation's collapsed rows) never costs a draft prefill. The first emitted token (request.tokens[-1]) is
        the root of the first tree."""
        self.slots[request.request_id] = self.runner.cache.allocate_request()
        self.pending[request.request_id] = list(request.tokens[:-1])
        self.unread_prompts.add(request.request_id)

    def finish(self, request_id: int) -> None:
        slot = self.slots.pop(request_id, None)
        if slot is not None:
            self.runner.cache.release_request(slot)
        self.pending.pop(request_id, None)
        self.unread_prompts.discard(request_id)

    def backlog(self, request_ids: list[int]) -> int:
        """The tokens _catch_up reads first: unread prompts, the roots of the steps sat out (one pending token, an
        accepted leaf, is scored in front of the tree instead)."""
        counts = (len(self.pending.get(request_id, ())) for request_id in request_ids)
        return sum(count for count in counts if count > 1)

    def propose(self, requests: list[DraftRequest], shape: TreeShape) -> list[DraftTree]:
        """Level by level: score every tree so far (pending tokens in front), then give each newest node its
        `topk` most likely children (greedy requests) or `topk` children sampled without replacement."""
        self._catch_up(requests)
        trees = [DraftTree([r.tokens[-1]], [-1]) for r in requests]
        frontiers = [[0] for _ in requests]
        for _ in range(shape.steps):
            if not any(frontiers):
                break
            logits, ctx = self._score(requests, trees)
            top = logits.topk(shape.topk, dim=-1).indices.tolist()  # [B, T, topk]: all greedy drafting needs
            scored = [len(tree) for tree in trees]
            for row, (request, tree) in enumerate(zip(requests, trees, strict=True)):
                offset = len(self.pending[request.request_id])
                added = expand_level(tree, frontiers[row], logits[row, offset:], top[row][offset:], shape, request)
                frontiers[row] = [child for _, child in added]
            self._last = (ctx, scored)
        return trees

    def accepted(self, requests: list[DraftRequest], trees: list[DraftTree], results, target_hidden=None) -> None:
        """Commit, per request, its pending tokens and the accepted nodes the draft model scored."""
        ctx, scored = self._last
        rows = []
        for row, (request, (path, _bonus)) in enumerate(zip(requests, results, strict=True)):
            pending = self.pending[request.request_id]
            kept = [j for j in path if j < scored[row]]
            rows.append(list(range(len(pending))) + [len(pending) + j for j in kept])
            # an accepted leaf was never scored by the draft model: it goes first next time, then the bonus root
            self.pending[request.request_id] = [trees[row].tokens[j] for j in path if j >= scored[row]]
        width = max(len(r) for r in rows)
        accepted = torch.tensor([r + [-1] * (width - len(r)) for r in rows])
        self.runner.commit(ctx, accepted, torch.tensor([len(r) for r in rows]))
        self._last = None

    def _catch_up(self, requests: list[DraftRequest]) -> None:
        """Commit, in one forward, the pending tokens of rows that hold more than one (a new request's prompt, and
        the roots of steps in which they did not draft: adaptive speculation's plain steps). Left pending, they would
        be scored again in front of every level of the tree (4 times for a 4-chain: on the CPU, where a forward costs
        its tokens, the shipped draft model's adaptive runs were 0.83x plain decoding with 88% plain steps), and would
        widen every level past the width its CUDA graphs were captured at (one pending token: an accepted leaf)."""
        rows = [r for r in requests if len(self.pending[r.request_id]) > 1]
        # a prompt alone in its forward (as a prefill at start would be: not padding the others' few roots to its
        # length), the rows' runs of roots together
        prompts = [r for r in rows if r.request_id in self.unread_prompts]
        roots = [r for r in rows if r.request_id not in self.unread_prompts]
        for group in [[r] for r in prompts] + ([roots] if roots else []):
            self.runner.prefill([self.slots[r.request_id] for r in group], [self.pending[r.request_id] for r in group])
        for request in rows:
            self.pending[request.request_id] = []
        self.unread_prompts.difference_update(r.request_id for r in requests)

    def skipped(self, requests: list[DraftRequest], roots: list[int], target_hidden=None) -> None:
        """The roots were never scored by the draft model: they wait in `pending`, in front of the next tree."""
        for request, root in zip(requests, roots, strict=True):
            self.pending[request.request_id].append(root)

    def _score(self, requests: list[DraftRequest], trees: list[DraftTree]):
        """Score pending tokens + tree per request as one token tree each; -> logits [B, T, V] (on the draft's
        device), context."""
        tokens, parents = [], []
        for request, tree in zip(requests, trees, strict=True):
            pending = self.pending[request.request_id]
            chain = list(range(-1, len(pending) - 1))
            root_parent = len(pending) - 1
            tokens.append(pending + tree.tokens)
            parents.append(chain + [root_parent if p < 0 else p + len(pending) for p in tree.parents])
        batch = StepBatch.trees([self.slots[r.request_id] for r in requests], tokens, parents)
        return self.runner.score_logits(batch)


def expand_level(tree: DraftTree, frontier: list[int], logits: torch.Tensor, top: list[list[int]], shape: TreeShape,
                 request: DraftRequest) -> list[tuple[int, int]]:
    """One level of a static tree: each frontier node gets shape.topk children while the budget lasts.
    logits [T, V] and top (their top-k ids, on the host) are indexed by tree node. -> (parent, child) per child."""
    added = []
    for node in frontier:
        room = shape.budget + 1 - len(tree)
        if room <= 0:
            break
        count = min(shape.topk, room)
        for token, law in children_of(logits[node], top[node][:count], count, request):
            tree.tokens.append(token)
            tree.parents.append(node)
            tree.draft_probs.append(law)
            added.append((node, len(tree) - 1))
    return added


def children_of(logits: torch.Tensor, top: list[int], count: int, request: DraftRequest) -> list[tuple[int, object]]:
    """A node's `count` children from the drafter's logits [V] at it: for greedy requests its most likely tokens
    (`top`, already on the host) as point masses; else draws without replacement (sample_children)."""
    if request.params.greedy:
        return [(token, None) for token in top[:count]]
    return sample_children(logits, count, request)


def sample_children(logits: torch.Tensor, count: int, request: DraftRequest) -> list[tuple[int, torch.Tensor]]:
    """`count` draws without replacement from the draft distribution (the request's temperature / top-k /
    top-p), each with the law it was drawn from (that distribution without the tokens drawn before it). The laws
    stay on the draft's device; each draw is an inverse CDF with a uniform from the request's generator."""
    children, law = [], target_distribution(logits, request.params)
    for _ in range(count):
        cdf = law.double().cumsum(0)
        u = float(torch.rand((), generator=request.generator))
        token = torch.searchsorted(cdf, u * cdf[-1:], right=True).clamp_max(law.shape[0] - 1)
        token, total = torch.cat([token.double(), cdf[-1:]]).tolist()
        if total <= 0:
            break
        law = law / total
        children.append((int(token), law))
        law = law.clone()
        law[int(token)] = 0
    return children


def check_same_vocabulary(target, target_tokenizer, draft, draft_tokenizer) -> None:
    """A draft must speak the target's tokens: same vocabulary size, and the same tokenizer when both ship one."""
    if draft.hf_config.vocab_size != target.hf_config.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary ({draft.hf_config.vocab_size} tokens) differs from the target's "
            f"({target.hf_config.vocab_size}); use a draft of the same family (e.g. draft='small') or 'ngram'"
        )
    if target_tokenizer is not None and draft_tokenizer is not None and \
            target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise ValueError("the draft model's tokenizer differs from the target's; use a draft of the same family")
