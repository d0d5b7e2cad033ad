"""The layer shapes of real models, for random-weight models that benchmark at real sizes where the trained
checkpoints are out of reach (`--target random:qwen3.5-9b[:LAYERS]`, `random:qwen3.5-35b-a3b[:LAYERS]`,
`random:nemotron-3-nano[:LAYERS]`): all the layers, or the first LAYERS of the real pattern."""

from __future__ import annotations

from collections.abc import Callable

from transformers import NemotronHConfig, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

# Qwen3.5's rotary: a quarter of each 256-wide head, mRoPE sections interleaved (text: plain 1-D rotary)
QWEN35_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
               "mrope_section": [11, 11, 10], "mrope_interleaved": True}
# the context the engine admits requests up to (Engine.check_request): Qwen3.5's native 262144 tokens (its model
# cards), for Nemotron-3-Nano's shapes too (until 2026-12-07 these configs said 8192, which refused a long-context
# benchmark at 8192 prompt tokens)
CONTEXT = 262144


def qwen35_layer_types(layers: int) -> list[str]:
    """3 Gated DeltaNet layers : 1 gated attention layer (full_attention_interval 4)."""
    return ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]


def qwen35_9b(layers: int = 32) -> Qwen3_5TextConfig:
    """Qwen3.5-9B: 32 layers, 3 Gated DeltaNet (16 key / 32 value heads of 128) : 1 gated attention (16 heads,
    4 KV heads of 256), hidden 4096, vocabulary 248320."""
    return Qwen3_5TextConfig(
        vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=layers,
        layer_types=qwen35_layer_types(layers), num_attention_heads=16, num_key_value_heads=4, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        max_position_embeddings=CONTEXT, tie_word_embeddings=False, rope_parameters=dict(QWEN35_ROPE))


def qwen35_35b_a3b(layers: int = 40) -> Qwen3_5MoeTextConfig:
    """Qwen3.5-35B-A3B: 40 layers, 3 Gated DeltaNet (16 key / 32 value heads of 128) : 1 gated attention (16 heads,
    2 KV heads of 256); every layer a MoE of 256 experts (8 active, 512 wide) plus a gated shared expert of 512;
    hidden 2048, vocabulary 248320. (transformers' Qwen3_5MoeTextConfig defaults, which its docstring gives as the
    35B-A3B's; the layer, expert and head counts also as the published model cards give them.)"""
    return Qwen3_5MoeTextConfig(
        vocab_size=248320, hidden_size=2048, num_hidden_layers=layers, layer_types=qwen35_layer_types(layers),
        num_attention_heads=16, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
        num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512, shared_expert_intermediate_size=512,
        max_position_embeddings=CONTEXT, tie_word_embeddings=False, rope_parameters=dict(QWEN35_ROPE))


# Nemotron 3 Nano 30B-A3B's 52 blocks: M Mamba2, E mixture of experts, * attention
NEMOTRON3_NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
BLOCK_TYPES = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}


def nemotron3_nano(layers: int = 52) -> NemotronHConfig:
    """Nemotron 3 Nano 30B-A3B: Mamba2 with 64 heads of 64, 8 groups, state 128; MoE of 128 experts (6 active,
    1856 wide) and a shared expert of 3712; attention with 32 heads, 2 KV heads of 128; hidden 2688, vocabulary
    131072. The first `layers` blocks of its pattern."""
    return NemotronHConfig(
        vocab_size=131072, hidden_size=2688, intermediate_size=1856,
        layers_block_type=[BLOCK_TYPES[c] for c in NEMOTRON3_NANO_PATTERN[:layers]],
        mamba_num_heads=64, mamba_head_dim=64, n_groups=8, ssm_state_size=128, conv_kernel=4,
        num_attention_heads=32, num_key_value_heads=2, head_dim=128,
        n_routed_experts=128, num_experts_per_tok=6, moe_intermediate_size=1856,
        moe_shared_expert_intermediate_size=3712, routed_scaling_factor=2.5, n_group=1, topk_group=1,
        max_position_embeddings=CONTEXT, tie_word_embeddings=False)


SHAPES: dict[str, tuple[Callable, int]] = {"qwen3.5-9b": (qwen35_9b, 32), "qwen3.5-35b-a3b": (qwen35_35b_a3b, 40),
                                           "nemotron-3-nano": (nemotron3_nano, 52)}
