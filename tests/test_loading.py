"""The checkpoint loader on the layouts real checkpoints use, and its errors on broken ones."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specdec import CacheConfig, CheckpointError, ModelRunner, load_model
from specdec.models import SUPPORTED_MODEL_TYPES
from tests.tiny_models import nemotron_h_config, qwen35_multimodal_config, qwen35_text_config, save_tiny

PROMPT = [3, 17, 5, 42, 8, 11, 60, 2, 9]


def read_tensors(directory) -> dict[str, torch.Tensor]:
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(file, framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
    return tensors


def rewrite_single_file(directory, tensors: dict[str, torch.Tensor]) -> None:
    """Replace the checkpoint's weights by one model.safetensors holding `tensors`."""
    for file in list(directory.glob("*.safetensors")) + list(directory.glob("*.index.json")):
        file.unlink()
    tensors = {name: tensor.contiguous() for name, tensor in tensors.items()}
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})


def our_prefill_logits(directory, prompt=PROMPT, **load_kwargs) -> torch.Tensor:
    model = load_model(directory, device="cpu", **load_kwargs)
    runner = ModelRunner.create(model, CacheConfig(max_requests=1, max_seq_len=64, flush_length=4))
    slot = runner.cache.allocate_request()
    return runner.prefill([slot], [prompt], all_logits=True)[0]


def hf_logits(hf_model, prompt=PROMPT) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([prompt])).logits[0].float()


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen")
    hf_model = save_tiny(qwen35_text_config(), directory)
    return directory, hf_logits(hf_model)


def copy_checkpoint(source, tmp_path):
    target = tmp_path / "ckpt"
    shutil.copytree(source, target)
    return target


