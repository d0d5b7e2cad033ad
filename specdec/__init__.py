"""specdec: KVBuffer speculative decoding for hybrid linear-attention LLMs (Qwen3.5, Nemotron-3).

The package root names the public API but imports each name on first use (PEP 562). Two reasons: `specdec` holds
both the layers below the drafters (speculation, cache, models, runner) and the API above them (api imports
drafters/, which imports specdec.speculation), so a root that imported the API eagerly would run drafters/ half
initialised; and the command line (specdec.cli) must start without importing torch.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {  # public name -> the module that defines it
    "LLM": "specdec.api",
    "Output": "specdec.api",
    "generate": "specdec.api",
    "CacheConfig": "specdec.cache.spec",
    "KVBufferCache": "specdec.cache.model_cache",
    "StepBatch": "specdec.cache.step",
    "Engine": "specdec.engine.engine",
    "EngineConfig": "specdec.engine.engine",
    "SUPPORTED_MODEL_TYPES": "specdec.models.loading",
    "CheckpointError": "specdec.models.checkpoint",
    "load_model": "specdec.models.loading",
    "ModelRunner": "specdec.runner.model_runner",
    "SamplingParams": "specdec.speculation.sampling",
    "TreeShape": "specdec.speculation.tree",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'specdec' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
