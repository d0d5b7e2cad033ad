"""The whole runtime on the Triton kernels (in Triton's CPU interpreter here, natively on a GPU) against the same
runtime on the torch references: prompts of both prefill paths, decoding across flushes, a token tree and its
commit. This is what ties the kernels' signatures to how the model calls them."""

from __future__ import annotations

import pytest
import torch

from specdec import CacheConfig, ModelRunner, StepBatch, load_model
from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny

PROMPTS = [[3, 1, 4], list(range(5, 26))]  # one stays in the buffer, one is prefilled chunkwise
TREE = ([7, 8, 9, 10], [-1, 0, 0, 2], [0, 2, 3])  # tokens, parents, accepted path


def run(model, monkeypatch, backend: str) -> list[torch.Tensor]:
    monkeypatch.setenv("SPECDEC_BACKEND", backend)
    runner = ModelRunner.create(model, CacheConfig(max_requests=2, max_seq_len=64, flush_length=4))
    slots = [runner.cache.allocate_request() for _ in PROMPTS]
    outputs = [runner.prefill(slots, PROMPTS)]
    for token in (11, 12, 13):  # crosses a flush of the short request's buffer
        outputs.append(runner.decode(slots, [token, token]))
    tokens, parents, path = TREE
    hidden, ctx = runner.score(StepBatch.trees(slots, [tokens, tokens], [parents, parents]))
    outputs.append(model.compute_logits(hidden))
    accepted = torch.tensor([path, path])
    runner.cache.commit(ctx, accepted, torch.tensor([len(path), len(path)]))
    outputs.append(runner.decode(slots, [14, 15]))
    return outputs


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "nemotron_h"])
def test_triton_backend_matches_reference_backend(family, tmp_path, monkeypatch):
    """Both MoE models run their experts on the grouped linear kernel (verify_kernels.moe)."""
    # head dims of 16: the smallest the kernels take (real checkpoints use 64 and 128)
    if family.startswith("qwen3_5"):
        config = qwen35_text_config(linear_key_head_dim=16, linear_value_head_dim=16, moe=family.endswith("moe"))
    else:
        config = nemotron_h_config(mamba_head_dim=16, ssm_state_size=16)
    save_tiny(config, tmp_path, seed=9)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(tmp_path, device=device, dtype=torch.float32)
    reference = run(model, monkeypatch, "reference")
    kernels = run(model, monkeypatch, "triton")
    for step, (ours, expected) in enumerate(zip(kernels, reference, strict=True)):
        torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0, msg=lambda m, step=step: f"step {step}: {m}")


def test_head_dims_the_kernels_do_not_take_run_on_the_references(tmp_path, monkeypatch):
    """Linear kernels take head dims of 16 to 128; a model with 8 runs them on the references instead of failing
    (its attention, of head dim 16, runs on the attention kernel, which takes head dims of 16 to 256)."""
    from specdec.backend import backend_for

    save_tiny(qwen35_text_config(), tmp_path, seed=9)  # linear heads of 8
    device = "cuda" if torch.cuda.is_available() else "cpu"  # (Triton runs CPU tensors only in its interpreter)
    model = load_model(tmp_path, device=device, dtype=torch.float32)
    monkeypatch.setenv("SPECDEC_BACKEND", "triton")
    assert backend_for(torch.device("cpu"), 8, 8) == "reference"
    assert backend_for(torch.device("cpu"), 16, 128) == "triton"
    for ours, expected in zip(run(model, monkeypatch, "triton"), run(model, monkeypatch, "reference"), strict=True):
        torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)


def test_small_trees_tree_pass_in_the_runtime(tmp_path, monkeypatch):
    """The GDN verify's small trees' tree pass (verify.SMALL_TREE_PASS, on by default since the H200 sweep of
    2026-12-05) in the whole runtime against the references: the tree above (4 nodes) goes through it, as a counted
    launch shows."""
    from verify_kernels.gdn import verify as verify_module

    launches = []
    kernel = verify_module.gdn_verify_small_tree_kernel

    class CountedLaunch:
        def __getitem__(self, grid):
            launches.append(grid)
            return kernel[grid]

    monkeypatch.setattr(verify_module, "SMALL_TREE_PASS", True)
    monkeypatch.setattr(verify_module, "SMALL_TREE_FEW_ROWS", 0)  # (a batch this small runs the tensor-core pass)
    monkeypatch.setattr(verify_module, "gdn_verify_small_tree_kernel", CountedLaunch())
    save_tiny(qwen35_text_config(linear_key_head_dim=16, linear_value_head_dim=16), tmp_path, seed=9)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(tmp_path, device=device, dtype=torch.float32)
    reference = run(model, monkeypatch, "reference")
    kernels = run(model, monkeypatch, "triton")
    assert launches, "the tree went through the tensor-core tree pass"
    for step, (ours, expected) in enumerate(zip(kernels, reference, strict=True)):
        torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0, msg=lambda m, step=step: f"step {step}: {m}")


