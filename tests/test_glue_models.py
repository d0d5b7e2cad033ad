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
    config = EngineConfig(cache=CacheConfig(max_requests=2, max_seq_len=64, flush_length=4), shape=TreeShape(steps=3))
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
