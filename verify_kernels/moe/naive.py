"""Per-row-expert linear map, the one op a mixture-of-experts layer needs twice per token choice, as a pure torch
reference: row r of x goes through the weight of expert expert[r].

    y[r] = weight[expert[r]] @ x[r]

x: [R, K] (R = tokens * top-k assignments), weight: [E, N, K] (stacked experts, as checkpoints store them),
expert: [R] int64 in [0, E). The Triton kernel of the same signature (grouped_linear.py) sorts the rows by expert
without synchronising with the host, so that MoE steps can be captured in CUDA graphs.
"""

import torch
import torch.nn.functional as F


def grouped_linear_ref(x: torch.Tensor, weight: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """y [R, N] in x's dtype (fp32 accumulation): one expert at a time over the experts that rows use."""
    y = torch.empty(x.shape[0], weight.shape[1], dtype=x.dtype, device=x.device)
    for index in expert.unique().tolist():
        rows = (expert == index).nonzero(as_tuple=True)[0]
        y[rows] = F.linear(x[rows].float(), weight[index].float()).to(x.dtype)
    return y
