"""Tree-aware short causal depthwise conv1d in pure torch (the conv in front of the GDN and Mamba2 mixers).

As transformers' causal_conv1d_fn / causal_conv1d_update: y[c] = act(bias[c] + sum_w weight[c, w] win[c, w])
over a window of W inputs, oldest first, the token itself last. A token's window is its W - 1 predecessors
along ITS path: draft ancestors first, then the committed history. Each committed request keeps its last
W - 1 pre-conv inputs in `conv_pool` [R, D, W - 1] (column -1 = the most recent; zeros for a fresh request,
which is what zero left-padding gives), indexed by `req_slots` [B]. Trees are `parents` [B, T] and
`num_nodes` [B] as in verify_kernels.tree; padding nodes give zeros and never reach valid ones.
"""

import torch
import torch.nn.functional as F

from verify_kernels.tree import check_tree


def tree_conv_windows_ref(
    x: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    conv_pool: torch.Tensor,
    req_slots: torch.Tensor,
) -> torch.Tensor:
    """Conv input window of every node, gathered through parent pointers.

    x: [B, T, D] pre-conv inputs of the nodes; parents: [B, T] int64; num_nodes: [B] int64;
    conv_pool: [R, D, W - 1]; req_slots: [B] int64. Returns [B, T, D, W] float32, oldest first, the node
    itself last; zeros at padding nodes.
    """
    check_tree(parents, num_nodes)
    B, T, D = x.shape
    W = conv_pool.shape[-1] + 1
    rows = torch.arange(B, device=x.device)
    node = torch.arange(T, device=x.device) < num_nodes[:, None]            # [B, T]
    x = x.float()
    committed = conv_pool[req_slots].float()                                 # [B, D, W - 1]
    windows = x.new_zeros(B, T, D, W)
    for j in range(T):
        parent = torch.where(node[:, j], parents[:, j], -1)                  # padding parents may be garbage
        # the W - 1 inputs before node j on its path: the tail of its parent's window, or the committed ones
        from_parent = windows[rows, parent.clamp(min=0), :, 1:]               # [B, D, W - 1]
        history = torch.where((parent >= 0)[:, None, None], from_parent, committed)
        windows[:, j] = torch.cat([history, x[:, j, :, None]], dim=-1)
    return torch.where(node[..., None, None], windows, 0.0)


def causal_conv1d_tree_ref(
    x: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    conv_pool: torch.Tensor,
    req_slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Causal depthwise conv1d of a token tree on top of each row's committed conv history; writes nothing.

    x: [B, T, D]; parents: [B, T] int64; num_nodes: [B] int64; conv_pool: [R, D, W - 1]; req_slots: [B] int64;
    weight: [D, W]; bias: [D] or None; activation: "silu" or None. Returns y [B, T, D] in x.dtype (computed in
    fp32), zeros at padding nodes.
    """
    if activation not in ("silu", None):
        raise ValueError(f"activation must be 'silu' or None, got {activation!r}")
    windows = tree_conv_windows_ref(x, parents, num_nodes, conv_pool, req_slots)  # [B, T, D, W]
    y = (windows * weight.float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
    if activation == "silu":
        y = F.silu(y)
    node = torch.arange(x.shape[1], device=x.device) < num_nodes[:, None]
    return torch.where(node[..., None], y, 0.0).to(x.dtype)


def conv_commit_ref(
    x: torch.Tensor,
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    conv_pool: torch.Tensor,
    req_slots: torch.Tensor,
) -> None:
    """Append the accepted path's inputs to each row's committed conv history, in place.

    x: [B, T, D] pre-conv inputs of the nodes; accepted: [B, A] int64 node indices, root first, -1 padded;
    num_accepted: [B] int64 (may be 0, may exceed W - 1); conv_pool: [R, D, W - 1]; req_slots: [B] int64.
    conv_pool[req_slots[b]] becomes the last W - 1 of (its old columns ++ x[b] at the accepted nodes).
    """
    B, A = accepted.shape
    keep = conv_pool.shape[-1]                                               # W - 1
    rows = torch.arange(B, device=x.device)
    taken = torch.where(torch.arange(A, device=x.device) < num_accepted[:, None], accepted, 0)
    new = x[rows[:, None], taken].transpose(1, 2).to(conv_pool.dtype)       # [B, D, A]
    history = torch.cat([conv_pool[req_slots], new], dim=-1)                 # [B, D, W - 1 + A]
    # the row's sequence is history[:, :, :keep + a]: its last `keep` columns start at column a
    last = (num_accepted[:, None] + torch.arange(keep, device=x.device))[:, None].expand(B, x.shape[-1], keep)
    conv_pool[req_slots] = history.gather(-1, last)
