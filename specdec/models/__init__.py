"""Our PyTorch runtimes for Qwen3.5 (dense, MoE) and Nemotron-H, and the checkpoint loader."""

from .base import HybridCausalLM
from .checkpoint import CheckpointError
from .loading import SUPPORTED_MODEL_TYPES, load_model
from .nemotron_h import NemotronHForCausalLM
from .qwen3_5 import Qwen35ForCausalLM

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "CheckpointError",
    "HybridCausalLM",
    "NemotronHForCausalLM",
    "Qwen35ForCausalLM",
    "load_model",
]
