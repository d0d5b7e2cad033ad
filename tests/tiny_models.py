"""Tiny random checkpoints of both families, built with transformers' own config and model classes and written
with save_pretrained, so our loader reads exactly what a real checkpoint directory holds."""

from __future__ import annotations

import torch
from transformers import NemotronHConfig, Qwen3_5Config, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

from specdec.models.random_checkpoint import randomize, save_word_tokenizer
from specdec.models.random_checkpoint import save_random_checkpoint as save_tiny
from specdec.training.mtp import mtp_head_for
from specdec.training.mtp_checkpoint import write_mtp_tensors

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
    """A tiny Qwen3.5 or Nemotron-H checkpoint with an MTP layer (`mtp.*` in a shard of its own, as the training
    command writes it); -> (transformers' model, the MTP head). The MTP layer is random, or with `echo` one whose
    output is the (renormalised) target hidden it is given: it drafts what the target predicted one position earlier,
    which the target accepts whenever its output repeats a token."""
    model = save_tiny(config, directory, seed=seed)
    head = mtp_head_for(model).eval()
    randomize(head, seed + 1)
    if echo:
        with torch.no_grad():
            for name, param in head.named_parameters():
                # Qwen3.5's norms scale by (1 + w), Nemotron's by w: identity either way; the blocks add nothing
                plain_norm = config.model_type == "nemotron_h" and name.endswith("norm.weight")
                param.fill_(1.0 if plain_norm else 0.0)
            size = config.hidden_size
            first = head.fc if hasattr(head, "fc") else head.layers[0].eh_proj
            first.weight[:, size:] = torch.eye(size)  # keep the hidden half
    write_mtp_tensors(directory, head.state_dict(), head.config_fields())
    return model, head
