"""The target's own multi-token-prediction layer drafts the tree (`--draft mtp`): the checkpoint's `mtp.*` tensors
(Qwen3.5: specdec/models/mtp.py; Nemotron-3: specdec/models/nemotron_mtp.py), fed with the target's final hidden
states, run by drafters/head.py."""

from __future__ import annotations

from specdec.cache.spec import CacheConfig
from specdec.models.base import HybridCausalLM
from specdec.models.mtp import Qwen35Mtp
from specdec.models.nemotron_h import NemotronHForCausalLM
from specdec.models.nemotron_mtp import NemotronHMtp

from .head import HeadDrafter


class MtpDrafter(HeadDrafter):
    def __init__(self, target: HybridCausalLM, cache: CacheConfig):
        head = NemotronHMtp(target) if isinstance(target, NemotronHForCausalLM) else Qwen35Mtp(target)
        super().__init__(head, cache, target_features=())
