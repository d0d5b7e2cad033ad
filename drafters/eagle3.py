"""An EAGLE-3 head drafts the tree (`--draft eagle3:PATH`): a SpecForge / EAGLE-3 checkpoint
(specdec/models/eagle3.py) fed with the outputs of three of the target's layers, run by drafters/head.py."""

from __future__ import annotations

from pathlib import Path

from specdec.cache.spec import CacheConfig
from specdec.models.base import HybridCausalLM
from specdec.models.eagle3 import load_eagle3

from .head import HeadDrafter


class Eagle3Drafter(HeadDrafter):
    def __init__(self, target: HybridCausalLM, path: str | Path, cache: CacheConfig):
        head, layers = load_eagle3(path, target)
        super().__init__(head, cache, target_features=layers)
