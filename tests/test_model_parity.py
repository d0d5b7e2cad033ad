"""Our runtimes against transformers' own models on the same checkpoints, in fp32: prefill logits and 32 greedy
decode steps, for several head groupings, flush lengths and a batch of prompts of different lengths.

transformers runs each prompt alone (its reference); we run the prompts together as one ragged batch. The prompt
lengths straddle the flush lengths, so prompts take both prefill paths: short ones stay in the buffer with no
committed state, long ones go through the chunked prefill, and decoding crosses flush boundaries."""

from __future__ import annotations

import pytest
import torch

from specdec import CacheConfig, ModelRunner, load_model
from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny

PROMPT_LENGTHS = (2, 7, 20)
DECODE_STEPS = 32
TOLERANCE = 1e-4

MODELS = {
    "qwen3_5-hv1": lambda: qwen35_text_config(value_heads_per_key=1),
    "qwen3_5-hv2": lambda: qwen35_text_config(value_heads_per_key=2),
    "qwen3_5-hv3": lambda: qwen35_text_config(value_heads_per_key=3),
    "qwen3_5_moe-hv2": lambda: qwen35_text_config(value_heads_per_key=2, moe=True),
    "nemotron_h-g1": lambda: nemotron_h_config(heads_per_group=1),
    "nemotron_h-g2": lambda: nemotron_h_config(heads_per_group=2),
    "nemotron_h-g3": lambda: nemotron_h_config(heads_per_group=3),
}


def make_prompts(seed: int, vocab: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=generator).tolist() for length in PROMPT_LENGTHS]


@pytest.fixture(scope="module", params=sorted(MODELS))
def reference(request, tmp_path_factory):
    """(checkpoint dir, prompts, per-prompt transformers results: prefill logits, greedy tokens, step logits)."""
    config = MODELS[request.param]()
    directory = tmp_path_factory.mktemp(request.param)
    hf_model = save_tiny(config, directory, seed=len(request.param))
    prompts = make_prompts(seed=7, vocab=config.vocab_size)
    results = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            prefill_logits = hf_model(ids).logits[0].float()
            out = hf_model.generate(ids, max_new_tokens=DECODE_STEPS + 1, do_sample=False, output_logits=True,
                                    return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
            tokens = out.sequences[0, len(prompt):].tolist()
            step_logits = torch.stack([logits[0].float() for logits in out.logits])  # [33, V]
            results.append((prefill_logits, tokens, step_logits))
    return directory, prompts, results


@pytest.mark.parametrize("flush_length", [1, 3, 16], ids=lambda length: f"L{length}")
def test_prefill_and_greedy_decode_match_transformers(reference, flush_length):
    directory, prompts, results = reference
    model = load_model(directory, device="cpu")
    runner = ModelRunner.create(model, CacheConfig(max_requests=4, max_seq_len=96, flush_length=flush_length))
    slots = [runner.cache.allocate_request() for _ in prompts]

    prefill_logits = runner.prefill(slots, prompts, all_logits=True)  # [B, T, V]
    worst = 0.0
    for row, (prompt, (hf_prefill, _, _)) in enumerate(zip(prompts, results, strict=True)):
        diff = (prefill_logits[row, : len(prompt)] - hf_prefill).abs().max().item()
        worst = max(worst, diff)
    assert worst <= TOLERANCE, f"prefill logits differ by {worst:.2e}"

    # Greedy: the first token comes from the prefill, then DECODE_STEPS one-token steps.
    generated = [[int(prefill_logits[row, len(prompt) - 1].argmax())] for row, prompt in enumerate(prompts)]
    step_logits = [[prefill_logits[row, len(prompt) - 1]] for row, prompt in enumerate(prompts)]
    for _ in range(DECODE_STEPS):
        logits = runner.decode(slots, [tokens[-1] for tokens in generated])
        for row in range(len(prompts)):
            generated[row].append(int(logits[row].argmax()))
            step_logits[row].append(logits[row])
    for row, (_, hf_tokens, hf_step_logits) in enumerate(results):
        assert generated[row] == hf_tokens, f"prompt {row}: greedy tokens diverge"
        diff = (torch.stack(step_logits[row]) - hf_step_logits).abs().max().item()
        worst = max(worst, diff)
    assert worst <= TOLERANCE, f"decode logits differ by {worst:.2e}"
    print(f"max |logit difference| = {worst:.2e}")


def test_state_is_allocated_only_when_a_request_flushes(reference):
    """Short-context mode: a request that has not filled its buffer holds no committed state."""
    directory, prompts, _ = reference
    model = load_model(directory, device="cpu")
    runner = ModelRunner.create(model, CacheConfig(max_requests=4, max_seq_len=96, flush_length=16, num_state_slots=1))
    short_slot = runner.cache.allocate_request()
    runner.prefill([short_slot], [prompts[1]])  # 7 tokens < L = 16
    assert runner.cache.state_slot[short_slot] == -1 and runner.cache.free_state_slots == 1
    for _ in range(16 - len(prompts[1]) - 1):
        runner.decode([short_slot], [1])
    assert runner.cache.state_slot[short_slot] == -1, "15 entries still fit the buffer"
    runner.decode([short_slot], [1])  # the 16th token folds the buffer
    assert runner.cache.state_slot[short_slot] >= 0 and runner.cache.free_state_slots == 0
    runner.cache.release_request(short_slot)
    assert runner.cache.free_state_slots == 1
