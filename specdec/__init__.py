"""specdec: KVBuffer speculative decoding for hybrid linear-attention LLMs (Qwen3.5, Nemotron-3)."""

from .cache import CacheConfig, KVBufferCache, StepBatch
from .models import SUPPORTED_MODEL_TYPES, CheckpointError, load_model
from .runner import ModelRunner

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "SUPPORTED_MODEL_TYPES",
    "Output",
    "generate",
    "CacheConfig",
    "CheckpointError",
    "KVBufferCache",
    "ModelRunner",
    "StepBatch",
    "load_model",
]


def __getattr__(name: str):
    """LLM, Output and generate come from specdec.api, imported on first use: the drafters package imports the
    engine, and the API imports the drafters."""
    if name in ("LLM", "Output", "generate"):
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")
