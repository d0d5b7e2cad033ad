"""Runs a model on its KVBuffer cache, eagerly or from CUDA graphs: the one interface the engine and the drafters
call (score a step, commit it, prefill, decode)."""

from .model_runner import ModelRunner

__all__ = ["ModelRunner"]
