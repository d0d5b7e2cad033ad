"""Qwen3.5 text model, dense and MoE: Gated DeltaNet and gated full-attention layers (`layer_types`)."""

from __future__ import annotations

import torch
from torch import nn

from specdec.parallel import SINGLE, TensorParallel, vocab_embedding, vocab_lm_head

from .attention import GatedAttention
from .base import HybridCausalLM
from .gated_deltanet import GatedDeltaNet
from .layers import GatedMLP, OffsetRMSNorm, RotaryEmbedding
from .moe import Qwen35SparseMoe

LAYER_TYPES = ("linear_attention", "full_attention")


class Qwen35DecoderLayer(nn.Module):
    def __init__(self, config, layer_type: str, mixer_index: int, moe: bool, tp: TensorParallel = SINGLE):
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(config, mixer_index, tp)
        else:
            self.self_attn = GatedAttention(config, mixer_index, tp)
        self.mlp = Qwen35SparseMoe(config, tp) if moe else GatedMLP(config.hidden_size, config.intermediate_size,
                                                                 config.hidden_act, tp)
        self.input_layernorm = OffsetRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = OffsetRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, rotary, ctx,
                cache) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) -> (hidden, residual): the residual stream is their sum; each add is fused into the
        norm that follows it (the next layer's input norm, or the final norm). residual None: hidden is the stream."""
        if residual is None:
            normed, residual = self.input_layernorm(hidden), hidden
        else:
            normed, residual = self.input_layernorm(hidden, residual)
        if self.layer_type == "linear_attention":
            mixed = self.linear_attn(normed, ctx, cache)
        else:
            mixed = self.self_attn(normed, rotary, ctx, cache)
        normed, residual = self.post_attention_layernorm(mixed, residual)
        return self.mlp(normed), residual


class Qwen35TextModel(nn.Module):
    def __init__(self, config, moe: bool, tp: TensorParallel = SINGLE):
        super().__init__()
        layer_types = list(config.layer_types)
        unknown = sorted(set(layer_types) - set(LAYER_TYPES))
        if unknown:
            raise ValueError(f"config.layer_types has unsupported entries {unknown}; expected {LAYER_TYPES}")
        self.embed_tokens = vocab_embedding(config.vocab_size, config.hidden_size, tp)
        counters = {kind: 0 for kind in LAYER_TYPES}
        layers = []
        for layer_type in layer_types[: config.num_hidden_layers]:
            layers.append(Qwen35DecoderLayer(config, layer_type, counters[layer_type], moe, tp))
            counters[layer_type] += 1
        self.layers = nn.ModuleList(layers)
        self.norm = OffsetRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.rotary_emb = RotaryEmbedding(config, head_dim)


class Qwen35ForCausalLM(HybridCausalLM):
    """`model_type` qwen3_5_text / qwen3_5_moe_text (and the text part of qwen3_5 / qwen3_5_moe checkpoints).
    tp: this process's rank of a tensor-parallel group (specdec.parallel); the dense model shards."""

    def __init__(self, config, moe: bool = False, tp: TensorParallel = SINGLE):
        super().__init__(config, tp)
        self.model = Qwen35TextModel(config, moe, tp)
        self.lm_head = vocab_lm_head(config.hidden_size, config.vocab_size, tp)  # gathers full logits

    def forward_features(self, tokens: torch.Tensor, ctx, cache,
                         layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden, residual = self.model.embed_tokens(tokens), None
        rotary = self.model.rotary_emb(ctx.positions, hidden.dtype)
        captured = {}
        for index, layer in enumerate(self.model.layers):
            hidden, residual = layer(hidden, residual, rotary, ctx, cache)
            if index in layers:
                captured[index] = hidden + residual  # the layer's output, as the next norm's add computes it
        out = self.model.norm(hidden, residual)[0]
        return out, torch.cat([captured[i] for i in layers], dim=-1) if layers else None

    def linear_layers(self) -> list[nn.Module]:
        return [layer.linear_attn for layer in self.model.layers if layer.layer_type == "linear_attention"]

    def attention_layers(self) -> list[nn.Module]:
        return [layer.self_attn for layer in self.model.layers if layer.layer_type == "full_attention"]
