"""Token trees given by parent pointers: validation, ancestor masks, depths and sums along root paths.

A batch of trees is `parents` [B, T] int64 plus `num_nodes` [B] int64. Nodes are topologically ordered:
parents[b, j] is in [-1, j), and -1 means "child of the last committed token". Nodes j >= num_nodes[b] are
padding: their parent entries are ignored (they may hold anything) and they belong to no tree. A chain is the
tree with parents[j] = j - 1.
"""

import torch


def check_tree(parents: torch.Tensor, num_nodes: torch.Tensor) -> None:
    """Raise ValueError unless `parents` [B, T] and `num_nodes` [B] are valid topologically ordered trees."""
    if parents.dim() != 2 or num_nodes.shape != parents.shape[:1]:
        raise ValueError(f"expected parents [B, T] and num_nodes [B], got {tuple(parents.shape)} and "
                         f"{tuple(num_nodes.shape)}")
    T = parents.shape[1]
    if ((num_nodes < 0) | (num_nodes > T)).any():
        raise ValueError(f"num_nodes must be in [0, {T}], got {num_nodes.tolist()}")
    node = torch.arange(T, device=parents.device)
    bad = (node < num_nodes[:, None]) & ((parents < -1) | (parents >= node))
    if bad.any():
        b, j = bad.nonzero()[0].tolist()
        raise ValueError(f"parents[{b}, {j}] = {parents[b, j].item()} is not in [-1, {j})")


def chain_parents(batch: int, length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Parents [batch, length] int64 of a chain: node j's parent is j - 1 (-1 for node 0)."""
    return (torch.arange(length, device=device) - 1).expand(batch, length).clone()


def ancestor_mask(parents: torch.Tensor, num_nodes: torch.Tensor, check: bool = True) -> torch.Tensor:
    """Mask [B, T, T] bool: M[b, j, i] is True iff node i is node j or a strict ancestor of j (both valid).

    parents: [B, T] int64, num_nodes: [B] int64 (see the module docstring). check=False skips the validation
    (check_tree reads the trees back to the host; a captured CUDA graph cannot): parents of padding nodes are
    ignored and an out-of-range parent makes its node a root. The reflexive transitive closure of the parent
    relation by repeated squaring: log2(T) products of [T, T] reachability matrices, no loop over the nodes.
    """
    if check:
        check_tree(parents, num_nodes)
    B, T = parents.shape
    o_t = torch.arange(T, device=parents.device)
    node = o_t < num_nodes[:, None]                                        # [B, T]
    parent = torch.where(node, parents, -1)
    reach = ((parent[..., None] == o_t) | (o_t[:, None] == o_t)).float()  # self or parent: paths of length <= 1
    for _ in range((T - 1).bit_length()):                                  # paths of length <= 2^k >= T - 1
        reach = (reach @ reach).clamp(max=1.0)
    return (reach > 0) & node[:, :, None] & node[:, None, :]


def node_depths(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """Depths [B, T] int64: children of the committed end have depth 0, padding nodes 0.

    parents: [B, T] int64, num_nodes: [B] int64.
    """
    return (ancestor_mask(parents, num_nodes).sum(-1) - 1).clamp(min=0)


def tree_cumsum(
    x: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    initial: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sums of `x` along each node's root path, in fp32: out[b, j] = out[b, parents[b, j]] + x[b, j].

    x: [B, T, ...]; parents: [B, T] int64; num_nodes: [B] int64; initial: [B, ...], the value "above" the
    roots (default 0). Returns [B, T, ...] float32, 0 at padding nodes (whatever x holds there, NaN included).
    Used for the cumulative log decay G of tree nodes: G_j = G_parent + g_j, G of the committed end = initial.
    """
    check_tree(parents, num_nodes)
    B, T = parents.shape
    x = x.float()
    rows = torch.arange(B, device=x.device)
    start = torch.zeros_like(x[:, 0]) if initial is None else initial.float()
    out = torch.zeros_like(x)
    trail = (1,) * (x.dim() - 2)                                # broadcasts [B] over the trailing dims of x
    for j in range(T):
        valid = j < num_nodes
        parent = torch.where(valid, parents[:, j], -1)
        above = torch.where((parent >= 0).view(B, *trail), out[rows, parent.clamp(min=0)], start)
        out[:, j] = torch.where(valid.view(B, *trail), above + x[:, j], 0.0)
    return out
