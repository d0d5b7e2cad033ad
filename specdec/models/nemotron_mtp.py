"""Nemotron-3's multi-token-prediction (MTP) layer as a model of its own over a KVBuffer cache (attention only),
built from a Nemotron-H target's `mtp.*` tensors and sharing its embedding and LM head (Nemotron 3 Super ships one;
specdec train writes one for the small Nemotron it ships). Blocks of mtp_layers_block_type (by default attention,
then MoE), plain RMSNorms, no rotary:

    x = mtp.layers.0.eh_proj([layers.0.enorm(embed(token)), layers.0.hnorm(h)]);  x = block(x) for each block
    y = mtp.layers.<last>.final_layernorm(x)

A row pairs the hidden state of position p - 1 with the token at p, as Qwen3.5's MTP does (specdec/models/mtp.py,
whose interface this shares for drafters/head.py)."""

from __future__ import annotations

import re

import torch
from torch import nn

from .base import HybridCausalLM
from .layers import RMSNorm
from .mtp_weights import load_checked, require_mtp, stack_experts
from .nemotron_h import NemotronHBlock, NemotronHForCausalLM

PER_EXPERT = re.compile(r"^(layers\.\d+\.mixer\.experts)\.(\d+)\.(up_proj|down_proj)\.weight$")
STACKED = {"up_proj": ("up_proj",), "down_proj": ("down_proj",)}  # [E, I, D] and [E, D, I]
FP32 = ("gate.weight", "gate.e_score_correction_bias")  # the router runs in fp32, as the target's does


class NemotronHMtp(HybridCausalLM):
    """forward(tokens, hidden_in, ctx, cache) -> y [B, T, D]; compute_logits(y) through the target's LM head."""

    def __init__(self, target: NemotronHForCausalLM):
        config = target.hf_config
        super().__init__(config)
        weights = require_mtp(target)
        types = list(getattr(config, "mtp_layers_block_type", None) or ["full_attention", "moe"])
        if "linear_attention" in types:
            raise ValueError(f"MTP blocks {types}: Mamba2 blocks in an MTP layer are not supported")
        size, eps = config.hidden_size, config.layer_norm_epsilon
        attention = iter(range(len(types)))
        self.layers = nn.ModuleList([
            NemotronHBlock(config, kind, next(attention) if kind == "full_attention" else 0) for kind in types])
        self.layers[0].enorm = RMSNorm(size, eps)
        self.layers[0].hnorm = RMSNorm(size, eps)
        self.layers[0].eh_proj = nn.Linear(2 * size, size, bias=False)
        self.layers[-1].final_layernorm = RMSNorm(size, eps)
        load_checked(self, stack_experts(weights, PER_EXPERT, STACKED), "the Nemotron MTP layer config.json describes")
        self.to(device=target.device, dtype=target.dtype)
        for name, param in self.named_parameters():
            if name.endswith(FP32):
                param.data = param.data.float()
        for name, buffer in self.named_buffers():
            if name.endswith(FP32):
                buffer.data = buffer.data.float()
        self.merge_projections()
        self._shared = (target.model.embeddings, target.lm_head)  # the target's, not parameters of this module

    @property
    def lm_head(self) -> nn.Linear:
        return self._shared[1]

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return features

    def forward(self, tokens: torch.Tensor, hidden_in: torch.Tensor, ctx, cache) -> torch.Tensor:
        """tokens [B, T], hidden_in [B, T, D] (the target's hidden after its final norm, or a parent row's y)."""
        first = self.layers[0]
        embeds = self._shared[0](tokens)
        x = first.eh_proj(torch.cat([first.enorm(embeds), first.hnorm(hidden_in.to(embeds.dtype))], dim=-1))
        residual = None
        for block in self.layers:
            x, residual = block(x, residual, ctx, cache)
        return self.layers[-1].final_layernorm(x, residual)[0]  # the last block's residual add fused in

    def linear_layers(self) -> list[nn.Module]:
        return []

    def attention_layers(self) -> list[nn.Module]:
        return [block.mixer for block in self.layers if block.block_type == "full_attention"]
