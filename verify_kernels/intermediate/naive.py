"""The intermediate-state baseline: linear layers run the way SGLang and vLLM run them (CacheConfig(linear_state=
"intermediate"), `specdec bench --baseline`), so that both ways are measured in one engine.

Decoding and verification walk the recurrence token by token from the committed state, writing the state after
every node of the tree ([B, T, *state] per layer, "intermediate states"); commit copies the last accepted node's
state into the request's slot. There is no buffer (the cache runs with flush_length 1). Torch references, the
oracle for the Triton versions; shapes and math as in verify_kernels/gdn/naive.py and mamba2/naive.py.
"""

import torch

from verify_kernels.kvbuffer import expand_heads, zero_padding_nodes


def gdn_intermediate_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    in_place: bool = False,
    states_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Gated DeltaNet over a token tree per row, one state per node.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV]; parents: [B, T] (-1: the root's parent is the
    committed state; a parent comes before its children; entries past num_nodes [B] are ignored); state_pool
    [S, HV, K, V] with state_slots [B] (-1: zero state). Returns o [B, T, HV, V] and the node states
    [B, T, HV, K, V], float32 (padding nodes output zeros and hold the committed state). in_place (decode
    steps, T = 1): write each row's new state into its slot instead, and return None for the states. states_out
    [B, T, HV, K, V] (the engine's preallocated node states): written and returned instead of a new tensor.
    """
    B, T, HV, V = v.shape
    q, k, v, g, beta = zero_padding_nodes(num_nodes, q, k, v, g, beta)
    q, k = expand_heads(q, HV), expand_heads(k, HV)
    start = committed_states(state_pool, state_slots)                      # [B, HV, K, V]
    states = start.new_zeros(B, T, *start.shape[1:])
    o = torch.zeros_like(v)
    rows = torch.arange(B, device=v.device)
    for t in range(T):
        S = torch.where(_from_parent(parents, num_nodes, t), states[rows, parents[:, t].clamp(0, T - 1)], start)
        S = g[:, t, :, None, None].exp() * S
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        states[:, t] = S
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o, _kept(states, num_nodes, state_pool, state_slots, in_place, states_out)


def mamba2_intermediate_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    Bm: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    in_place: bool = False,
    states_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mamba2 over a token tree per row, one state per node.

    x: [B, T, NH, P]; dt: [B, T, NH]; A, D: [NH]; Bm, C: [B, T, NG, N]; parents, num_nodes, state_slots as for
    gdn_intermediate_ref; state_pool [S, NH, P, N]. Returns y [B, T, NH, P] and the node states
    [B, T, NH, P, N], float32 (or None, in_place; states_out as for gdn_intermediate_ref).
    """
    B, T, NH, P = x.shape
    x, dt, Bm, C = zero_padding_nodes(num_nodes, x, dt, Bm, C)
    Bm, C = expand_heads(Bm, NH), expand_heads(C, NH)
    start = committed_states(state_pool, state_slots)                      # [B, NH, P, N]
    states = start.new_zeros(B, T, *start.shape[1:])
    y = torch.zeros_like(x)
    rows = torch.arange(B, device=x.device)
    a = dt * A.float()
    for t in range(T):
        h = torch.where(_from_parent(parents, num_nodes, t), states[rows, parents[:, t].clamp(0, T - 1)], start)
        h = a[:, t, :, None, None].exp() * h + (dt[:, t, :, None] * x[:, t])[..., None] * Bm[:, t, :, None, :]
        states[:, t] = h
        y[:, t] = torch.einsum("bhpn,bhn->bhp", h, C[:, t])
    return y + D.float()[:, None] * x, _kept(states, num_nodes, state_pool, state_slots, in_place, states_out)


def commit_node_states_ref(
    states: torch.Tensor,
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
) -> None:
    """Copy each row's last accepted node state into its slot: states [B, T, *state]; accepted [B, A] node
    indices root first (-1 padded); num_accepted [B] (rows with 0 keep their state); state_slots [B] >= 0 where
    num_accepted > 0."""
    keep = num_accepted > 0
    if not bool(keep.any()):
        return
    if bool((state_slots[keep] < 0).any()):
        raise ValueError("rows that accept tokens need a state slot (>= 0) to commit into")
    rows = torch.arange(states.shape[0], device=states.device)[keep]
    last = accepted[rows, num_accepted[keep] - 1]
    state_pool[state_slots[keep]] = states[rows, last].to(state_pool.dtype)


def _kept(states: torch.Tensor, num_nodes: torch.Tensor, state_pool: torch.Tensor, state_slots: torch.Tensor,
          in_place: bool, states_out: torch.Tensor | None = None) -> torch.Tensor | None:
    """The node states to return (in states_out when given), or (in_place, one node per row) None after writing
    them into the slots."""
    if not in_place:
        return states if states_out is None else states_out.copy_(states)
    if states.shape[1] != 1:
        raise ValueError(f"in-place decoding writes one node's state per row; got {states.shape[1]} nodes")
    commit_node_states_ref(states, torch.zeros_like(num_nodes)[:, None], num_nodes.clamp(max=1), state_pool,
                           state_slots)
    return None


def committed_states(state_pool: torch.Tensor, state_slots: torch.Tensor) -> torch.Tensor:
    """[B, *state] float32: each row's committed state, zeros for rows without a slot."""
    start = state_pool.new_zeros(state_slots.shape[0], *state_pool.shape[1:], dtype=torch.float32)
    has_state = state_slots >= 0
    start[has_state] = state_pool[state_slots[has_state]].float()
    return start


def _from_parent(parents: torch.Tensor, num_nodes: torch.Tensor, t: int) -> torch.Tensor:
    """[B, 1, 1, 1] bool: node t of each row starts from its parent's state (else from the committed one)."""
    return ((parents[:, t] >= 0) & (t < num_nodes))[:, None, None, None]
