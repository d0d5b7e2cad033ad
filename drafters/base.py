"""What every draft proposer implements, and the registry the CLI and API look names up in."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.engine.sampling import SamplingParams
from specdec.engine.tree import DraftTree


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
    propose(requests) and accepted(requests, ...) for the same batch, and finish(request_id) when it leaves
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

    def finish(self, request_id: int) -> None:  # noqa: B027
        """The request left; free what it held."""

    def forced_path(self, tree: DraftTree) -> list[int] | None:
        """Benchmarks only (drafters/synthetic.py): the nodes, root first, that the engine accepts instead of checking
        the drafts against the target. None, the default, leaves acceptance to the target."""
        return None


DRAFTERS: dict[str, Callable[..., Drafter]] = {}


def register(name: str):
    def wrap(factory):
        DRAFTERS[name] = factory
        return factory
    return wrap


def make_drafter(name: str, **kwargs) -> Drafter:
    """A drafter by registry name; a clear error lists the names when it is unknown."""
    if name not in DRAFTERS:
        raise ValueError(f"unknown drafter {name!r}; choose one of {sorted(DRAFTERS)}")
    return DRAFTERS[name](**kwargs)
