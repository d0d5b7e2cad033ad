"""Qwen3.5's multi-token-prediction (MTP) layer as a model of its own over a KVBuffer cache (attention only), built
from a target's `mtp.*` tensors (model.mtp_weights) and sharing the target's embedding and LM head.

A row is (the hidden state h of position p - 1, the token x at position p), at rotary position p - 1:

    y = mtp.norm(layer(mtp.fc([pre_fc_norm_embedding(embed(x)), pre_fc_norm_hidden(h)])))

y's logits predict the token at p + 1, and y is the hidden of the next row when drafting further. The layer is one
gated full-attention decoder layer (Qwen35DecoderLayer, with the target's MoE block for MoE models); its keys and
values live in the cache's attention pool.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from .base import HybridCausalLM
from .layers import OffsetRMSNorm, RotaryEmbedding
from .mtp_weights import load_checked, require_mtp, stack_experts
from .qwen3_5 import Qwen35DecoderLayer, Qwen35ForCausalLM

# Qwen3.5 MoE checkpoints store the MTP layer's experts per expert; ours are stacked as Qwen3.6 checkpoints (and
# transformers) store them: gate_up_proj [E, 2I, H] (gate rows, then up rows), down_proj [E, H, I].
PER_EXPERT = re.compile(r"^(layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
STACKED = {"gate_up_proj": ("gate_proj", "up_proj"), "down_proj": ("down_proj",)}


class Qwen35Mtp(HybridCausalLM):
    """forward(tokens, hidden_in, ctx, cache) -> y [B, T, D]; compute_logits(y) through the target's LM head; the
    same interface as the EAGLE-3 head (specdec/models/eagle3.py), which drafters/head.py runs."""

    def __init__(self, target: Qwen35ForCausalLM):
        config = target.hf_config
        super().__init__(config)
        weights = require_mtp(target)
        moe = bool(getattr(config, "num_experts", 0))
        size, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = OffsetRMSNorm(size, eps=eps)
        self.pre_fc_norm_hidden = OffsetRMSNorm(size, eps=eps)
        self.fc = nn.Linear(2 * size, size, bias=False)
        self.layers = nn.ModuleList([Qwen35DecoderLayer(config, "full_attention", 0, moe=moe)])
        self.norm = OffsetRMSNorm(size, eps=eps)
        head_dim = getattr(config, "head_dim", None) or size // config.num_attention_heads
        self.rotary_emb = RotaryEmbedding(config, head_dim)
        load_checked(self, stack_experts(weights, PER_EXPERT, STACKED), "one Qwen3.5 MTP layer")
        self.to(device=target.device, dtype=target.dtype).merge_projections()
        # the target's, shared (not parameters of this module: they belong to the target)
        self._shared = (target.model.embed_tokens, target.lm_head)

    @property
    def lm_head(self) -> nn.Linear:
        return self._shared[1]

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """The target's final hidden states are the rows' hidden input as they are."""
        return features

    def forward(self, tokens: torch.Tensor, hidden_in: torch.Tensor, ctx, cache) -> torch.Tensor:
        """tokens [B, T], hidden_in [B, T, D] (the target's hidden after its final norm, or a parent row's y)."""
        embeds = self._shared[0](tokens)
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(hidden_in.to(embeds.dtype))],
                              dim=-1))
        rotary = self.rotary_emb(ctx.positions, x.dtype)
        return self.norm(*self.layers[0](x, None, rotary, ctx, cache))[0]  # the layer's residual add fused in

    def linear_layers(self) -> list[nn.Module]:
        return []

    def attention_layers(self) -> list[nn.Module]:
        return [self.layers[0].self_attn]
