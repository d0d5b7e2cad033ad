"""Drafters by name, as `--draft` and `LLM(draft=...)` give them:

    none | ngram | mtp | eagle3 | eagle3:PATH | small | a model alias, hub id or directory

Each kind has a factory that builds its drafter for a loaded target (imports deferred to the factory, so naming a
drafter loads only what it needs); anything that is not a kind's name is a draft model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from specdec.cache.spec import CacheConfig
from specdec.models.base import HybridCausalLM
from specdec.speculation import TreeShape

from .base import Drafter


@dataclass(frozen=True)
class DraftContext:
    """What a factory may need: the loaded target (and the name it was asked for, for the presets that pair
    drafts with targets), its tokenizer, the target cache's request slots and lengths (a drafter's own cache
    matches them), the tree shape, the draft model's flush length, device, dtype and CUDA graphs."""

    target: HybridCausalLM
    target_name: str
    target_tokenizer: object | None
    cache: CacheConfig
    shape: TreeShape = TreeShape()
    flush_length: int = 16
    device: str | torch.device | None = None
    dtype: str | torch.dtype | None = None
    cuda_graphs: bool = True

    def head_cache(self) -> CacheConfig:
        """A head drafter's attention-only cache: the target's request slots and lengths."""
        return CacheConfig(max_requests=self.cache.max_requests, max_seq_len=self.cache.max_seq_len)


def _ngram(context: DraftContext, argument: str | None) -> Drafter:
    from .ngram import NgramDrafter

    return NgramDrafter()


def _mtp(context: DraftContext, argument: str | None) -> Drafter:
    from .mtp import MtpDrafter

    return MtpDrafter(context.target, context.head_cache())


def _eagle3(context: DraftContext, argument: str | None) -> Drafter:
    from specdec.models.checkpoint import resolve_checkpoint
    from specdec.presets import eagle3_head_for

    from .eagle3 import Eagle3Drafter

    path = resolve_checkpoint(argument or eagle3_head_for(context.target_name))
    return Eagle3Drafter(context.target, path, context.head_cache())


def _model(context: DraftContext, argument: str | None) -> Drafter:
    from specdec.models import load_model
    from specdec.models.checkpoint import resolve_checkpoint
    from specdec.models.tokenizer import load_tokenizer
    from specdec.presets import resolve, small_draft_for

    from .draft_model import DraftModelDrafter, check_same_vocabulary

    path = resolve_checkpoint(small_draft_for(context.target_name) if argument == "small" else resolve(argument))
    model = load_model(path, device=context.device, dtype=context.dtype)
    check_same_vocabulary(context.target, context.target_tokenizer, model, load_tokenizer(path))
    cache = CacheConfig(max_requests=context.cache.max_requests, max_seq_len=context.cache.max_seq_len,
                        flush_length=context.flush_length)
    return DraftModelDrafter(model, cache, context.shape, context.cuda_graphs)


DRAFTERS: dict[str, Callable[[DraftContext, str | None], Drafter]] = {
    "ngram": _ngram,   # prompt lookup, no model
    "mtp": _mtp,       # the target's own multi-token-prediction layer
    "eagle3": _eagle3,  # an EAGLE-3 head: the one configs/models.json lists for the target, or eagle3:PATH
    "model": _model,   # a draft model of the target's family: `small` or an alias, hub id or directory
}


def parse_draft(draft: str) -> tuple[str, str | None]:
    """`--draft` -> (kind, its argument): ngram / mtp / eagle3 take none (eagle3:PATH a path); anything else is a
    draft model (`small` included)."""
    kind, colon, argument = draft.partition(":")
    if kind in ("ngram", "mtp") and not colon:
        return kind, None
    if kind == "eagle3":
        if colon and not argument:
            raise ValueError("--draft eagle3:PATH needs a path or hub id after the colon (or plain 'eagle3')")
        return "eagle3", argument or None
    return "model", draft


def make_drafter(draft: str, context: DraftContext) -> Drafter:
    """The drafter `draft` names, built for the context's target."""
    kind, argument = parse_draft(draft)
    return DRAFTERS[kind](context, argument)
