"""Mixture-of-experts ops as pure torch references, one expert at a time over the experts that rows use.

- grouped_linear_ref: the per-row-expert linear map y[r] = weight[expert[r]] @ x[r], x: [R, K] (R = tokens * top-k
  assignments), weight: [E, N, K] (stacked experts, as checkpoints store them), expert: [R] int64 in [0, E).
  Its Triton kernel (grouped_linear.py) is the unfused path the benchmark times the fused one against.
- moe_experts_ref: a MoE layer's routed experts, out[t] = sum_j top_weight[t, j] expert_{top_index[t, j]}(x[t]),
  expert_e(x) = second[e] @ hidden(first[e] @ x), hidden = act (plain) or act(gate) * up (gated: first stacks
  the gate rows over the up rows). Its Triton kernels: experts.py on the layout of routing.py.
- sigmoid_router_ref: a sigmoid router's top-k experts and their weights (Nemotron-H's). Its Triton kernels:
  router.py, the GEMM, the sigmoid, the bias and the top-k in one or two launches.
- softmax_router_ref: a softmax router's top-k from its logits (Qwen3.5-MoE's). Its Triton kernel: router.py, the
  softmax, the top-k and the renormalisation in one launch.
"""

import torch
import torch.nn.functional as F

# the experts' activations by the names model configs give (hidden_act / mlp_hidden_act)
ACTIVATIONS = {
    "silu": F.silu,
    "relu2": lambda h: F.relu(h).square(),
    "gelu": F.gelu,
}


def grouped_linear_ref(x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """y [R, N] in x's dtype (fp32 accumulation): one expert at a time over the experts that rows use."""
    y = torch.empty(x.shape[0], weight.shape[1], dtype=x.dtype, device=x.device)
    for index in expert.unique().tolist():
        rows = (expert == index).nonzero(as_tuple=True)[0]
        y[rows] = F.linear(x[rows].float(), weight[index].float()).to(x.dtype)
    return y


def moe_experts_ref(
    x: torch.Tensor,
    first: torch.Tensor,
    second: torch.Tensor,
    top_index: torch.Tensor,
    top_weight: torch.Tensor,
    activation: str,
    gated: bool,
) -> torch.Tensor:
    """The weighted sum of each token's k experts, in fp32, returned in top_weight's dtype. The intermediate
    activations and each expert's weighted output are rounded to x's dtype, where the kernels store them (experts.py,
    as production fused-MoE kernels do): the kernels then differ from this only in the order of fp32 sums.

    x: [N, D]; first: [E, F, D] with F = 2 I (gated: gate rows, then up rows) or I; second: [E, D, I];
    top_index: [N, k] int64 in [0, E), k distinct experts a token; top_weight: [N, k]; activation: a name of
    ACTIVATIONS. Returns [N, D].
    """
    act = ACTIVATIONS[activation]
    out = torch.zeros(x.shape[0], second.shape[1], dtype=torch.float32, device=x.device)
    for expert in top_index.unique().tolist():
        token, slot = (top_index == expert).nonzero(as_tuple=True)
        h = F.linear(x[token].float(), first[expert].float())
        if gated:
            gate, up = h.chunk(2, dim=-1)
            h = act(gate) * up
        else:
            h = act(h)
        y = F.linear(h.to(x.dtype).float(), second[expert].float())
        out.index_add_(0, token, (y * top_weight[token, slot, None].float()).to(x.dtype).float())
    return out.to(top_weight.dtype)


def softmax_router_ref(logits: torch.Tensor, top_k: int, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A softmax router's choice from its logits (Qwen3-MoE / Qwen3.5-MoE): probabilities = softmax in fp32, the top_k
    of them renormalised to sum to 1. logits [N, E] -> top_index [N, top_k] int64 (in no particular order) and
    top_weight [N, top_k] in out_dtype (the model's)."""
    probs = logits.softmax(dim=-1, dtype=torch.float)
    top_weight, top_index = probs.topk(top_k, dim=-1)
    top_weight = top_weight / top_weight.sum(dim=-1, keepdim=True)
    return top_index, top_weight.to(out_dtype)


def sigmoid_router_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, num_groups: int,
                       topk_group: int, norm_topk_prob: bool, scaling: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A sigmoid router with a correction bias and group-limited top-k (Nemotron-H, DeepSeek-V3), in fp32.

    x [N, D]; weight [E, D]; bias [E] (e_score_correction_bias). scores = sigmoid(x weight^T); the choice is scores +
    bias, restricted to the `topk_group` best of `num_groups` groups of experts (a group scores the sum of its two
    best choices); the weights are the chosen experts' raw scores, renormalised to sum to 1 if norm_topk_prob, times
    `scaling`. Returns top_index [N, top_k] int64 (in no particular order) and top_weight [N, top_k] fp32."""
    num_experts = weight.shape[0]
    scores = F.linear(x.float(), weight.float()).sigmoid()  # [N, E]
    choice = scores + bias.float()
    per_group = choice.view(-1, num_groups, num_experts // num_groups)
    group_score = per_group.topk(2, dim=-1).values.sum(dim=-1)  # [N, groups]
    best_groups = group_score.topk(topk_group, dim=-1, sorted=False).indices
    group_mask = torch.zeros_like(group_score).scatter_(1, best_groups, 1.0).bool()
    expert_mask = group_mask[:, :, None].expand_as(per_group).reshape(-1, num_experts)
    choice = choice.masked_fill(~expert_mask, float("-inf"))
    top_index = choice.topk(top_k, dim=-1, sorted=False).indices
    top_weight = scores.gather(1, top_index)
    if norm_topk_prob:
        top_weight = top_weight / (top_weight.sum(dim=-1, keepdim=True) + 1e-20)
    return top_index, top_weight * scaling
