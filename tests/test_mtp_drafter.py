"""The MTP drafter (`--draft mtp`): our MTP layer against the transformers-built one it was trained as, greedy
losslessness on chains and trees with flushes mid-verify, and clear errors for targets that cannot use it."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from drafters import MtpDrafter
from specdec.cache.spec import CacheConfig
from specdec.cache.step import StepBatch
from specdec.engine.engine import Engine, EngineConfig
from specdec.models import load_model
from specdec.models.mtp import Qwen35Mtp
from specdec.models.mtp_weights import MissingMtpError
from specdec.speculation import SamplingParams, TreeShape
from specdec.training.mtp import mtp_hidden
from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny, save_tiny_with_mtp

NEW_TOKENS = 64


@pytest.fixture(scope="module")
def random_mtp(tmp_path_factory):
    directory = tmp_path_factory.mktemp("random_mtp")
    reference, head = save_tiny_with_mtp(qwen35_text_config(), directory, seed=31)
    return directory, reference, head


@pytest.fixture(scope="module")
def random_moe_mtp(tmp_path_factory):
    directory = tmp_path_factory.mktemp("random_moe_mtp")
    reference, head = save_tiny_with_mtp(qwen35_text_config(moe=True), directory, seed=33)
    return directory, reference, head


@pytest.fixture(scope="module")
def random_nemotron_mtp(tmp_path_factory):
    directory = tmp_path_factory.mktemp("random_nemotron_mtp")
    reference, head = save_tiny_with_mtp(nemotron_h_config(), directory, seed=35)
    return directory, reference, head


def per_expert(directory, out):
    """The checkpoint with its MTP experts one tensor per expert and projection, as Qwen3.5 MoE checkpoints hold
    them (transformers and Qwen3.6 stack them)."""
    tensors = {}
    for file in directory.glob("*.safetensors"):
        with safe_open(file, framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    if "mtp.layers.1.mixer.experts.up_proj" in tensors:  # Nemotron: up / down per expert
        for projection in ("up_proj", "down_proj"):
            stacked = tensors.pop(f"mtp.layers.1.mixer.experts.{projection}")
            for expert in range(stacked.shape[0]):
                tensors[f"mtp.layers.1.mixer.experts.{expert}.{projection}.weight"] = stacked[expert].contiguous()
    else:  # Qwen3.5: gate / up / down per expert
        gate_up = tensors.pop("mtp.layers.0.mlp.experts.gate_up_proj")
        down = tensors.pop("mtp.layers.0.mlp.experts.down_proj")
        size = gate_up.shape[1] // 2
        for expert in range(gate_up.shape[0]):
            prefix = f"mtp.layers.0.mlp.experts.{expert}"
            tensors[f"{prefix}.gate_proj.weight"] = gate_up[expert, :size].contiguous()
            tensors[f"{prefix}.up_proj.weight"] = gate_up[expert, size:].contiguous()
            tensors[f"{prefix}.down_proj.weight"] = down[expert].contiguous()
    shutil.copy(directory / "config.json", out / "config.json")
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


@pytest.fixture(scope="module")
def echo_mtp(tmp_path_factory):
    directory = tmp_path_factory.mktemp("echo_mtp")
    save_tiny_with_mtp(qwen35_text_config(), directory, seed=32, echo=True)
    return directory


@pytest.mark.parametrize("which", ["dense", "moe", "moe-per-expert", "nemotron", "nemotron-per-expert"])
def test_our_mtp_layer_equals_the_one_it_was_trained_as(which, random_mtp, random_moe_mtp, random_nemotron_mtp,
                                                        tmp_path):
    """Rows of one sequence through our MTP model on its KVBuffer cache == the transformers-built MTP head."""
    directory, reference, head = {"dense": random_mtp, "moe": random_moe_mtp,
                                  "nemotron": random_nemotron_mtp}[which.removesuffix("-per-expert")]
    if which.endswith("per-expert"):
        directory = per_expert(directory, tmp_path)
    tokens = torch.randint(0, 90, (1, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden = reference.base_model(input_ids=tokens[:, :-1]).last_hidden_state     # [1, 12, D]
        expected = mtp_hidden(head, reference, hidden, tokens[:, 1:])
    mtp = MtpDrafter(load_model(directory, device="cpu", dtype=torch.float32), CacheConfig(max_requests=1)).head
    cache = mtp.make_cache(CacheConfig(max_requests=1, max_seq_len=32))
    slot = cache.allocate_request()
    with torch.no_grad():  # the first 8 rows committed as a prefill, the last 4 as a chain on top of them
        batch = StepBatch.chains([slot], [tokens[0, 1:9].tolist()], prefill=True)
        ctx = cache.begin_step(batch)
        first = mtp(batch.tokens, hidden[:, :8], ctx, cache)
        cache.commit_all(ctx)
        batch = StepBatch.trees([slot], [tokens[0, 9:].tolist()], [[-1, 0, 1, 2]])
        rest = mtp(batch.tokens, hidden[:, 8:], cache.begin_step(batch), cache)
    torch.testing.assert_close(torch.cat([first, rest], 1), expected, atol=1e-5, rtol=1e-5)


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    pattern = torch.randint(0, 90, (6,), generator=gen).tolist()
    return [pattern * 3, [7], torch.randint(0, 90, (19,), generator=gen).tolist() + pattern * 2]


def generate(model, drafter, flush_length: int, shape=TreeShape(steps=4), max_prefill_tokens: int = 16384):
    cache = CacheConfig(max_requests=2, max_seq_len=160, flush_length=flush_length)
    engine = Engine(model, drafter(model, cache) if drafter else None,
                    EngineConfig(cache=cache, shape=shape, max_prefill_tokens=max_prefill_tokens, speculation="fixed"))
    requests = [engine.add_request(p, SamplingParams(), NEW_TOKENS) for p in prompts()]
    engine.run()
    if drafter:
        assert engine.drafter.cache.free_request_slots == 2 and not engine.drafter.rows, "the drafter leaked a slot"
    return requests


@pytest.mark.parametrize("shape", [TreeShape(steps=4), TreeShape(steps=3, topk=2, max_tokens=6),
                                   TreeShape(steps=4, topk=3, max_tokens=8, dynamic=True)],
                         ids=["chain4", "tree-top2", "dynamic"])
@pytest.mark.parametrize("flush_length", [3, 16], ids=lambda length: f"L{length}")
@pytest.mark.parametrize("which", ["random", "echo"])
def test_mtp_speculation_is_lossless_under_greedy(which, flush_length, shape, random_mtp, echo_mtp):
    directory = random_mtp[0] if which == "random" else echo_mtp
    model = load_model(directory, device="cpu")
    plain = generate(model, None, flush_length)
    speculative = generate(model, MtpDrafter, flush_length, shape)
    for ours, reference in zip(speculative, plain, strict=True):
        assert ours.output == reference.output
    if which == "echo":
        accepted = sum(sum(r.stats.emitted_per_step) - r.stats.steps for r in speculative)
        assert accepted > 0, "no draft was accepted: the test would not exercise the drafter's pending rows"


def test_a_prompt_prefilled_in_pieces_gives_the_drafter_every_tokens_features(echo_mtp):
    """Prompts prefilled 5 tokens a forward (the 18- and 31-token ones in pieces): the MTP drafter starts from the
    features of the whole prompt, so it drafts, and the engine emits, exactly what one forward a prompt gives."""
    model = load_model(echo_mtp, device="cpu")
    whole = generate(model, MtpDrafter, 16)
    pieces = generate(model, MtpDrafter, 16, max_prefill_tokens=5)
    assert [r.output for r in pieces] == [r.output for r in whole]
    assert [r.stats.emitted_per_step for r in pieces] == [r.stats.emitted_per_step for r in whole]
    assert sum(sum(r.stats.emitted_per_step) - r.stats.steps for r in whole) > 0, "no draft accepted"


@pytest.mark.parametrize("family", ["qwen3_5_moe", "nemotron_h"])
def test_moe_mtp_speculation_is_lossless_under_greedy(family, tmp_path):
    config = qwen35_text_config(moe=True) if family == "qwen3_5_moe" else nemotron_h_config()
    save_tiny_with_mtp(config, tmp_path, seed=34, echo=True)
    model = load_model(tmp_path, device="cpu")
    plain, speculative = generate(model, None, 3), generate(model, MtpDrafter, 3)
    assert [r.output for r in speculative] == [r.output for r in plain]
    assert sum(sum(r.stats.emitted_per_step) - r.stats.steps for r in speculative) > 0


def test_a_target_without_mtp_layer_is_refused_clearly(tmp_path):
    save_tiny(qwen35_text_config(), tmp_path, seed=3)
    with pytest.raises(MissingMtpError, match="no mtp"):
        MtpDrafter(load_model(tmp_path, device="cpu"), CacheConfig(max_requests=1))


def test_incomplete_per_expert_mtp_tensors_are_refused(random_moe_mtp, tmp_path):
    model = load_model(per_expert(random_moe_mtp[0], tmp_path), device="cpu")
    del model.mtp_weights["layers.0.mlp.experts.1.up_proj.weight"]
    with pytest.raises(ValueError, match="experts are incomplete.*experts.1.up_proj"):
        Qwen35Mtp(model)


def test_mtp_tensors_of_the_wrong_size_are_refused(random_mtp, tmp_path):
    model = load_model(random_mtp[0], device="cpu")
    model.mtp_weights["fc.weight"] = model.mtp_weights["fc.weight"][:, :-2]
    with pytest.raises(ValueError, match="mtp.fc.weight has shape"):
        Qwen35Mtp(model)


@pytest.mark.parametrize("shape", [TreeShape(steps=3, topk=2, max_tokens=6),
                                   TreeShape(steps=3, topk=2, max_tokens=5, dynamic=True)],
                         ids=["sampled-children", "dynamic-point-masses"])
def test_sampled_requests_through_the_mtp_drafter_are_reproducible(shape, echo_mtp):
    model = load_model(echo_mtp, device="cpu")

    def run():
        cache = CacheConfig(max_requests=2, max_seq_len=160, flush_length=3)
        engine = Engine(model, MtpDrafter(model, cache), EngineConfig(cache=cache, shape=shape, speculation="fixed"))
        params = [SamplingParams(temperature=0.9, top_p=0.9, seed=seed) for seed in (1, 2, 3)]
        requests = [engine.add_request(p, q, 32) for p, q in zip(prompts(), params, strict=True)]
        engine.run()
        return [r.output for r in requests]

    first = run()
    assert all(len(output) == 32 for output in first)
    assert run() == first, "a seeded request must not depend on anything but its seed"
