"""Tree-aware short causal depthwise conv1d in pure torch (the conv in front of the GDN and Mamba2 mixers).

As transformers' causal_conv1d_fn / causal_conv1d_update: y[c] = act(bias[c] + sum_w weight[c, w] win[c, w])
over a window of W inputs, oldest first, the token itself last. A token's window is its W - 1 predecessors
along ITS path: draft ancestors first, then the committed history. Each committed request keeps its last
W - 1 pre-conv inputs in `conv_pool` [R, W - 1, D] (column -1, conv_pool[r, -1], the most recent; zeros for a
fresh request, which is what zero left-padding gives), indexed by `req_slots` [B]. Columns first, unlike
causal_conv1d's conv_state [B, D, W - 1]: each column is then D contiguous channels, which the kernels read and
write as whole vectors (in [D, W - 1] a channel's columns sit side by side and every access is a strided 2-byte
one). Trees are `parents` [B, T] and
`num_nodes` [B] as in verify_kernels.tree; padding nodes give zeros and never reach valid ones.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verify_kernels.glue.naive import gdn_gates_ref, gdn_qkv_ref
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
    conv_pool: [R, W - 1, D]; req_slots: [B] int64. Returns [B, T, D, W] float32, oldest first, the node
    itself last; zeros at padding nodes.
    """
    check_tree(parents, num_nodes)
    B, T, D = x.shape
    W = conv_pool.shape[1] + 1
    rows = torch.arange(B, device=x.device)[:, None]
    node = torch.arange(T, device=x.device) < num_nodes[:, None]            # [B, T]
    parent = torch.where(node, parents, -1)                                  # padding parents may be garbage
    x = x.float()
    committed = conv_pool[req_slots].float()                                 # [B, W - 1, D], newest last
    # walk up every node's path W - 1 times at once: the input w steps back is the ancestor w steps up while the
    # path lasts, then the committed inputs, newest first
    newest_first = [x]
    up = parent                                                              # [B, T]: w steps up, -1 past the root
    past_root = torch.zeros_like(parent)                                     # committed inputs taken so far
    for _ in range(1, W):
        on_path = up >= 0
        past_root = past_root + (~on_path).long()
        from_path = x[rows, up.clamp(min=0)]                                  # [B, T, D]
        from_committed = committed[rows, (W - 1 - past_root).clamp(0, W - 2)]  # [B, T, D]
        newest_first.append(torch.where(on_path[..., None], from_path, from_committed))
        up = torch.where(on_path, parent[rows, up.clamp(min=0)], -1)
    windows = torch.stack(newest_first[::-1], dim=-1)                        # [B, T, D, W], oldest first
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
    sources: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal depthwise conv1d of a token tree on top of each row's committed conv history; writes nothing.

    x: [B, T, D]; parents: [B, T] int64; num_nodes: [B] int64; conv_pool: [R, W - 1, D]; req_slots: [B] int64;
    weight: [D, W]; bias: [D] or None; activation: "silu" or None. Returns y [B, T, D] in x.dtype (computed in
    fp32), zeros at padding nodes. sources: the kernel's windows precomputed from the parents (its signature);
    the reference, being the contract, walks the parents itself and does not read them.
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
    num_accepted: [B] int64 (may be 0, may exceed W - 1); conv_pool: [R, W - 1, D]; req_slots: [B] int64.
    conv_pool[req_slots[b]] becomes the last W - 1 of (its old columns ++ x[b] at the accepted nodes).
    """
    B, A = accepted.shape
    keep = conv_pool.shape[1]                                                # W - 1
    rows = torch.arange(B, device=x.device)
    taken = torch.where(torch.arange(A, device=x.device) < num_accepted[:, None], accepted, 0)
    new = x[rows[:, None], taken].to(conv_pool.dtype)                        # [B, A, D]
    history = torch.cat([conv_pool[req_slots], new], dim=1)                  # [B, W - 1 + A, D]
    # the row's sequence is history[:, :keep + a]: its last `keep` columns start at column a
    last = (num_accepted[:, None] + torch.arange(keep, device=x.device))[..., None].expand(B, keep, x.shape[-1])
    conv_pool[req_slots] = history.gather(1, last)


def conv_decode_ref(
    x: torch.Tensor,
    num_nodes: torch.Tensor,
    conv_pool: torch.Tensor,
    req_slots: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Plain decoding's conv: each row's one node through its committed window, then the node appended to the
    window, in place (causal_conv1d_tree_ref, then conv_commit_ref of the node).

    x: [B, 1, D]; num_nodes: [B] int64, 1 or 0 (a padding row: output zeros, window untouched); conv_pool:
    [R, W - 1, D]; req_slots: [B] int64; weight: [D, W]; bias: [D] or None; activation: "silu" or None.
    Returns y [B, 1, D] in x.dtype."""
    B = x.shape[0]
    roots = torch.full((B, 1), -1, dtype=torch.long, device=x.device)
    y = causal_conv1d_tree_ref(x, roots, num_nodes, conv_pool, req_slots, weight, bias, activation)
    conv_commit_ref(x, torch.zeros_like(roots), num_nodes, conv_pool, req_slots)
    return y


