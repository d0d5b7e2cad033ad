"""Load: 200 requests of random lengths through the continuous-batching engine on CPU all finish, each equals its
one-at-a-time output, and no request slot, committed state or buffer entry is left behind."""

from __future__ import annotations

import torch

from drafters import NgramDrafter
from specdec.cache.spec import CacheConfig
from specdec.engine.engine import Engine, EngineConfig
from specdec.models import load_model
from specdec.speculation import SamplingParams, TreeShape
from tests.tiny_models import qwen35_text_config, save_tiny

REQUESTS = 200


def test_two_hundred_requests(tmp_path):
    save_tiny(qwen35_text_config(), tmp_path, seed=31)
    model = load_model(tmp_path, device="cpu")
    gen = torch.Generator().manual_seed(0)
    pattern = torch.randint(0, 90, (5,), generator=gen).tolist()
    work = []
    for _ in range(REQUESTS):
        length = int(torch.randint(1, 24, (1,), generator=gen))
        prompt = (pattern * 5 + torch.randint(0, 90, (24,), generator=gen).tolist())[-length:]
        work.append((prompt, int(torch.randint(1, 12, (1,), generator=gen))))

    config = EngineConfig(cache=CacheConfig(max_requests=8, max_seq_len=64, flush_length=4, num_state_slots=6),
                          shape=TreeShape(steps=3), speculation="fixed")
    engine = Engine(model, NgramDrafter(), config)
    requests = [engine.add_request(prompt, SamplingParams(), new) for prompt, new in work]
    engine.run()
    cache = engine.runner.cache
    assert all(r.finished for r in requests)
    assert cache.free_request_slots == 8 and cache.free_state_slots == 6, "a slot leaked"
    assert all(r.slot is None for r in requests)

    alone = Engine(model, None, EngineConfig(cache=CacheConfig(max_requests=1, max_seq_len=64, flush_length=4)))
    for request, (prompt, new) in zip(requests, work, strict=True):
        solo = alone.add_request(prompt, SamplingParams(), new)
        alone.run()
        assert request.output == solo.output
        assert len(request.output) == new
