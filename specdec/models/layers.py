"""Small building blocks shared by the Qwen3.5 and Nemotron-H runtimes: norms, rotary embedding, MLPs.

Every module keeps the parameter names of the Hugging Face checkpoints, so loading is a name-for-name copy. The
arithmetic is the layer glue of verify_kernels/glue, picked per call by specdec.backend.glue_ops_for: the torch
references (the numerics transformers has) on CPU, the fused Triton kernels on CUDA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from specdec.backend import GlueOps, glue_ops, glue_ops_for
from specdec.parallel import SINGLE, TensorParallel, column_linear, row_linear
from verify_kernels.glue.naive import apply_rotary_ref

from .merged import merge_linears, merged_outputs

ACTIVATIONS = {
    "silu": F.silu,
    "relu2": lambda x: F.relu(x).square(),
    "gelu": F.gelu,
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported activation {name!r}; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def glue_for(x: torch.Tensor, *tensors: torch.Tensor | None) -> GlueOps:
    """The glue ops for x's device (specdec.backend.glue_ops_for). The fused kernels have no backward, so wherever
    autograd records through x or `tensors` (parameters: training a head built of these modules) the references
    run."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, *tensors)):
        return glue_ops("reference")
    return glue_ops_for(x.device)


def apply_act(name: str, x: torch.Tensor) -> torch.Tensor:
    """act(x); relu2 as one fused op."""
    if name == "relu2":
        return glue_for(x).relu2(x)
    return activation(name)(x)


def act_and_mul(name: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """act(gate) * up (gate and up may be two halves of one projection); silu as one fused op."""
    if name == "silu":
        return glue_for(gate, up).act_mul(gate, up, "silu")
    return activation(name)(gate) * up


class RMSNorm(nn.Module):
    """Plain RMSNorm (Nemotron-H): w * x / rms(x), the product kept in fp32 and cast back at the end.

    forward(x) -> norm(x); forward(x, residual) -> (norm(x + residual), x + residual): the residual stream's add
    fused into the norm that follows it (the decoder layers pass the residual along)."""

    offset = False  # scale by 1 + weight (a zero-centred weight)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim) if self.offset else torch.ones(dim))

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        ops = glue_for(x, residual, self.weight)
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps, self.offset)
        return ops.add_rms_norm(x, residual, self.weight, self.eps, self.offset)


class OffsetRMSNorm(RMSNorm):
    """Qwen3.5 RMSNorm: x / rms(x) * (1 + w), computed in fp32; the weight is stored zero-centred."""

    offset = True


class GatedRMSNorm(nn.Module):
    """Qwen3.5 GDN output norm, per value head: (w * x / rms(x)) * silu(z); normalise first, then gate."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x [..., HV * V] (the mixer's output, any float dtype), gate [..., HV * V] -> [..., HV * V] in gate's
        dtype; the norm is per head of V = dim channels."""
        ops = glue_for(x, gate, self.weight)
        return ops.rms_norm_gated(x, gate, self.weight, self.eps, self.weight.numel(), True)


class GroupGatedRMSNorm(nn.Module):
    """Mamba2 output norm (Nemotron-H): gate first (x * silu(z)), then RMS-normalise each group of channels."""

    def __init__(self, dim: int, group_size: int, eps: float):
        super().__init__()
        self.eps = eps
        self.group_size = group_size
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """x [..., D] (the mixer's output, any float dtype), gate [..., D] -> [..., D] in gate's dtype."""
        return glue_for(x, gate, self.weight).rms_norm_gated(x, gate, self.weight, self.eps, self.group_size, False)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding over the first `rotary_dim` channels of each head (partial rotary).

    Qwen3.5 describes its rotary with mRoPE sections (temporal, height, width) interleaved over the frequency
    channels. For text every token has the same position on the three axes, so the sections select identical
    frequencies and the embedding reduces to 1-D rotary over `rotary_dim`; we check the sections cover exactly
    rotary_dim / 2 frequencies so that a config we would misread fails loudly.
    """

    SUPPORTED = ("default", "linear", "yarn", "llama3")

    def __init__(self, config, head_dim: int):
        super().__init__()
        params = dict(getattr(config, "rope_parameters", None) or {})
        rope_type = params.get("rope_type", "default")
        if rope_type not in self.SUPPORTED:
            raise ValueError(
                f"rope_type {rope_type!r} is not supported; supported: {self.SUPPORTED}. Position-dependent "
                "(dynamic / longrope) scaling would make a token's keys depend on the sequence length."
            )
        partial = params.get("partial_rotary_factor", 1.0)
        self.rotary_dim = int(head_dim * partial)
        if rope_type == "default":
            base = params["rope_theta"]
            inv_freq = 1.0 / (base ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.float) / self.rotary_dim))
            self.attention_scaling = 1.0
        else:
            inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config)
        sections = params.get("mrope_section")
        if sections is not None and sum(sections) != inv_freq.numel():
            raise ValueError(
                f"mrope_section {sections} covers {sum(sections)} frequencies but the rotary dimension "
                f"{self.rotary_dim} has {inv_freq.numel()}; check partial_rotary_factor and head_dim in config.json"
            )
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] int -> (cos, sin) [B, T, rotary_dim] in `dtype`."""
        freqs = positions.float()[..., None] * self.inv_freq.to(positions.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)


apply_rotary = apply_rotary_ref  # x [B, T, heads, D]; cos/sin [B, T, R]: rotate-half rotary on the first R channels


class GatedMLP(nn.Module):
    """SwiGLU MLP (Qwen3.5): down(act(gate(x)) * up(x)); under tensor parallelism gate / up column-parallel,
    down row-parallel (all-reduce)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, tp: TensorParallel = SINGLE):
        super().__init__()
        tp.divide(intermediate_size, "intermediate_size")
        self.gate_proj = column_linear(hidden_size, intermediate_size, tp)
        self.up_proj = column_linear(hidden_size, intermediate_size, tp)
        self.down_proj = row_linear(intermediate_size, hidden_size, tp)
        activation(act)  # a name we know
        self.act = act
        self.gate_up: torch.Tensor | None = None  # gate_proj's and up_proj's merged weight (merge_projections)

    def merge_projections(self) -> None:
        """gate_proj and up_proj as one GEMM from now on (specdec/models/merged.py)."""
        self.gate_up = merge_linears([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = merged_outputs(x, self.gate_up, [self.gate_proj, self.up_proj])
        return self.down_proj(act_and_mul(self.act, gate, up))


class PlainMLP(nn.Module):
    """Ungated MLP (Nemotron-H, relu2 by default): down(act(up(x))); under tensor parallelism up column-parallel,
    down row-parallel (all-reduce)."""

    def __init__(self, hidden_size: int, intermediate_size: int, act: str, bias: bool = False,
                 tp: TensorParallel = SINGLE):
        super().__init__()
        tp.divide(intermediate_size, "intermediate_size")
        self.up_proj = column_linear(hidden_size, intermediate_size, tp, bias=bias)
        self.down_proj = row_linear(intermediate_size, hidden_size, tp, bias=bias)
        activation(act)  # a name we know
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(apply_act(self.act, self.up_proj(x)))
