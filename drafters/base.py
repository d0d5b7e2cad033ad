"""What every draft proposer implements, and the part of a request it sees.

Under tensor parallelism (specdec/parallel) every drafter is replicated: each rank holds the whole draft model, MTP
layer or EAGLE-3 head and drafts by itself. Its inputs are the same on every rank (the tokens; the target's features,
which the sharded target ends with an all-reduce, so they agree bit for bit), it runs the same kernels on the same
kind of device, and sampled drafts draw from generators seeded alike, so every rank drafts the same trees without a
word exchanged. The alternatives cost more: rank 0 drafting and broadcasting its trees adds a broadcast to every
step while the other ranks wait instead of drafting (no time saved); a sharded drafter adds an all-reduce per
layer to every draft depth, latency that outweighs the matmuls of a model this small. The price is the drafter's
weights on every GPU (a tenth of the target's or less). MTP and EAGLE-3 heads share the target's vocabulary-parallel
embedding (MTP its LM head too): every rank calls them in the same order, so their collectives pair up.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from specdec.speculation import DraftTree, SamplingParams, TreeShape


@dataclass
class DraftRequest:
    """The part of a request a drafter sees: its id, all its tokens so far (prompt + emitted; the last one is the
    root of the next tree), how it samples, and its generator."""

    request_id: int
    tokens: list[int]
    params: SamplingParams
    generator: torch.Generator | None


class Drafter(ABC):
    supports_dynamic_trees = False  # drafters that score their drafts (MTP, EAGLE-3 heads) draft dynamic trees

    """Proposes a token tree per request. Lifecycle: start(request) when a request joins, then every step
    propose(requests) and accepted(requests, ...) for the same batch, or skipped(requests, ...) for requests verified
    without drafts (both in one step for different requests), and finish(request_id) when it leaves
    (also on abort). A drafter with target_features set gets the target's features of the prompt in start and of
    the verified trees' nodes in accepted (others get None): its final hidden states (after the last norm) for
    target_features = () (MTP), the outputs of those decoder layers concatenated for layer ids (EAGLE-3)."""

    target_features: tuple[int, ...] | None = None

    def check_shape(self, shape: TreeShape) -> None:  # noqa: B027 - most drafters take any shape
        """Raise a ValueError naming the fix if this drafter cannot draft trees of `shape` (the engine asks once,
        before any work)."""

    def start(self, request: DraftRequest,  # noqa: B027 - stateless drafters need no set-up
              target_hidden: torch.Tensor | None = None) -> None:
        """A request joins (its prompt is request.tokens[:-1], its first emitted token request.tokens[-1]);
        target_hidden: [len(prompt), F] (target_features)."""

    @abstractmethod
    def propose(self, requests: list[DraftRequest], shape: TreeShape) -> list[DraftTree]:
        """One tree per request; node 0 is the request's last token."""

    def accepted(self, requests: list[DraftRequest], trees: list[DraftTree],  # noqa: B027
                 results: list[tuple[list[int], int]], target_hidden: torch.Tensor | None = None) -> None:
        """For the batch of the last propose: the target accepted, per request, tree nodes `path` (root first) and
        emitted a bonus token after them (results[i] = (path, bonus)); target_hidden: [B, T, F] of the trees'
        nodes (target_features)."""

    def skipped(self, requests: list[DraftRequest], roots: list[int],  # noqa: B027 - stateless drafters
                target_hidden: torch.Tensor | None = None) -> None:
        """The target verified these requests' roots alone, without asking for drafts (adaptive speculation), and
        emitted a token after each: roots[i] is the token scored, request.tokens[-1] the new root; target_hidden:
        [B, F] the roots' features (target_features). A drafter whose cache follows the request takes the roots
        as pending tokens, scored with its next proposal."""

    def shadow_drafts(self, requests: list[DraftRequest]) -> list[int | None] | None:
        """Each request's first draft from its tokens so far, made while it decodes without drafting (adaptive
        speculation's plain steps: the engine checks it against the token the step emits, Acceptance.shadow_kept,
        so the policy sees a collapsed request recover without a drafting step), None for a request with none; or
        None: this drafter's drafts cost a forward (a model, a head), so it drafts no shadows."""
        return None

    def backlog(self, request_ids: list[int]) -> int:
        """Tokens this drafter must read for these requests before its next proposal, in a forward of their own
        (its catch-up: adaptive speculation prices a drafting step with it; one call a step, not one a request). 0
        for drafters that read nothing first, or that score their few pending rows in front of the tree (the
        heads)."""
        return 0

    def finish(self, request_id: int) -> None:  # noqa: B027
        """The request left; free what it held."""
