"""Mixture-of-experts blocks: Qwen3.5-MoE (softmax router, gated experts, gated shared expert) and Nemotron-H
(sigmoid router with correction bias and group-limited top-k, relu2 experts, optional latent projection).

Expert weights are stored stacked, as transformers does: gate_up_proj [E, 2I, D] / up_proj [E, I, D],
down_proj [E, D, I]. The loader also accepts checkpoints with one tensor per expert.

Tensor parallelism (specdec.parallel) shards every expert as an MLP: each rank holds all E experts with I / size
of their intermediate channels (first column-, second row-parallel), so routing, replicated, needs no exchange of
tokens and each rank's experts produce partial sums, all-reduced once; the shared expert is an MLP sharded alike.
(Expert parallelism, whole experts per rank, would exchange tokens twice per block: left for measurement.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specdec.backend import backend_for
from specdec.parallel import SINGLE, TensorParallel, all_reduce, shard_parameters
from verify_kernels.moe import sigmoid_router_ref, softmax_router_ref

from .expert_traffic import count_touched
from .layers import GatedMLP, PlainMLP, act_and_mul, activation, apply_act

# The experts run as the fused Triton experts where the backend is Triton (CUDA): no host synchronisation, so MoE
# steps are captured in CUDA graphs. Elsewhere: torch's grouped GEMM (torch.nn.functional.grouped_mm, in recent
# releases; under torch 2.11 on the H200 it copies to the host inside, so it could not be captured), else a loop.
GROUPED_MM = getattr(F, "grouped_mm", None)


class StackedExperts(nn.Module):
    """E experts as stacked weights: expert e maps x [D] to second[e] @ hidden_fn(first[e] @ x), first [E, F, D],
    second [E, D, I]. Subclasses name the two tensors as checkpoints do and define hidden_fn ([.., F] -> [.., I])."""

    first: torch.Tensor
    second: torch.Tensor
    gated = False  # hidden_fn is act(gate) * up of first's two halves (gate rows first), not act(h)

    def hidden_fn(self, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @property
    def grouped(self) -> bool:
        """Whether the experts run as grouped GEMMs: torch has one and the rows are multiples of 16 bytes."""
        size = self.first.element_size()
        dims = (self.first.shape[1], self.first.shape[2], self.second.shape[2])
        return GROUPED_MM is not None and all(dim * size % 16 == 0 for dim in dims)

    traffic: torch.Tensor | None = None  # benchmarks: distinct experts touched, counted (expert_traffic.py)

    def forward(self, x: torch.Tensor, top_index: torch.Tensor, top_weight: torch.Tensor) -> torch.Tensor:
        """x [N, D]; top_index, top_weight [N, k] -> sum_k weight * expert(x) [N, D] in top_weight's dtype."""
        if self.traffic is not None:
            count_touched(self.traffic, top_index, self.first.shape[0])
        if backend_for(x.device) == "triton":
            return self._kernel(x, top_index, top_weight)
        if self.grouped:
            return self._grouped(x, top_index, top_weight)
        return self._looped(x, top_index, top_weight)

    def _kernel(self, x, top_index, top_weight):
        """The fused Triton experts (verify_kernels.moe.moe_experts): static shapes, no host synchronisation."""
        from verify_kernels.moe import moe_experts  # needs triton (Linux); only reached with it
        return moe_experts(x, self.first, self.second, top_index, top_weight, self.act, self.gated)

    def _grouped(self, x, top_index, top_weight):
        num_tokens, k = top_index.shape
        flat = top_index.flatten()  # [N k] assignments
        order = flat.argsort(stable=True)  # assignments grouped by expert
        token = order // k
        ends = torch.bincount(flat, minlength=self.first.shape[0]).cumsum(0).to(torch.int32)  # [E] group ends
        h = GROUPED_MM(x[token], self.first.transpose(1, 2), offs=ends)  # [N k, F]
        y = GROUPED_MM(self.hidden_fn(h), self.second.transpose(1, 2), offs=ends)  # [N k, D]
        weighted = (y * top_weight.flatten()[order, None]).to(top_weight.dtype)
        out = torch.zeros(num_tokens, x.shape[1], dtype=top_weight.dtype, device=x.device)
        return out.index_add_(0, token, weighted)

    def _looped(self, x, top_index, top_weight):
        """One expert at a time over the experts hit (data-dependent shapes: not capturable)."""
        out = torch.zeros(x.shape[0], x.shape[1], dtype=top_weight.dtype, device=x.device)
        for expert in top_index.unique().tolist():
            token, slot = (top_index == expert).nonzero(as_tuple=True)
            expert_out = F.linear(self.hidden_fn(F.linear(x[token], self.first[expert])), self.second[expert])
            out.index_add_(0, token, (expert_out * top_weight[token, slot, None]).to(out.dtype))
        return out


class Qwen35Experts(StackedExperts):
    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, act: str,
                 tp: TensorParallel = SINGLE):
        super().__init__()
        local = tp.divide(intermediate_size, "moe_intermediate_size")
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * local, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, local))
        # the rank's channels of the gate half and of the up half; down_proj's matching input channels
        shard_parameters(self, tp, gate_up_proj=tp.split(1, intermediate_size, intermediate_size),
                         down_proj=tp.split(2, intermediate_size))
        activation(act)  # a name we know
        self.act = act

    first = property(lambda self: self.gate_up_proj)
    second = property(lambda self: self.down_proj)
    gated = True

    def hidden_fn(self, h: torch.Tensor) -> torch.Tensor:
        gate, up = h.chunk(2, dim=-1)
        return act_and_mul(self.act, gate, up)  # read in place: one kernel on the glue backend