def test_fused_conv_qkv_in_the_runtime(tmp_path, monkeypatch):
    """The GDN's conv with its q / k / v split fused in (conv_qkv.FUSED, on by default since the H200 sweep of
    2026-12-05) in the whole runtime against the references: decode steps and the tree step go through the fused
    kernels, as counted launches show, and the gates come out of them (no launch of the gates' own kernel)."""
    from verify_kernels.conv import conv_qkv
    from verify_kernels.glue import gdn_inputs

    launches = {"tree": 0, "decode": 0, "gates": 0}

    def counted(name, kernel):
        class CountedLaunch:
            def __getitem__(self, grid):
                launches[name] += 1
                return kernel[grid]
        return CountedLaunch()

    monkeypatch.setattr(conv_qkv, "FUSED", True)
    monkeypatch.setattr(conv_qkv, "conv_tree_qkv_kernel", counted("tree", conv_qkv.conv_tree_qkv_kernel))
    monkeypatch.setattr(conv_qkv, "conv_decode_qkv_kernel", counted("decode", conv_qkv.conv_decode_qkv_kernel))
    monkeypatch.setattr(gdn_inputs, "gdn_gates_kernel", counted("gates", gdn_inputs.gdn_gates_kernel))
    save_tiny(qwen35_text_config(linear_key_head_dim=16, linear_value_head_dim=16), tmp_path, seed=9)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(tmp_path, device=device, dtype=torch.float32)
    reference = run(model, monkeypatch, "reference")
    kernels = run(model, monkeypatch, "triton")
    assert launches["tree"] and launches["decode"] and not launches["gates"], launches
    for step, (ours, expected) in enumerate(zip(kernels, reference, strict=True)):
        torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0, msg=lambda m, step=step: f"step {step}: {m}")


def prefill_then_decode(model, monkeypatch, backend: str, pieces: tuple[int, ...]) -> list[torch.Tensor]:
    """PROMPTS[1] (21 tokens) committed in pieces of these lengths, one prefill each (each from what the one before
    committed: chunked prefill, specdec/engine/prefill.py), then two decode steps. -> the last piece's logits, then
    each decode step's."""
    monkeypatch.setenv("SPECDEC_BACKEND", backend)
    runner = ModelRunner.create(model, CacheConfig(max_requests=1, max_seq_len=64, flush_length=4))
    slot, prompt, start = runner.cache.allocate_request(), PROMPTS[1], 0
    for length in pieces:
        logits = runner.prefill([slot], [prompt[start:start + length]])
        start += length
    return [logits] + [runner.decode([slot], [token]) for token in (11, 12)]


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_a_prompt_prefilled_in_pieces_on_the_kernels_equals_one_prefill(family, tmp_path, monkeypatch):
    """Pieces of 3 (into the buffer), 9 and 9 (the chunked path from the state, the buffer folded first) on the
    Triton backend give the logits of the whole prompt's one prefill on the references; on a GPU in bf16 too (fla's
    chunked GDN, from the pieces' states, against its run from zeros)."""
    if family == "qwen3_5":
        config = qwen35_text_config(linear_key_head_dim=16, linear_value_head_dim=16)
    else:
        config = nemotron_h_config(mamba_head_dim=16, ssm_state_size=16)
    save_tiny(config, tmp_path, seed=9)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_model(tmp_path, device=device, dtype=torch.float32)
    expected = prefill_then_decode(model, monkeypatch, "reference", (21,))
    for step, (ours, wanted) in enumerate(zip(prefill_then_decode(model, monkeypatch, "triton", (3, 9, 9)), expected,
                                              strict=True)):
        torch.testing.assert_close(ours, wanted, atol=1e-4, rtol=0, msg=lambda m, step=step: f"step {step}: {m}")
    if device == "cuda":
        model = load_model(tmp_path, device=device, dtype=torch.bfloat16)
        whole = prefill_then_decode(model, monkeypatch, "triton", (21,))
        for ours, wanted in zip(prefill_then_decode(model, monkeypatch, "triton", (3, 9, 9)), whole, strict=True):
            torch.testing.assert_close(ours.float(), wanted.float(), atol=5e-2, rtol=5e-2)
