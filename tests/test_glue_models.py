"""The models on the glue kernels (verify_kernels/glue, SPECDEC_BACKEND=triton: Triton's interpreter here, natively
on a GPU) against the same models on the torch references, through the engine: speculative greedy tokens (prefill,
token trees, commits) must not change. Tiny fp32 models (head dims of 8, so the linear mixers stay on their
references and the run is short); tests/test_triton_backend.py runs every kernel together at head dims of 16,
plain decoding included."""

from __future__ import annotations

import pytest
import torch

from drafters import NgramDrafter
from specdec.cache.spec import CacheConfig
from specdec.engine.engine import Engine, EngineConfig
from specdec.models import load_model
from specdec.speculation import SamplingParams, TreeShape
from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny

NEW_TOKENS = 8
PROMPTS = [[5, 6, 7, 5, 6, 7, 5, 6], [40, 2, 77]]  # a repeating one, so the n-gram drafter gets tokens accepted


def generate(model, monkeypatch, backend: str) -> list[list[int]]:
    monkeypatch.setenv("SPECDEC_BACKEND", backend)
    config = EngineConfig(cache=CacheConfig(max_requests=2, max_seq_len=64, flush_length=4), shape=TreeShape(steps=3),
                          speculation="fixed")
    engine = Engine(model, NgramDrafter(), config)
    requests = [engine.add_request(prompt, SamplingParams(), NEW_TOKENS) for prompt in PROMPTS]
    engine.run()
    return [request.output for request in requests]


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_greedy_tokens_unchanged_on_the_glue_kernels(family, tmp_path, monkeypatch):
    config = qwen35_text_config() if family == "qwen3_5" else nemotron_h_config()
    save_tiny(config, tmp_path, seed=13)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(tmp_path, device=device, dtype=torch.float32)
    reference = generate(model, monkeypatch, "reference")
    kernels = generate(model, monkeypatch, "triton")
    assert kernels == reference, "greedy tokens changed on the glue kernels"
    assert all(len(tokens) == NEW_TOKENS for tokens in kernels)


def test_modules_with_gradients_run_the_references(monkeypatch):
    """The kernels have no backward: a head trained with these modules (EAGLE-3) gets the references' gradients
    even where the kernels are the backend."""
    from specdec.models.layers import GatedMLP, OffsetRMSNorm

    monkeypatch.setenv("SPECDEC_BACKEND", "triton")
    torch.manual_seed(0)
    norm, mlp = OffsetRMSNorm(16, 1e-6), GatedMLP(16, 24, "silu")
    x, residual = torch.randn(3, 16), torch.randn(3, 16)
    out, total = norm(x, residual)
    mlp(out).square().sum().backward()
    assert norm.weight.grad is not None and mlp.gate_proj.weight.grad is not None
    assert torch.equal(total, x + residual)
