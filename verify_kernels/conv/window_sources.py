"""Where each node's conv window lives: the tree conv kernel's window sources, computed from the parent pointers once
a step and shared by all its conv layers (StepContext.window_sources). Pure torch (no triton: a CPU install builds
step contexts too)."""

import torch


def conv_window_sources(parents: torch.Tensor, num_nodes: torch.Tensor, width: int) -> torch.Tensor:
    """Where each node's W - 1 window predecessors live, oldest first: [B, T, W - 1] int64 with a node index (>= 0)
    or a committed column counted from the newest (-1 = conv_pool[r, -1], -2 the one before, ...).

    parents: [B, T]; num_nodes: [B]; width: W. Walks up W - 1 parent pointers (a root's parent, -1, is the newest
    committed input; above that, older committed inputs). No host synchronisation: shared by every conv layer of a
    step. Parents of padding nodes are ignored (their rows are never used)."""
    B, T = parents.shape
    o_t = torch.arange(T, device=parents.device)
    parent = torch.where(o_t < num_nodes[:, None], parents, -1).clamp(-1, T - 1)
    current = o_t.expand(B, T)
    steps = []
    for _ in range(width - 1):
        up = parent.gather(1, current.clamp(min=0))
        current = torch.where(current >= 0, up, current - 1)
        steps.append(current)
    return torch.stack(steps[::-1], dim=-1)
