"""Qwen3.5 Gated DeltaNet layer running on the KVBuffer cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.backend import backend_for, conv_ops, gdn_chunk_prefill, gdn_ops
from specdec.cache.linear_pool import LinearScratch
from specdec.cache.spec import LinearLayerSpec

from .layers import GatedRMSNorm


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """As fla and transformers: x / sqrt(sum x^2 + eps), in fp32."""
    x = x.float()
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)


class GatedDeltaNet(nn.Module):
    """in_proj_qkv -> causal conv (k=4) + SiLU -> (q, k, v); g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b);
    delta rule per value head through the KVBuffer; gated RMSNorm with z; out_proj.

    H = linear_num_key_heads, HV = linear_num_value_heads (value head h reads key head h // (HV / H)).
    """

    def __init__(self, config, linear_index: int):
        super().__init__()
        self.linear_index = linear_index
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(
                f"linear_num_value_heads ({self.num_v_heads}) must be a multiple of linear_num_key_heads "
                f"({self.num_k_heads})"
            )
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel_size = config.linear_conv_kernel_dim
        hidden = config.hidden_size

        self.in_proj_qkv = nn.Linear(hidden, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.conv_kernel_size, groups=self.conv_dim,
                                bias=False, padding=self.conv_kernel_size - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, eps=config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, hidden, bias=False)

    def cache_spec(self) -> LinearLayerSpec:
        return LinearLayerSpec(
            mixer="gdn",
            key_shape=(self.num_k_heads, self.head_k_dim),
            value_shape=(self.num_v_heads, self.head_v_dim),
            decay_heads=self.num_v_heads,
            state_shape=(self.num_v_heads, self.head_k_dim, self.head_v_dim),
            conv_dim=self.conv_dim,
            conv_width=self.conv_kernel_size,
        )

    def forward(self, hidden: torch.Tensor, ctx, cache) -> torch.Tensor:
        """hidden [B, T, D] -> [B, T, D]; reads the layer's pool, leaves what commit needs in ctx.scratch."""
        batch, width, _ = hidden.shape
        pool = cache.linear[self.linear_index]
        backend = backend_for(hidden.device, self.head_k_dim, self.head_v_dim)
        mixed = self.in_proj_qkv(hidden)  # [B, T, conv_dim], pre-conv
        conv_out = conv_ops(backend).tree(
            mixed, ctx.parents, ctx.num_nodes, pool.conv, ctx.req_slots, self.conv1d.weight[:, 0], None, "silu"
        )
        query, key, value = conv_out.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        query = l2_normalize(query.unflatten(-1, (self.num_k_heads, self.head_k_dim))) * self.head_k_dim**-0.5
        key = l2_normalize(key.unflatten(-1, (self.num_k_heads, self.head_k_dim)))
        value = value.unflatten(-1, (self.num_v_heads, self.head_v_dim)).float().contiguous()  # a strided split
        beta = self.in_proj_b(hidden).sigmoid().float()  # [B, T, HV]
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(hidden).float() + self.dt_bias)  # [B, T, HV]

        out = torch.zeros(batch, width, self.num_v_heads, self.head_v_dim, device=hidden.device)
        scratch = LinearScratch(conv_input=mixed, key=key, value=torch.zeros_like(value), gcum=torch.zeros_like(g))
        ops = gdn_ops(backend)
        if ctx.tree_rows.numel():
            self._tree(ops, ctx, pool, cache.buf_len_device, query, key, value, g, beta, out, scratch)
        if ctx.chunk_rows.numel():
            prefill = gdn_chunk_prefill(backend, hidden.dtype)
            self._chunked_prefill(prefill, ctx, pool, query, key, value, g, beta, out, scratch)
        ctx.scratch[self.linear_index] = scratch

        out = self.norm(out.to(hidden.dtype), self.in_proj_z(hidden).unflatten(-1, (self.num_v_heads, self.head_v_dim)))
        return self.out_proj(out.flatten(-2))

    def _tree(self, ops, ctx, pool, buf_len, query, key, value, g, beta, out, scratch) -> None:
        """KVBuffer decode (one node per row) or tree verify: outputs and entries, no state written (or, for the
        intermediate-state baseline, outputs and the state after every node)."""
        rows = ctx.tree_index
        if pool.intermediate is not None:  # the baseline: one state per node, kept for commit
            out[rows], scratch.node_states = pool.intermediate.tree(
                query[rows], key[rows], value[rows], g[rows], beta[rows], ctx.parents[rows], ctx.num_nodes[rows],
                pool.state, ctx.state_slots[rows], in_place=ctx.parents.shape[1] == 1,
                states_out=pool.node_states_for(*ctx.parents[rows].shape))
            return
        pools = (pool.state, ctx.state_slots[rows], *pool.buffers(buf_len), ctx.req_slots[rows])
        if ctx.parents.shape[1] == 1:
            o, u, gcum = ops.decode(query[rows, 0], key[rows, 0], value[rows, 0], g[rows, 0], beta[rows, 0], *pools)
            o, u, gcum = o[:, None], u[:, None], gcum[:, None]
        else:
            o, u, gcum = ops.verify(query[rows], key[rows], value[rows], g[rows], beta[rows],
                                    ctx.parents[rows], ctx.num_nodes[rows], *pools, ancestors=ctx.ancestors[rows])
        out[rows], scratch.value[rows], scratch.gcum[rows] = o, u, gcum

    def _chunked_prefill(self, prefill, ctx, pool, query, key, value, g, beta, out, scratch) -> None:
        """Prompt chains longer than the buffer: chunked delta rule from the committed state; right padding gets
        g = 0 and beta = 0, which leaves the state untouched, so the final state is the one at each row's end."""
        rows = ctx.chunk_rows
        valid = ctx.valid[rows][..., None]  # [Bc, T, 1]
        o, final_state = prefill(
            query[rows], key[rows], value[rows], g[rows] * valid, beta[rows] * valid,
            initial_state=pool.state[ctx.state_slots[rows]],
        )
        out[rows] = o
        scratch.final_state = final_state
