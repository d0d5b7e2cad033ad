"""Nemotron-H Mamba2 mixer running on the KVBuffer cache."""

from __future__ import annotations

import torch
from torch import nn

from specdec.cache.linear_state import MixerInputs
from specdec.cache.spec import LinearLayerSpec
from specdec.parallel import SINGLE, TensorParallel, column_linear, row_linear, shard_parameters

from .layers import GroupGatedRMSNorm, glue_for


class Mamba2Mixer(nn.Module):
    """in_proj -> (z, xBC, dt); causal conv + SiLU on xBC; SSM with grouped B/C through the KVBuffer; gated group
    RMSNorm with z; out_proj.

    NH = mamba_num_heads, P = mamba_head_dim, NG = n_groups, N = ssm_state_size.
    dt = softplus(dt + dt_bias) clamped to config.time_step_limit, identically for prefill, decode and verify.
    (transformers' NemotronH clamps at time_step_min in its chunked path only; mamba_ssm, vLLM and SGLang use
    the configured limit, by default (0, inf), which is what we follow.)
    Under tensor parallelism (specdec.parallel) the layer holds NG / size groups and their heads (head h reads group
    h // (NH / NG)); every count and dim below is the rank's.
    """

    def __init__(self, config, linear_index: int, tp: TensorParallel = SINGLE):
        super().__init__()
        self.linear_index = linear_index
        heads, groups = config.mamba_num_heads, config.n_groups
        if heads % groups:
            raise ValueError(f"mamba_num_heads ({heads}) must be a multiple of n_groups ({groups})")
        # groups split, not shared: the output norm normalises over a group's channels, which must sit on one rank
        self.n_groups = tp.divide(groups, "n_groups")
        self.num_heads = heads // tp.size  # the heads of the rank's groups
        self.head_dim = config.mamba_head_dim
        self.state_size = config.ssm_state_size
        self.intermediate_size = self.num_heads * self.head_dim
        self.conv_dim = self.intermediate_size + 2 * self.n_groups * self.state_size
        self.conv_kernel_size = config.conv_kernel
        low, high = config.time_step_limit
        self.time_step_limit = (float(low), float(high))
        hidden = config.hidden_size
        inner, group_dims = heads * self.head_dim, groups * self.state_size
        xbc = (inner, group_dims, group_dims)  # the conv channels: x, B, C
        in_proj = tp.split(0, inner, *xbc, heads)  # the rank's z, x, B, C and dt

        self.in_proj = column_linear(hidden, in_proj.full_size, tp, bias=config.use_bias, shard=in_proj)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.conv_kernel_size, groups=self.conv_dim,
                                bias=config.use_conv_bias, padding=self.conv_kernel_size - 1)
        shard_parameters(self.conv1d, tp, weight=tp.split(0, *xbc), **({"bias": tp.split(0, *xbc)}
                                                                       if config.use_conv_bias else {}))
        self.dt_bias = nn.Parameter(torch.ones(self.num_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_heads))
        self.D = nn.Parameter(torch.ones(self.num_heads))
        shard_parameters(self, tp, **{name: tp.split(0, heads) for name in ("dt_bias", "A_log", "D")})
        self.norm = GroupGatedRMSNorm(self.intermediate_size, self.intermediate_size // self.n_groups,
                                      eps=config.layer_norm_epsilon)
        shard_parameters(self.norm, tp, weight=tp.split(0, inner))
        self.out_proj = row_linear(inner, hidden, tp, bias=config.use_bias)  # all-reduce

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
        pool = cache.linear[self.linear_index]
        gate, xbc, dt = self.in_proj(hidden).split([self.intermediate_size, self.conv_dim, self.num_heads], dim=-1)
        conv_out = pool.short_conv(ctx, xbc, self.conv1d.weight[:, 0], self.conv1d.bias, "silu")
        # fp32 contiguous x [B, T, NH, P], dt = softplus(dt + dt_bias) clamped [B, T, NH], B and C [B, T, NG, N]
        # in the model's dtype or fp32 as the linear state takes them (keys_in_model_dtype), A = -exp(A_log), D [NH]
        # (the kernels take contiguous rows; splits of conv_out are strided views)
        bc_dtype = None if pool.linear_state.keys_in_model_dtype else torch.float32
        x, dt, bm, cm, A, D = glue_for(hidden, self.A_log, self.dt_bias, self.D).mamba2_inputs(
            conv_out, dt, self.dt_bias, self.A_log, self.D, self.num_heads, self.head_dim, self.n_groups,
            self.state_size, self.time_step_limit, bc_dtype=bc_dtype)
        # the SSM through the layer's linear state (tree rows) or the chunked prefill (chunk rows): the ops take
        # (x, dt, A, B, C, D); entries keep B, chunk rows zero dt at padding nodes (no decay, no input)
        inputs = MixerInputs((x, dt, bm, cm), entry_key=2, padding_masked=(1,), constants=(A, D),
                             constant_positions=(2, 5))
        out, ctx.scratch[self.linear_index] = pool.score(ctx, inputs, xbc, cache.buf_len_device)

        return self.out_proj(self.norm(out.flatten(-2), gate))
