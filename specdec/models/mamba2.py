"""Nemotron-H Mamba2 mixer running on the KVBuffer cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.backend import backend_for, conv_ops, mamba2_ops
from specdec.cache.linear_pool import LinearScratch
from specdec.cache.spec import LinearLayerSpec

from .layers import GroupGatedRMSNorm


class Mamba2Mixer(nn.Module):
    """in_proj -> (z, xBC, dt); causal conv + SiLU on xBC; SSM with grouped B/C through the KVBuffer; gated group
    RMSNorm with z; out_proj.

    NH = mamba_num_heads, P = mamba_head_dim, NG = n_groups, N = ssm_state_size.
    dt = softplus(dt + dt_bias) clamped to config.time_step_limit, identically for prefill, decode and verify.
    (transformers' NemotronH clamps at time_step_min in its chunked path only; mamba_ssm, vLLM and SGLang use
    the configured limit, by default (0, inf), which is what we follow.)
    """

    def __init__(self, config, linear_index: int):
        super().__init__()
        self.linear_index = linear_index
        self.num_heads = config.mamba_num_heads
        self.head_dim = config.mamba_head_dim
        self.n_groups = config.n_groups
        self.state_size = config.ssm_state_size
        if self.num_heads % self.n_groups:
            raise ValueError(f"mamba_num_heads ({self.num_heads}) must be a multiple of n_groups ({self.n_groups})")
        self.intermediate_size = self.num_heads * self.head_dim
        self.conv_dim = self.intermediate_size + 2 * self.n_groups * self.state_size
        self.conv_kernel_size = config.conv_kernel
        low, high = config.time_step_limit
        self.time_step_limit = (float(low), float(high))
        hidden = config.hidden_size

        self.in_proj = nn.Linear(hidden, self.intermediate_size + self.conv_dim + self.num_heads, bias=config.use_bias)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.conv_kernel_size, groups=self.conv_dim,
                                bias=config.use_conv_bias, padding=self.conv_kernel_size - 1)
        self.dt_bias = nn.Parameter(torch.ones(self.num_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_heads))
        self.D = nn.Parameter(torch.ones(self.num_heads))
        self.norm = GroupGatedRMSNorm(self.intermediate_size, self.intermediate_size // self.n_groups,
                                      eps=config.layer_norm_epsilon)
        self.out_proj = nn.Linear(self.intermediate_size, hidden, bias=config.use_bias)

    def cache_spec(self) -> LinearLayerSpec:
        return LinearLayerSpec(
            mixer="mamba2",
            key_shape=(self.n_groups, self.state_size),
            value_shape=(self.num_heads, self.head_dim),
            decay_heads=self.num_heads,
            state_shape=(self.num_heads, self.head_dim, self.state_size),
            conv_dim=self.conv_dim,
            conv_width=self.conv_kernel_size,
        )

    def forward(self, hidden: torch.Tensor, ctx, cache) -> torch.Tensor:
        """hidden [B, T, D] -> [B, T, D]; reads the layer's pool, leaves what commit needs in ctx.scratch."""
        batch, width, _ = hidden.shape
        pool = cache.linear[self.linear_index]
        backend = backend_for(hidden.device, self.head_dim, self.state_size)
        ops = mamba2_ops(backend)
        gate, xbc, dt = self.in_proj(hidden).split([self.intermediate_size, self.conv_dim, self.num_heads], dim=-1)
        conv_out = conv_ops(backend).tree(
            xbc, ctx.parents, ctx.num_nodes, pool.conv, ctx.req_slots, self.conv1d.weight[:, 0], self.conv1d.bias,
            "silu",
        )
        x, bm, cm = conv_out.split(
            [self.intermediate_size, self.n_groups * self.state_size, self.n_groups * self.state_size], dim=-1
        )
        # contiguous fp32 (the kernels take contiguous rows; splits of conv_out are strided views)
        x = x.unflatten(-1, (self.num_heads, self.head_dim)).float().contiguous()
        bm = bm.unflatten(-1, (self.n_groups, self.state_size)).float().contiguous()
        cm = cm.unflatten(-1, (self.n_groups, self.state_size)).float().contiguous()
        dt = F.softplus(dt.float() + self.dt_bias.float()).clamp(*self.time_step_limit)  # [B, T, NH]
        a_neg = -self.A_log.float().exp()
        d_skip = self.D.float()

        out = torch.zeros(batch, width, self.num_heads, self.head_dim, device=hidden.device)
        scratch = LinearScratch(conv_input=xbc, key=bm, value=torch.zeros_like(x), gcum=torch.zeros_like(dt))
        if ctx.tree_rows.numel():
            rows = ctx.tree_index
            pools = (pool.state, ctx.state_slots[rows], *pool.buffers(cache.buf_len_device), ctx.req_slots[rows])
            if pool.intermediate is not None:  # the baseline: one state per node, kept for commit
                out[rows], scratch.node_states = pool.intermediate.tree(
                    x[rows], dt[rows], a_neg, bm[rows], cm[rows], d_skip, ctx.parents[rows], ctx.num_nodes[rows],
                    pool.state, ctx.state_slots[rows], in_place=width == 1,
                    states_out=pool.node_states_for(*ctx.parents[rows].shape))
            else:
                if width == 1:
                    y, xdt, gcum = ops.decode(x[rows, 0], dt[rows, 0], a_neg, bm[rows, 0], cm[rows, 0], d_skip,
                                              *pools)
                    y, xdt, gcum = y[:, None], xdt[:, None], gcum[:, None]
                else:
                    y, xdt, gcum = ops.verify(x[rows], dt[rows], a_neg, bm[rows], cm[rows], d_skip,
                                              ctx.parents[rows], ctx.num_nodes[rows], *pools,
                                              ancestors=ctx.ancestors[rows])
                out[rows], scratch.value[rows], scratch.gcum[rows] = y, xdt, gcum
        if ctx.chunk_rows.numel():
            # Right padding gets dt = 0: no decay, no input, so the final state is the one at each row's end.
            rows = ctx.chunk_rows
            y, final_state = ops.chunk_prefill(
                x[rows], dt[rows] * ctx.valid[rows][..., None], a_neg, bm[rows], cm[rows], d_skip,
                initial_state=pool.state[ctx.state_slots[rows]],
            )
            out[rows] = y
            scratch.final_state = final_state
        ctx.scratch[self.linear_index] = scratch

        out = self.norm(out.flatten(-2).to(hidden.dtype), gate)
        return self.out_proj(out)
