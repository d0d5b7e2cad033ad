"""Tiny random checkpoints of both families, built with transformers' own config and model classes and written
with save_pretrained, so our loader reads exactly what a real checkpoint directory holds."""

from __future__ import annotations

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import NemotronHConfig, Qwen3_5Config, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

from specdec.models.random_checkpoint import randomize, save_word_tokenizer
from specdec.models.random_checkpoint import save_random_checkpoint as save_tiny
from specdec.training.mtp import MtpHead

__all__ = ["nemotron_h_config", "qwen35_multimodal_config", "qwen35_text_config", "save_tiny", "save_tiny_tokenizer",
           "save_tiny_with_mtp"]

VOCAB = 96


def qwen35_text_config(value_heads_per_key: int = 2, moe: bool = False, **overrides):
    """4 layers (3 Gated DeltaNet : 1 gated attention), 2 key heads, 2 * ratio value heads, partial rotary."""
    fields = dict(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=2 * value_heads_per_key, linear_key_head_dim=8,
        linear_value_head_dim=8, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
    )
    if moe:
        fields.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                      shared_expert_intermediate_size=24)
        fields.update(overrides)
        return Qwen3_5MoeTextConfig(**fields)
    fields.update(intermediate_size=48)
    fields.update(overrides)
    return Qwen3_5TextConfig(**fields)


def nemotron_h_config(heads_per_group: int = 2, **overrides):
    """Mamba2, MoE, attention and MLP blocks; 2 groups of `heads_per_group` Mamba heads.

    time_step_min is set below any dt the initialisation can produce: transformers' NemotronH clamps dt there in
    its chunked path only (not in its decode path), while Mamba2 everywhere else, and specdec, use the configured
    time_step_limit; with the clamp never binding both readings agree.
    """
    fields = dict(
        vocab_size=VOCAB, hidden_size=32,
        layers_block_type=["linear_attention", "moe", "linear_attention", "full_attention", "mlp", "linear_attention"],
        mamba_num_heads=2 * heads_per_group, mamba_head_dim=8, n_groups=2, ssm_state_size=8, conv_kernel=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, intermediate_size=48,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, moe_shared_expert_intermediate_size=24,
        time_step_min=1e-9, time_step_floor=1e-4, max_position_embeddings=512,
    )
    fields.update(overrides)
    return NemotronHConfig(**fields)


def qwen35_multimodal_config(**text_overrides):
    """The multimodal Qwen3.5 layout: a text config plus a (tiny) vision tower we never run."""
    text = qwen35_text_config(**text_overrides).to_dict()
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=4, out_hidden_size=32,
                  num_position_embeddings=16, temporal_patch_size=1, spatial_merge_size=1)
    return Qwen3_5Config(text_config=text, vision_config=vision)



def save_tiny_tokenizer(directory) -> None:
    save_word_tokenizer(directory, VOCAB)


def save_tiny_with_mtp(config, directory, seed: int, echo: bool = False):
    """A tiny Qwen3.5 checkpoint with an MTP layer (`mtp.*` beside the model's tensors in one file, as Qwen3.5
    checkpoints hold it); -> (transformers' model, the MtpHead). The MTP layer is random, or with `echo` one whose
    output is the (renormalised) target hidden it is given: it drafts what the target predicted one position earlier,
    which the target accepts whenever its output repeats a token."""
    model = save_tiny(config, directory, seed=seed)
    head = MtpHead(model).eval()
    randomize(head, seed + 1)
    if echo:
        with torch.no_grad():
            for param in head.parameters():
                param.zero_()
            size = config.hidden_size
            head.fc.weight[:, size:] = torch.eye(size)  # keep the hidden half; the layer adds nothing (zero o / down)
    tensors = {}
    for file in sorted(directory.glob("*.safetensors")):
        with safe_open(file, framework="pt") as handle:
            tensors.update({name: handle.get_tensor(name) for name in handle.keys()})
        file.unlink()
    for index in directory.glob("*.index.json"):
        index.unlink()
    tensors.update({f"mtp.{name}": tensor.detach().clone().contiguous() for name, tensor in head.state_dict().items()})
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return model, head
