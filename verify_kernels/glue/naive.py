"""The layer glue of Qwen3.5 and Nemotron-H as pure torch references: norms (with the residual add), gated norms,
the mixers' input preparation (GDN: q / k l2norm, gates; Mamba2: splits, dt), activations, and the attention q / k
norm with rotary.

These are the models' own torch code, moved here unchanged, so the CPU path computes what it always has and the
Triton kernels (norm.py, gated_norm.py, gdn_inputs.py, mamba2_inputs.py, activation.py, qk_norm_rotary.py) have an
oracle of the same signature. Every op computes in fp32 and rounds where transformers rounds (its modules are the
models' oracle, tests/test_model_parity.py): the residual sum in the model dtype before it is normalised; products
with a weight in the model dtype where transformers multiplies two model-dtype tensors; rotary and activations in
the model dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool) -> torch.Tensor:
    """x [..., D], weight [D] -> x / rms(x) * w [..., D] in x.dtype; w = 1 + weight with offset (Qwen3.5's
    zero-centred weight), else weight (Nemotron-H). The product is taken in fp32 and rounded once."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    scale = 1.0 + weight.float() if offset else weight.float()
    return (xf * scale).to(x.dtype)


def add_rms_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                     offset: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The pre-norm residual step: s = x + residual (in their dtype) -> (rms_norm(s), s), both [..., D]."""
    total = x + residual
    return rms_norm_ref(total, weight, eps, offset), total


def rms_norm_gated_ref(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float, group_size: int,
                       norm_before_gate: bool) -> torch.Tensor:
    """RMS norm over groups of `group_size` channels, gated by silu(gate); out [..., D] in gate.dtype.

    x [..., D] (the mixer's output, fp32 or the model dtype: rounded to gate.dtype first, as the models cast it),
    gate [..., D] (the model dtype), weight [group_size] (shared by the groups) or [D].
    norm_before_gate (Qwen3.5 GDN, groups = value heads): (w * norm(x)) * silu(gate).
    Otherwise (Nemotron-H Mamba2, groups = n_groups): w * norm(x * silu(gate)).
    """
    dtype = gate.dtype
    xf = x.to(dtype).float()
    z = F.silu(gate.float())
    if not norm_before_gate:
        xf = xf * z
    grouped = xf.unflatten(-1, (-1, group_size))
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
    w = weight if weight.numel() == group_size else weight.unflatten(-1, (-1, group_size))
    out = (w * grouped.to(dtype)).flatten(-2)  # rounded: two model-dtype tensors
    return (out * z).to(dtype) if norm_before_gate else out


def l2_normalize_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """As fla and transformers: x / sqrt(sum x^2 + eps), in fp32."""
    x = x.float()
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)


def gdn_qkv_ref(qkv: torch.Tensor, num_k_heads: int, head_k_dim: int, num_v_heads: int, head_v_dim: int,
                q_scale: float, eps: float = 1e-6, qk_dtype: torch.dtype | None = None,
                qk_storage: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The GDN's conv output split into the delta rule's inputs, contiguous: q and k computed in fp32, rounded to
    qk_dtype (default fp32; the KVBuffer asks for a bf16 / fp16 model's dtype, as fla's chunked kernel rounds them:
    its verify's tensor-core products then skip their remainders, verify_kernels/precision.py) and returned in
    qk_storage (default qk_dtype; fp32 holds the rounded values for the decode, which reads fp32 faster), v in fp32.

    qkv [..., 2 H K + HV V] (q, k, v channels; unit channel stride) -> q [..., H, K] = l2norm(q) * q_scale,
    k [..., H, K] = l2norm(k), v [..., HV, V]."""
    key_dim = num_k_heads * head_k_dim
    query, key, value = qkv.split([key_dim, key_dim, num_v_heads * head_v_dim], dim=-1)
    query = l2_normalize_ref(query.unflatten(-1, (num_k_heads, head_k_dim)), eps) * q_scale
    key = l2_normalize_ref(key.unflatten(-1, (num_k_heads, head_k_dim)), eps)
    qk_dtype = qk_dtype or torch.float32
    qk_storage = qk_storage or qk_dtype
    return (query.to(qk_dtype).to(qk_storage).contiguous(), key.to(qk_dtype).to(qk_storage).contiguous(),
            value.unflatten(-1, (num_v_heads, head_v_dim)).float().contiguous())


def gdn_gates_ref(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,
                  dt_bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b [..., HV] (projections, the model dtype); A_log, dt_bias [HV] -> fp32 (g, beta) [..., HV]:
    g = -exp(A_log) * softplus(a + dt_bias) (log decay), beta = sigmoid(b) (rounded to b's dtype, as computed
    there)."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias)
    return g, b.sigmoid().float()


def act_mul_ref(gate: torch.Tensor, up: torch.Tensor, act: str) -> torch.Tensor:
    """act(gate) * up, [..., D] in gate.dtype; act "silu" (SwiGLU) or "sigmoid" (Qwen3.5's attention output gate).
    The activation is rounded to the dtype before the product, as separate torch ops do."""
    return (F.silu(gate) if act == "silu" else torch.sigmoid(gate)) * up


def relu2_ref(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2 (Nemotron-H's MLP and experts), [..., D] in x.dtype."""
    return F.relu(x).square()


def apply_rotary_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, heads, D]; cos/sin [B, T, R] with R <= D: rotate-half rotary on the first R channels, in the dtype
    of x and cos (rounded after each product and the sum, as transformers computes it)."""
    rotary_dim = cos.shape[-1]
    cos, sin = cos[:, :, None], sin[:, :, None]
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat((-x_rot[..., half:], x_rot[..., :half]), dim=-1)
    return torch.cat((x_rot * cos + rotated * sin, x_pass), dim=-1)


def qk_norm_rotary_ref(query: torch.Tensor, key: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                       cos: torch.Tensor, sin: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3.5 attention: per-head RMS norms with zero-centred weights, then rotary.

    query [B, T, H, D], key [B, T, HKV, D] (unit channel stride; query may be a strided split of q_proj's output),
    q_weight, k_weight [D], cos / sin [B, T, R] (R even, <= D) -> (query, key) [B, T, *, D] in their dtype."""
    query = rms_norm_ref(query, q_weight, eps, offset=True)
    key = rms_norm_ref(key, k_weight, eps, offset=True)
    return apply_rotary_ref(query, cos, sin), apply_rotary_ref(key, cos, sin)


def mamba2_inputs_ref(xbc: torch.Tensor, dt: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor,
                      D: torch.Tensor, num_heads: int, head_dim: int, n_groups: int, state_size: int,
                      dt_limit: tuple[float, float], bc_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, ...]:
    """The Mamba2 conv output split into the SSM's inputs, contiguous: x, dt, A and D in fp32, B and C in bc_dtype
    (default: the conv output's). B and C hold the conv output's values either way; kept in a bf16 / fp16 model's
    dtype they are half the bytes, and the KVBuffer verify's tensor-core products know them exact in TF32 and skip
    their remainders (verify_kernels/precision.py, add_product_exact); the intermediate-state kernel asks for fp32
    (specdec/cache/linear_state.py says why).

    xbc [..., NH P + 2 NG N] (x, B, C channels after the conv; unit channel stride), dt [..., NH] (the raw
    projection, rows may be strided), dt_bias, A_log, D [NH] -> x [..., NH, P], dt = clamp(softplus(dt + dt_bias),
    *dt_limit) [..., NH], B [..., NG, N], C [..., NG, N], A = -exp(A_log) [NH], D [NH]."""
    group_dim = n_groups * state_size
    x, bm, cm = xbc.split([num_heads * head_dim, group_dim, group_dim], dim=-1)
    x = x.unflatten(-1, (num_heads, head_dim)).float().contiguous()
    bm = bm.unflatten(-1, (n_groups, state_size)).to(bc_dtype or xbc.dtype).contiguous()
    cm = cm.unflatten(-1, (n_groups, state_size)).to(bc_dtype or xbc.dtype).contiguous()
    dt = F.softplus(dt.float() + dt_bias.float()).clamp(*dt_limit)
    return x, dt, bm, cm, -A_log.float().exp(), D.float()