class Qwen35Router(nn.Module):
    def __init__(self, num_experts: int, hidden_size: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden_size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, D] -> (top_index [N, k], top_weight [N, k] in x's dtype): softmax, top-k, renormalised over the k;
        after the logits' GEMM one Triton kernel where the backend is Triton (verify_kernels/moe/router.py), else
        the torch reference."""
        logits = F.linear(x, self.weight)
        if backend_for(x.device) == "triton":
            from verify_kernels.moe import softmax_router  # needs triton (Linux); only reached with it
            return softmax_router(logits, self.top_k, x.dtype)
        return softmax_router_ref(logits, self.top_k, x.dtype)


class Qwen35SparseMoe(nn.Module):
    def __init__(self, config, tp: TensorParallel = SINGLE):
        super().__init__()
        hidden = config.hidden_size
        self.tp = tp
        self.gate = Qwen35Router(config.num_experts, hidden, config.num_experts_per_tok)
        self.experts = Qwen35Experts(config.num_experts, hidden, config.moe_intermediate_size, config.hidden_act, tp)
        self.shared_expert = GatedMLP(hidden, config.shared_expert_intermediate_size, config.hidden_act, tp)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.reshape(-1, hidden.shape[-1])
        top_index, top_weight = self.gate(x)
        routed = all_reduce(self.experts(x, top_index, top_weight).to(x.dtype), self.tp)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return (routed + shared).view_as(hidden)


class NemotronExperts(StackedExperts):
    def __init__(self, num_experts: int, input_dim: int, intermediate_size: int, act: str,
                 tp: TensorParallel = SINGLE):
        super().__init__()
        local = tp.divide(intermediate_size, "moe_intermediate_size")
        self.up_proj = nn.Parameter(torch.empty(num_experts, local, input_dim))
        self.down_proj = nn.Parameter(torch.empty(num_experts, input_dim, local))
        shard_parameters(self, tp, up_proj=tp.split(1, intermediate_size), down_proj=tp.split(2, intermediate_size))
        activation(act)  # a name we know
        self.act = act

    first = property(lambda self: self.up_proj)
    second = property(lambda self: self.down_proj)

    def hidden_fn(self, h: torch.Tensor) -> torch.Tensor:
        return apply_act(self.act, h)


class NemotronRouter(nn.Module):
    """Sigmoid scores; choice = scores + e_score_correction_bias restricted to the top `topk_group` groups (a group
    scores the sum of its two best experts); weights = the chosen experts' raw scores, optionally renormalised,
    times routed_scaling_factor. All in fp32."""

    def __init__(self, config):
        super().__init__()
        self.num_experts = config.n_routed_experts
        self.top_k = config.num_experts_per_tok
        self.num_groups = config.n_group
        self.topk_group = config.topk_group
        self.norm_topk_prob = config.norm_topk_prob
        self.scaling = config.routed_scaling_factor
        self.weight = nn.Parameter(torch.zeros(self.num_experts, config.hidden_size))
        self.register_buffer("e_score_correction_bias", torch.zeros(self.num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, D] -> top_index [N, top_k], top_weight [N, top_k] fp32: one Triton kernel where the backend is
        Triton and every group is eligible (verify_kernels/moe/router.py), else the torch reference."""
        bias = self.e_score_correction_bias
        if backend_for(x.device) == "triton" and self.topk_group == self.num_groups:
            from verify_kernels.moe import sigmoid_router  # needs triton (Linux); only reached with it
            return sigmoid_router(x, self.weight, bias, self.top_k, self.norm_topk_prob, self.scaling)
        return sigmoid_router_ref(x, self.weight, bias, self.top_k, self.num_groups, self.topk_group,
                                  self.norm_topk_prob, self.scaling)


class NemotronMoe(nn.Module):
    """Under tensor parallelism the routed experts' partial sums are all-reduced in the latent dim (smaller than the
    hidden one), before the replicated fc2_latent_proj; the shared experts all-reduce on their own."""

    def __init__(self, config, tp: TensorParallel = SINGLE):
        super().__init__()
        hidden = config.hidden_size
        latent = config.moe_latent_size
        self.tp = tp
        self.gate = NemotronRouter(config)
        self.experts = NemotronExperts(config.n_routed_experts, latent or hidden, config.moe_intermediate_size,
                                       config.mlp_hidden_act, tp)
        self.shared_experts = PlainMLP(hidden, config.moe_shared_expert_intermediate_size, config.mlp_hidden_act,
                                       bias=config.mlp_bias, tp=tp)
        if latent is not None:
            self.fc1_latent_proj = nn.Linear(hidden, latent, bias=config.mlp_bias)
            self.fc2_latent_proj = nn.Linear(latent, hidden, bias=config.mlp_bias)
        else:
            self.fc1_latent_proj = nn.Identity()
            self.fc2_latent_proj = nn.Identity()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.reshape(-1, hidden.shape[-1])
        top_index, top_weight = self.gate(x)
        routed = all_reduce(self.experts(self.fc1_latent_proj(x), top_index, top_weight).to(x.dtype), self.tp)
        return self.fc2_latent_proj(routed).view_as(hidden) + self.shared_experts(hidden)