def test_sharded_checkpoint_with_index(tmp_path):
    hf_model = save_tiny(qwen35_text_config(), tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 2
    torch.testing.assert_close(our_prefill_logits(tmp_path), hf_logits(hf_model), atol=1e-4, rtol=0)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_multimodal_qwen35_checkpoint_loads_its_text_model(tmp_path, tied):
    config = qwen35_multimodal_config()
    config.tie_word_embeddings = tied  # the top-level flag decides, not text_config's
    hf_model = save_tiny(config, tmp_path)
    assert ("lm_head.weight" in read_tensors(tmp_path)) != tied
    names = read_tensors(tmp_path)
    assert any(name.startswith("model.language_model.") for name in names)
    assert any(name.startswith("model.visual.") for name in names)
    model = load_model(tmp_path, device="cpu")
    assert not any("visual" in name for name, _ in model.named_parameters())
    torch.testing.assert_close(our_prefill_logits(tmp_path), hf_logits(hf_model), atol=1e-4, rtol=0)


def test_mtp_weights_are_kept_for_the_drafter(qwen_dir, tmp_path):
    directory = copy_checkpoint(qwen_dir[0], tmp_path)
    tensors = read_tensors(directory)
    mtp = {
        "mtp.fc.weight": torch.randn(32, 64),
        "mtp.norm.weight": torch.randn(32),
        "mtp.pre_fc_norm_embedding.weight": torch.randn(32),
        "mtp.layers.0.mlp.up_proj.weight": torch.randn(48, 32),
    }
    rewrite_single_file(directory, {**tensors, **mtp})
    model = load_model(directory, device="cpu")
    assert sorted(model.mtp_weights) == sorted(name.removeprefix("mtp.") for name in mtp)
    for name, tensor in mtp.items():
        torch.testing.assert_close(model.mtp_weights[name.removeprefix("mtp.")], tensor)
    torch.testing.assert_close(our_prefill_logits(directory), qwen_dir[1], atol=1e-4, rtol=0)


def test_tied_embeddings(tmp_path):
    hf_model = save_tiny(qwen35_text_config(tie_word_embeddings=True), tmp_path)
    assert "lm_head.weight" not in read_tensors(tmp_path)
    model = load_model(tmp_path, device="cpu")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    torch.testing.assert_close(our_prefill_logits(tmp_path), hf_logits(hf_model), atol=1e-4, rtol=0)


def test_moe_experts_stacked_or_one_tensor_each(tmp_path):
    """transformers saves Qwen3.5-MoE one tensor per expert; stacked gate_up_proj / down_proj load the same."""
    hf_model = save_tiny(qwen35_text_config(moe=True), tmp_path)
    tensors = read_tensors(tmp_path)
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in tensors
    reference = hf_logits(hf_model)
    torch.testing.assert_close(our_prefill_logits(tmp_path), reference, atol=1e-4, rtol=0)

    stacked = {k: v for k, v in tensors.items() if ".experts." not in k}
    for layer in range(4):
        prefix = f"model.layers.{layer}.mlp.experts"
        gate_up = [torch.cat([tensors[f"{prefix}.{e}.gate_proj.weight"], tensors[f"{prefix}.{e}.up_proj.weight"]])
                   for e in range(4)]
        stacked[f"{prefix}.gate_up_proj"] = torch.stack(gate_up)
        stacked[f"{prefix}.down_proj"] = torch.stack([tensors[f"{prefix}.{e}.down_proj.weight"] for e in range(4)])
    rewrite_single_file(tmp_path, stacked)
    torch.testing.assert_close(our_prefill_logits(tmp_path), reference, atol=1e-4, rtol=0)


def test_nemotron_backbone_or_model_prefix(tmp_path):
    hf_model = save_tiny(nemotron_h_config(), tmp_path)
    tensors = read_tensors(tmp_path)
    assert any(name.startswith("backbone.") for name in tensors)
    reference = hf_logits(hf_model)
    torch.testing.assert_close(our_prefill_logits(tmp_path), reference, atol=1e-4, rtol=0)
    rewrite_single_file(tmp_path, {name.replace("backbone.", "model.", 1): t for name, t in tensors.items()})
    torch.testing.assert_close(our_prefill_logits(tmp_path), reference, atol=1e-4, rtol=0)


def test_dtype_choice(tmp_path):
    save_tiny(nemotron_h_config(), tmp_path)
    assert load_model(tmp_path, device="cpu").lm_head.weight.dtype == torch.float32  # CPU default
    model = load_model(tmp_path, device="cpu", dtype="bf16")
    assert model.lm_head.weight.dtype == torch.bfloat16
    router = model.model.layers[1].mixer.gate
    assert router.weight.dtype == torch.float32 and router.e_score_correction_bias.dtype == torch.float32
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model(tmp_path, device="cpu", dtype="fp8")


def test_missing_tensor_is_named(qwen_dir, tmp_path):
    directory = copy_checkpoint(qwen_dir[0], tmp_path)
    tensors = read_tensors(directory)
    del tensors["model.layers.2.linear_attn.in_proj_b.weight"]
    rewrite_single_file(directory, tensors)
    with pytest.raises(CheckpointError, match=r"not in .*model\.layers\.2\.linear_attn\.in_proj_b\.weight"):
        load_model(directory, device="cpu")


def test_missing_expert_is_named(tmp_path):
    save_tiny(qwen35_text_config(moe=True), tmp_path)
    tensors = read_tensors(tmp_path)
    del tensors["model.layers.1.mlp.experts.2.up_proj.weight"]
    rewrite_single_file(tmp_path, tensors)
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.experts\.2\.up_proj\.weight"):
        load_model(tmp_path, device="cpu")


def test_unexpected_tensor_is_named(qwen_dir, tmp_path):
    directory = copy_checkpoint(qwen_dir[0], tmp_path)
    tensors = read_tensors(directory)
    tensors["model.layers.9.linear_attn.in_proj_b.weight"] = torch.zeros(4, 32)
    rewrite_single_file(directory, tensors)
    with pytest.raises(CheckpointError, match=r"match nothing.*model\.layers\.9\.linear_attn\.in_proj_b\.weight"):
        load_model(directory, device="cpu")


def test_wrong_shape_is_named(qwen_dir, tmp_path):
    directory = copy_checkpoint(qwen_dir[0], tmp_path)
    tensors = read_tensors(directory)
    tensors["model.norm.weight"] = torch.zeros(31)
    rewrite_single_file(directory, tensors)
    with pytest.raises(CheckpointError, match=r"model\.norm\.weight has shape \(31,\).*expects \(32,\)"):
        load_model(directory, device="cpu")


def test_unsupported_model_type_lists_the_supported_ones(qwen_dir, tmp_path):
    directory = copy_checkpoint(qwen_dir[0], tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["model_type"] = "llama"
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="model_type 'llama'") as error:
        load_model(directory, device="cpu")
    assert all(model_type in str(error.value) for model_type in SUPPORTED_MODEL_TYPES)


def test_directory_without_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_text"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(CheckpointError, match="no .safetensors weights"):
        load_model(tmp_path, device="cpu")


def test_offline_hub_id_without_local_copy_says_how_to_pass_a_path(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(CheckpointError, match="pass that directory instead"):
        load_model("specdec-test/no-such-model", device="cpu")


def test_missing_local_path(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        load_model(tmp_path / "does" / "not" / "exist", device="cpu")


def test_layer_layout_from_full_attention_interval(tmp_path):
    """Older Qwen3.5-style configs give `full_attention_interval` instead of `layer_types`."""
    hf_model = save_tiny(qwen35_text_config(layer_types=["linear_attention", "full_attention"] * 2), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["layer_types"]
    config["full_attention_interval"] = 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(tmp_path, device="cpu")
    assert [layer.layer_type for layer in model.model.layers] == ["linear_attention", "full_attention"] * 2
    torch.testing.assert_close(our_prefill_logits(tmp_path), hf_logits(hf_model), atol=1e-4, rtol=0)


def test_nemotron_hybrid_override_pattern(tmp_path):
    """Older Nemotron-H configs give the block layout as a pattern string (M mamba, * attention, - mlp, E moe)."""
    hf_model = save_tiny(nemotron_h_config(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["layers_block_type"]
    config["hybrid_override_pattern"] = "MEM*-M"
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = load_model(tmp_path, device="cpu")
    assert [block.block_type for block in model.model.layers] == list(nemotron_h_config().layers_block_type)
    torch.testing.assert_close(our_prefill_logits(tmp_path), hf_logits(hf_model), atol=1e-4, rtol=0)


def test_model_is_built_on_the_meta_device_before_weights_are_read(qwen_dir, monkeypatch):
    """No double allocation: the module is built with no parameter storage, then each tensor is read into place."""
    from specdec.models import loading

    seen = {}
    real_load = loading._load

    def spy(model, *args, **kwargs):
        seen["meta"] = all(param.is_meta for param in model.parameters())
        return real_load(model, *args, **kwargs)

    monkeypatch.setattr(loading, "_load", spy)
    model = load_model(qwen_dir[0], device="cpu")
    assert seen["meta"] is True
    assert not any(param.is_meta for param in model.parameters())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_random_checkpoint_drawn_on_the_gpu_loads_like_one_drawn_on_the_cpu(tmp_path):
    """random:NAME targets draw their weights on the GPU when there is one; the files are the same layout."""
    config = qwen35_text_config()
    save_tiny(config, tmp_path / "cpu", seed=0)
    save_tiny(config, tmp_path / "gpu", seed=0, device="cuda")
    on_cpu, on_gpu = load_model(tmp_path / "cpu", device="cpu"), load_model(tmp_path / "gpu", device="cpu")
    names = dict(on_cpu.named_parameters())
    assert names.keys() == dict(on_gpu.named_parameters()).keys()
    for name, param in on_gpu.named_parameters():
        assert param.shape == names[name].shape and torch.isfinite(param).all()
        if param.ndim == 2:  # drawn alike: unit-scale noise over sqrt(fan-in)
            assert param.std().item() == pytest.approx(names[name].std().item(), rel=0.3)
