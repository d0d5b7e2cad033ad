"""Nemotron-H / Nemotron-3: a pattern of Mamba2 (M), attention (*), MLP (-) and MoE (E) blocks, each
pre-normed with a residual (`layers_block_type`, or the older `hybrid_override_pattern` string)."""

from __future__ import annotations

import torch
from torch import nn

from specdec.parallel import SINGLE, TensorParallel, vocab_embedding, vocab_lm_head

from .attention import PlainAttention
from .base import HybridCausalLM
from .layers import PlainMLP, RMSNorm
from .mamba2 import Mamba2Mixer
from .moe import NemotronMoe

BLOCK_TYPES = ("linear_attention", "full_attention", "mlp", "moe")


class NemotronHBlock(nn.Module):
    def __init__(self, config, block_type: str, mixer_index: int, tp: TensorParallel = SINGLE):
        super().__init__()
        self.block_type = block_type
        self.norm = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
        if block_type == "linear_attention":
            self.mixer = Mamba2Mixer(config, mixer_index, tp)
        elif block_type == "full_attention":
            self.mixer = PlainAttention(config, mixer_index, tp)
        elif block_type == "mlp":
            self.mixer = PlainMLP(config.hidden_size, config.intermediate_size, config.mlp_hidden_act,
                                  bias=config.mlp_bias, tp=tp)
        else:
            self.mixer = NemotronMoe(config, tp)

    def forward(self, hidden: torch.Tensor, residual: torch.Tensor | None, ctx,
                cache) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) -> (hidden, residual): the residual stream is their sum; the add is fused into the
        norm that follows it (the next block's, or the final norm). residual None: hidden is the stream."""
        if residual is None:
            normed, residual = self.norm(hidden), hidden
        else:
            normed, residual = self.norm(hidden, residual)
        if self.block_type in ("linear_attention", "full_attention"):
            return self.mixer(normed, ctx, cache), residual
        return self.mixer(normed), residual


class NemotronHBackbone(nn.Module):
    def __init__(self, config, tp: TensorParallel = SINGLE):
        super().__init__()
        block_types = list(config.layers_block_type)
        unknown = sorted(set(block_types) - set(BLOCK_TYPES))
        if unknown:
            raise ValueError(f"config.layers_block_type has unsupported entries {unknown}; expected {BLOCK_TYPES}")
        self.embeddings = vocab_embedding(config.vocab_size, config.hidden_size, tp)
        counters = {kind: 0 for kind in BLOCK_TYPES}
        blocks = []
        for block_type in block_types:
            blocks.append(NemotronHBlock(config, block_type, counters[block_type], tp))
            counters[block_type] += 1
        self.layers = nn.ModuleList(blocks)
        self.norm_f = RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)


class NemotronHForCausalLM(HybridCausalLM):
    """`model_type` nemotron_h. tp: this process's rank of a tensor-parallel group (specdec.parallel)."""

    def __init__(self, config, tp: TensorParallel = SINGLE):
        super().__init__(config, tp)
        self.model = NemotronHBackbone(config, tp)
        self.lm_head = vocab_lm_head(config.hidden_size, config.vocab_size, tp)  # gathers full logits

    def forward_features(self, tokens: torch.Tensor, ctx, cache,
                         layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden, residual = self.model.embeddings(tokens), None
        captured = {}
        for index, block in enumerate(self.model.layers):
            hidden, residual = block(hidden, residual, ctx, cache)
            if index in layers:
                captured[index] = hidden + residual  # the block's output, as the next norm's add computes it
        out = self.model.norm_f(hidden, residual)[0]
        return out, torch.cat([captured[i] for i in layers], dim=-1) if layers else None

    def linear_layers(self) -> list[nn.Module]:
        return [block.mixer for block in self.model.layers if block.block_type == "linear_attention"]

    def attention_layers(self) -> list[nn.Module]:
        return [block.mixer for block in self.model.layers if block.block_type == "full_attention"]
