"""Full-attention layers (Qwen3.5 gated attention, Nemotron-H attention) over the KV pool with a tree mask."""

from __future__ import annotations

import torch
from torch import nn

from specdec.cache.spec import AttentionLayerSpec
from specdec.parallel import SINGLE, TensorParallel, column_linear, row_linear

from .layers import OffsetRMSNorm, glue_for
from .merged import merge_linears, merged_outputs


class GatedAttention(nn.Module):
    """Qwen3.5 full attention: q_proj yields (query, gate) per head; q/k RMSNorm (1 + w); partial rotary;
    output * sigmoid(gate); o_proj. Under tensor parallelism the rank's query heads and the KV heads they read
    (kv_shard); o_proj all-reduces."""

    def __init__(self, config, attention_index: int, tp: TensorParallel = SINGLE):
        super().__init__()
        self.attention_index = attention_index
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.num_heads = tp.divide(heads, "num_attention_heads")
        bias = config.attention_bias
        hidden = config.hidden_size
        kv = kv_shard(tp, kv_heads, self.head_dim)
        self.num_kv_heads = kv.size // self.head_dim
        # q_proj's rows are (query, gate) per head: cutting by heads keeps each head's pair together
        self.q_proj = column_linear(hidden, heads * self.head_dim * 2, tp, bias=bias)
        self.k_proj = column_linear(hidden, kv_heads * self.head_dim, tp, bias=bias, shard=kv)
        self.v_proj = column_linear(hidden, kv_heads * self.head_dim, tp, bias=bias, shard=kv)
        self.o_proj = row_linear(heads * self.head_dim, hidden, tp, bias=bias)
        self.q_norm = OffsetRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = OffsetRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.kv: torch.Tensor | None = None  # k_proj's and v_proj's merged weight (merge_projections)

    def merge_projections(self) -> None:
        """k_proj and v_proj as one GEMM from now on where they have no bias (specdec/models/merged.py). q_proj
        stays apart: its gate half, read in place by the sigmoid gating (act_mul), needs rows of one stride, which
        a split of a wider output would not give."""
        self.kv = merge_linears([self.k_proj, self.v_proj])

    def cache_spec(self) -> AttentionLayerSpec:
        return AttentionLayerSpec(self.num_kv_heads, self.head_dim)

    def forward(self, hidden: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], ctx, cache) -> torch.Tensor:
        """hidden [B, T, D]; rotary (cos, sin) [B, T, R] -> [B, T, D]."""
        glue = glue_for(hidden, self.q_norm.weight, self.k_norm.weight)
        k, v = merged_outputs(hidden, self.kv, [self.k_proj, self.v_proj])  # (strided rows)
        query, gate = self.q_proj(hidden).unflatten(-1, (self.num_heads, 2 * self.head_dim)).chunk(2, dim=-1)
        key = k.unflatten(-1, (self.num_kv_heads, self.head_dim))
        value = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        # q / k norms (1 + w) then rotary, one op; query and gate are read in place from q_proj's output
        query, key = glue.qk_norm_rotary(query, key, self.q_norm.weight, self.k_norm.weight, *rotary, self.q_norm.eps)
        out = cache.attention[self.attention_index].attend(ctx, query, key, value, self.head_dim**-0.5)
        return self.o_proj(glue.act_mul(gate, out, "sigmoid").flatten(-2))  # out * sigmoid(gate)


def kv_shard(tp: TensorParallel, kv_heads: int, head_dim: int):
    """The rank's KV heads of k_proj / v_proj: an even split when there are at least as many as ranks, else the
    one KV head the rank's query heads read (GQA: query head h reads KV head h // (heads / kv_heads))."""
    if kv_heads >= tp.size:
        tp.divide(kv_heads, "num_key_value_heads")
        return tp.split(0, kv_heads * head_dim)
    return tp.share(0, kv_heads * head_dim, pieces=kv_heads)


class PlainAttention(nn.Module):
    """Nemotron-H attention: GQA without positional encoding (the Mamba2 layers carry position); sharded as
    GatedAttention."""

    def __init__(self, config, attention_index: int, tp: TensorParallel = SINGLE):
        super().__init__()
        self.attention_index = attention_index
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.num_heads = tp.divide(heads, "num_attention_heads")
        kv = kv_shard(tp, kv_heads, self.head_dim)
        self.num_kv_heads = kv.size // self.head_dim
        hidden = config.hidden_size
        # Nemotron-H checkpoints carry no attention biases whatever config.attention_bias says.
        self.q_proj = column_linear(hidden, heads * self.head_dim, tp)
        self.k_proj = column_linear(hidden, kv_heads * self.head_dim, tp, shard=kv)
        self.v_proj = column_linear(hidden, kv_heads * self.head_dim, tp, shard=kv)
        self.o_proj = row_linear(heads * self.head_dim, hidden, tp)
        self.qkv: torch.Tensor | None = None  # q_proj's, k_proj's and v_proj's merged weight (merge_projections)

    def merge_projections(self) -> None:
        """q_proj, k_proj and v_proj as one GEMM from now on (specdec/models/merged.py)."""
        self.qkv = merge_linears([self.q_proj, self.k_proj, self.v_proj])

    def cache_spec(self) -> AttentionLayerSpec:
        return AttentionLayerSpec(self.num_kv_heads, self.head_dim)

    def forward(self, hidden: torch.Tensor, ctx, cache) -> torch.Tensor:
        q, k, v = merged_outputs(hidden, self.qkv, [self.q_proj, self.k_proj, self.v_proj])  # (strided rows)
        query = q.unflatten(-1, (self.num_heads, self.head_dim))
        key = k.unflatten(-1, (self.num_kv_heads, self.head_dim))
        value = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        out = cache.attention[self.attention_index].attend(ctx, query, key, value, self.head_dim**-0.5)
        return self.o_proj(out.flatten(-2))
