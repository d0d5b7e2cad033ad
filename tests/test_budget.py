"""Pools sized from a memory budget: the arithmetic matches the tensors actually allocated, and an engine whose
budget holds fewer states than requests still finishes everything (requests wait for a state)."""

from __future__ import annotations

import pytest
import torch

from drafters import NgramDrafter
from specdec.cache.budget import cache_for_budget, request_bytes, state_bytes
from specdec.engine.engine import Engine, EngineConfig
from specdec.models import load_model
from specdec.speculation import SamplingParams
from tests.tiny_models import qwen35_text_config, save_tiny


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen")
    save_tiny(qwen35_text_config(), directory, seed=61)
    return load_model(directory, device="cpu")


def test_budget_arithmetic_matches_the_allocated_pools(model):
    spec = model.cache_spec()
    budget = 8 * request_bytes(spec, 64, 4, torch.float32) + 3 * state_bytes(spec) + 100
    config = cache_for_budget(spec, budget, max_requests=8, max_seq_len=64, flush_length=4, dtype=torch.float32)
    assert config.state_slots == 3
    cache = model.make_cache(config)
    assert cache.nbytes() <= budget and cache.nbytes() > budget - state_bytes(spec)
    with pytest.raises(ValueError, match="lower max_batch or max_seq_len"):
        cache_for_budget(spec, 1000, max_requests=8, max_seq_len=64, flush_length=4, dtype=torch.float32)


def test_more_requests_than_states_all_finish(model):
    spec = model.cache_spec()
    budget = 4 * request_bytes(spec, 64, 4, torch.float32) + 1 * state_bytes(spec)
    config = cache_for_budget(spec, budget, max_requests=4, max_seq_len=64, flush_length=4, dtype=torch.float32)
    engine = Engine(model, NgramDrafter(), EngineConfig(cache=config, speculation="fixed"))
    requests = [engine.add_request(list(range(1, 2 + i)), SamplingParams(), 12) for i in range(6)]
    engine.run()
    assert all(len(r.output) == 12 for r in requests)
    assert engine.runner.cache.free_state_slots == 1
