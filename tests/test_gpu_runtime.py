"""The same runtime on a CUDA device: fp32 parity with transformers, and bf16 (the GPU default) no less accurate
than transformers' own bf16 run.
Skipped without a GPU; the CPU tests cover the same code paths through the torch references."""

from __future__ import annotations

import copy

import pytest
import torch

from specdec import CacheConfig, ModelRunner, load_model
from specdec.engine.engine import Engine, EngineConfig
from specdec.speculation import SamplingParams
from tests.tiny_models import VOCAB, nemotron_h_config, qwen35_text_config, save_tiny

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

# two hand-made prompts and two random ones (48 tokens) so that the bf16 comparison averages over many positions
PROMPTS = [[4, 8, 15, 16, 23, 42], list(range(3, 60, 2)),
           *torch.randint(1, VOCAB, (2, 48), generator=torch.Generator().manual_seed(0)).tolist()]
NEW_TOKENS = 16
# head dims of 16, the smallest the Triton kernels take, so that the GPU runs them (8 would fall back)
QWEN_DIMS = dict(linear_key_head_dim=16, linear_value_head_dim=16)
MODELS = {
    "qwen3_5": lambda: qwen35_text_config(value_heads_per_key=2, **QWEN_DIMS),
    "qwen3_5_moe": lambda: qwen35_text_config(value_heads_per_key=2, moe=True, **QWEN_DIMS),
    "nemotron_h": lambda: nemotron_h_config(heads_per_group=2, mamba_head_dim=16, ssm_state_size=16),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def checkpoint(request, tmp_path_factory):
    directory = tmp_path_factory.mktemp(request.param)
    hf_model = save_tiny(MODELS[request.param](), directory, seed=5).to("cuda")
    with torch.no_grad():
        reference = [hf_model(torch.tensor([prompt], device="cuda")).logits[0].float().cpu() for prompt in PROMPTS]
        greedy = [
            hf_model.generate(torch.tensor([prompt], device="cuda"), max_new_tokens=NEW_TOKENS, do_sample=False,
                              pad_token_id=0, eos_token_id=None)[0, len(prompt):].tolist()
            for prompt in PROMPTS
        ]
        hf_bf16 = copy.deepcopy(hf_model).to(torch.bfloat16)
        reference_bf16 = [hf_bf16(torch.tensor([prompt], device="cuda")).logits[0].float().cpu() for prompt in PROMPTS]
    return directory, reference, greedy, reference_bf16


def prefill_logits(model, flush_length: int) -> list[torch.Tensor]:
    cache = CacheConfig(max_requests=len(PROMPTS), max_seq_len=128, flush_length=flush_length)
    runner = ModelRunner.create(model, cache)
    slots = [runner.cache.allocate_request() for _ in PROMPTS]
    logits = runner.prefill(slots, PROMPTS, all_logits=True).cpu()
    return [logits[row, : len(prompt)] for row, prompt in enumerate(PROMPTS)]


@pytest.mark.parametrize("flush_length", [1, 16], ids=lambda length: f"L{length}")
def test_fp32_on_cuda_matches_transformers(checkpoint, flush_length):
    directory, reference, greedy, _ = checkpoint
    model = load_model(directory, device="cuda", dtype=torch.float32)
    assert model.device.type == "cuda"
    for ours, theirs in zip(prefill_logits(model, flush_length), reference, strict=True):
        torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=0)
    engine = Engine(model, None, EngineConfig(cache=CacheConfig(max_requests=len(PROMPTS), max_seq_len=128,
                                                               flush_length=flush_length)))
    requests = [engine.add_request(prompt, SamplingParams(), NEW_TOKENS) for prompt in PROMPTS]
    engine.run()
    assert [request.output for request in requests] == greedy


def test_bf16_is_the_gpu_default_and_as_accurate_as_transformers_bf16(checkpoint):
    """Both bf16 runs are measured against the fp32 logits over all prompts' positions together (per prompt, an MoE
    router that flips an expert choice on a rounding makes the error noisy); ours may not be worse by > 25%."""
    directory, reference, _, reference_bf16 = checkpoint
    model = load_model(directory, device="cuda")
    assert model.dtype == torch.bfloat16
    ours, theirs, exact = (torch.cat(logits) for logits in (prefill_logits(model, 16), reference_bf16, reference))
    our_error = (ours - exact).norm() / exact.norm()
    their_error = (theirs - exact).norm() / exact.norm()
    assert our_error <= 1.25 * their_error + 1e-3, f"bf16 error {our_error:.2%} vs transformers' {their_error:.2%}"
