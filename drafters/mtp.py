"""Qwen3.5's own multi-token-prediction layer drafts the tree (`--draft mtp`): the checkpoint's `mtp.*` tensors
(specdec/models/mtp.py), fed with the target's final hidden states, run by drafters/head.py."""

from __future__ import annotations

from specdec.cache.spec import CacheConfig
from specdec.models.base import HybridCausalLM
from specdec.models.mtp import Qwen35Mtp

from .base import register
from .head import HeadDrafter


@register("mtp")
class MtpDrafter(HeadDrafter):
    def __init__(self, target: HybridCausalLM, cache: CacheConfig):
        super().__init__(Qwen35Mtp(target), cache, target_features=())