@dataclass(frozen=True)
class QKVHeads:
    """The Gated DeltaNet's conv channels split into the delta rule's inputs: H key heads of K channels for q, as
    many for k, HV value heads of V channels for v (verify_kernels.glue gdn_qkv)."""

    H: int
    K: int
    HV: int
    V: int

    @property
    def channels(self) -> int:
        return 2 * self.H * self.K + self.HV * self.V


@dataclass(frozen=True)
class GateInputs:
    """The Gated DeltaNet's gate projections and parameters (verify_kernels.glue gdn_gates): a, b [B, T, HV] (rows
    may be strided: splits of the merged projection's output), A_log, dt_bias [HV]. Given to the conv ops that split
    q / k / v, they also return (g, beta) fp32 [B, T, HV]: the same kernel, one launch less a layer and step."""

    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor


def causal_conv1d_tree_qkv_ref(x, parents, num_nodes, conv_pool, req_slots, weight, bias, activation, sources,
                               heads: QKVHeads, q_scale: float, eps: float = 1e-6,
                               qk_dtype: torch.dtype | None = None, qk_storage: torch.dtype | None = None,
                               gates: GateInputs | None = None):
    """causal_conv1d_tree_ref, then gdn_qkv_ref of its output: (q [B, T, H, K], k, v [B, T, HV, V]), and with gates
    gdn_gates_ref's (g, beta) after them (the contract of the fused kernel, verify_kernels/conv/conv_qkv.py)."""
    y = causal_conv1d_tree_ref(x, parents, num_nodes, conv_pool, req_slots, weight, bias, activation, sources)
    qkv = gdn_qkv_ref(y, heads.H, heads.K, heads.HV, heads.V, q_scale, eps, qk_dtype, qk_storage)
    return qkv if gates is None else (*qkv, *gdn_gates_ref(gates.a, gates.b, gates.A_log, gates.dt_bias))


def conv_decode_qkv_ref(x, num_nodes, conv_pool, req_slots, weight, bias, activation, heads: QKVHeads,
                        q_scale: float, eps: float = 1e-6, qk_dtype: torch.dtype | None = None,
                        qk_storage: torch.dtype | None = None, gates: GateInputs | None = None):
    """conv_decode_ref (the window updated in place), then gdn_qkv_ref of its output: (q [B, 1, H, K], k, v), and
    with gates (g, beta) [B, 1, HV] after them."""
    y = conv_decode_ref(x, num_nodes, conv_pool, req_slots, weight, bias, activation)
    qkv = gdn_qkv_ref(y, heads.H, heads.K, heads.HV, heads.V, q_scale, eps, qk_dtype, qk_storage)
    return qkv if gates is None else (*qkv, *gdn_gates_ref(gates.a, gates.b, gates.A_log, gates.dt_bias))
