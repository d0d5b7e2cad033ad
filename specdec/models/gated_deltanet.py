"""Qwen3.5 Gated DeltaNet layer running on the KVBuffer cache."""

from __future__ import annotations

import torch
from torch import nn

from specdec.cache.linear_state import MixerInputs
from specdec.cache.spec import LinearLayerSpec
from specdec.parallel import SINGLE, TensorParallel, column_linear, row_linear, shard_parameters
from verify_kernels.conv import GateInputs, QKVHeads

from .layers import GatedRMSNorm
from .merged import merge_linears, merged_outputs


class GatedDeltaNet(nn.Module):
    """in_proj_qkv -> causal conv (k=4) + SiLU -> (q, k, v); g = -exp(A_log) * softplus(a + dt_bias); beta = sigmoid(b);
    delta rule per value head through the KVBuffer; gated RMSNorm with z; out_proj.

    H = linear_num_key_heads, HV = linear_num_value_heads (value head h reads key head h // (HV / H)).
    Under tensor parallelism (specdec.parallel) the layer holds H / size key heads and the value heads reading
    them; every count and dim below is the rank's.
    """

    def __init__(self, config, linear_index: int, tp: TensorParallel = SINGLE):
        super().__init__()
        self.linear_index = linear_index
        key_heads, value_heads = config.linear_num_key_heads, config.linear_num_value_heads
        if value_heads % key_heads:
            raise ValueError(
                f"linear_num_value_heads ({value_heads}) must be a multiple of linear_num_key_heads ({key_heads})"
            )
        self.num_k_heads = tp.divide(key_heads, "linear_num_key_heads")
        self.num_v_heads = value_heads // tp.size  # the value heads of the rank's key heads
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        self.key_dim = self.num_k_heads * self.head_k_dim
        self.value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.conv_kernel_size = config.linear_conv_kernel_dim
        hidden = config.hidden_size
        full_key, full_value = key_heads * self.head_k_dim, value_heads * self.head_v_dim
        qkv = tp.split(0, full_key, full_key, full_value)  # the rank's heads of each of q, k, v

        self.in_proj_qkv = column_linear(hidden, qkv.full_size, tp, shard=qkv)
        self.in_proj_z = column_linear(hidden, full_value, tp)
        self.in_proj_b = column_linear(hidden, value_heads, tp)
        self.in_proj_a = column_linear(hidden, value_heads, tp)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.conv_kernel_size, groups=self.conv_dim,
                                bias=False, padding=self.conv_kernel_size - 1)
        shard_parameters(self.conv1d, tp, weight=qkv)  # depthwise: the conv channels are in_proj_qkv's outputs
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads))
        shard_parameters(self, tp, dt_bias=tp.split(0, value_heads), A_log=tp.split(0, value_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, eps=config.rms_norm_eps)
        self.out_proj = row_linear(full_value, hidden, tp)  # all-reduce
        self.in_proj_zba: torch.Tensor | None = None  # in_proj_z's, _b's and _a's merged weight (merge_projections)

    def gate_projections(self) -> list[nn.Linear]:
        return [self.in_proj_z, self.in_proj_b, self.in_proj_a]

    def merge_projections(self) -> None:
        """in_proj_z, in_proj_b and in_proj_a as one GEMM from now on (specdec/models/merged.py). in_proj_qkv stays
        apart: its output, the conv's input, is kept in the step's scratch until the commit, and a split of a wider
        output would keep the whole of it (+50% of that scratch at Qwen3.5-9B's shapes, in every layer)."""
        self.in_proj_zba = merge_linears(self.gate_projections())

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
        pool = cache.linear[self.linear_index]
        mixed = self.in_proj_qkv(hidden)  # [B, T, conv_dim], pre-conv
        # [B, T, value_dim], [B, T, HV] twice: one GEMM once merged (strided rows)
        z, b, a = merged_outputs(hidden, self.in_proj_zba, self.gate_projections())
        # the conv (SiLU), then contiguous q, k (l2-normalised as fla and transformers, q scaled) [B, T, H, K],
        # rounded to the model's dtype or fp32 as the linear state takes them (keys_in_model_dtype), and fp32 v
        # [B, T, HV, V], in one op (verify_kernels/conv/conv_qkv.py). Rounded keys are stored in the model's dtype for
        # a verify (its products skip their remainders) and in fp32 for a decode (one token a row: the GDN decode ran
        # 10% slower on bf16 keys, H200 2026-12-04, with the same registers and all but the same SASS:
        # benchmarks/results/sweeps_h200/probe_gdn_decode_keys_2026-12-04f.txt)
        qk_dtype = mixed.dtype if pool.linear_state.keys_in_model_dtype else None
        qk_storage = torch.float32 if hidden.shape[1] == 1 else None
        # and in the same op g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b): fp32 [B, T, HV] (one launch
        # a layer and step less than the gates' own kernel)
        heads = QKVHeads(self.num_k_heads, self.head_k_dim, self.num_v_heads, self.head_v_dim)
        query, key, value, g, beta = pool.short_conv_qkv(ctx, mixed, self.conv1d.weight[:, 0], heads,
                                                         self.head_k_dim**-0.5, qk_dtype, qk_storage,
                                                         GateInputs(a, b, self.A_log, self.dt_bias))
        # the delta rule through the layer's linear state (tree rows) or the chunked prefill (chunk rows);
        # entries keep the key, chunk rows zero g and beta at padding nodes
        inputs = MixerInputs((query, key, value, g, beta), entry_key=1, padding_masked=(3, 4))
        out, ctx.scratch[self.linear_index] = pool.score(ctx, inputs, mixed, cache.buf_len_device)

        return self.out_proj(self.norm(out.flatten(-2), z))  # norm per value head, then gate
