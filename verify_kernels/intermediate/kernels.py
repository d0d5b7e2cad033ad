"""Triton kernels of the intermediate-state baseline (the torch references and the semantics:
verify_kernels/intermediate/naive.py): the token tree of each row walked node by node from the committed state,
the state after every node written out (or, for one-node decode steps, straight into the request's slot), and the
commit that copies the last accepted node's state into the slot. This is how SGLang and vLLM run linear layers;
we measure the KVBuffer against it in one engine.

One program per (row, value head, V block) keeps the [K, BV] (Mamba2: [BP, N]) state tile in registers along a
chain; a node whose parent is not the node before it reloads the parent's tile from the states it wrote.
"""

import torch
import triton
import triton.language as tl

GDN_BLOCK_V = 32
MAMBA2_BLOCK_P = 16
COPY_BLOCK = 1024
NUM_WARPS = 4


@triton.jit
def gdn_intermediate_kernel(
    q,             # [B, T, H, K]
    k,             # [B, T, H, K]
    v,             # [B, T, HV, V]
    g,             # [B, T, HV]
    beta,          # [B, T, HV]
    parents,       # [B, T]
    num_nodes,     # [B]
    state_pool,    # [S, HV, K, V] fp32
    state_slots,   # [B]
    out,           # [B, T, HV, V] fp32
    states,        # [B, T, HV, K, V] fp32 (unused IN_PLACE)
    T,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BV: tl.constexpr,
    IN_PLACE: tl.constexpr,
):
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // HV, i_bh % HV
    i_hk = i_h // (HV // H)
    o_k = tl.arange(0, K)
    o_v = i_v * BV + tl.arange(0, BV)
    tile = o_k[:, None] * V + o_v[None, :]                                  # [K, BV] within one head's state
    slot = tl.load(state_slots + i_b).to(tl.int64)
    n = tl.load(num_nodes + i_b).to(tl.int32)
    b_s0 = tl.zeros([K, BV], dtype=tl.float32)
    if slot >= 0:
        b_s0 = tl.load(state_pool + (slot * HV + i_h) * K * V + tile)
    b_s = b_s0
    for t in range(0, T):
        node = i_b.to(tl.int64) * T + t
        if t < n:
            parent = tl.load(parents + node).to(tl.int32)
            if parent < 0:
                b_s = b_s0
            elif parent != t - 1:  # a branch: the parent's state, which this program wrote before
                tl.debug_barrier()
                b_s = tl.load(states + ((i_b.to(tl.int64) * T + parent) * HV + i_h) * K * V + tile)
            b_q = tl.load(q + (node * H + i_hk) * K + o_k).to(tl.float32)
            b_k = tl.load(k + (node * H + i_hk) * K + o_k).to(tl.float32)
            b_v = tl.load(v + (node * HV + i_h) * V + o_v).to(tl.float32)
            b_g = tl.load(g + node * HV + i_h).to(tl.float32)
            b_beta = tl.load(beta + node * HV + i_h).to(tl.float32)
            b_s = b_s * tl.exp(b_g)
            b_u = b_beta * (b_v - tl.sum(b_s * b_k[:, None], 0))
            b_s += b_k[:, None] * b_u[None, :]
            tl.store(out + (node * HV + i_h) * V + o_v, tl.sum(b_s * b_q[:, None], 0))
            if IN_PLACE:
                if slot >= 0:
                    tl.store(state_pool + (slot * HV + i_h) * K * V + tile, b_s)
            else:
                tl.store(states + (node * HV + i_h) * K * V + tile, b_s)
        else:  # padding: zero output, the committed state
            tl.store(out + (node * HV + i_h) * V + o_v, tl.zeros([BV], dtype=tl.float32))
            if not IN_PLACE:
                tl.store(states + (node * HV + i_h) * K * V + tile, b_s0)


@triton.jit
def mamba2_intermediate_kernel(
    x,             # [B, T, NH, P]
    dt,            # [B, T, NH]
    A,             # [NH]
    Bm,            # [B, T, NG, N]
    C,             # [B, T, NG, N]
    D,             # [NH]
    parents,       # [B, T]
    num_nodes,     # [B]
    state_pool,    # [S, NH, P, N] fp32
    state_slots,   # [B]
    out,           # [B, T, NH, P] fp32
    states,        # [B, T, NH, P, N] fp32 (unused IN_PLACE)
    T,
    NH: tl.constexpr,
    NG: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    BP: tl.constexpr,
    IN_PLACE: tl.constexpr,
):
    i_p, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // NH, i_bh % NH
    i_g = i_h // (NH // NG)
    o_p = i_p * BP + tl.arange(0, BP)
    o_n = tl.arange(0, N)
    tile = o_p[:, None] * N + o_n[None, :]                                  # [BP, N] within one head's state
    slot = tl.load(state_slots + i_b).to(tl.int64)
    n = tl.load(num_nodes + i_b).to(tl.int32)
    b_a = tl.load(A + i_h).to(tl.float32)
    b_d = tl.load(D + i_h).to(tl.float32)
    b_h0 = tl.zeros([BP, N], dtype=tl.float32)
    if slot >= 0:
        b_h0 = tl.load(state_pool + (slot * NH + i_h) * P * N + tile)
    b_h = b_h0
    for t in range(0, T):
        node = i_b.to(tl.int64) * T + t
        if t < n:
            parent = tl.load(parents + node).to(tl.int32)
            if parent < 0:
                b_h = b_h0
            elif parent != t - 1:  # a branch: the parent's state, which this program wrote before
                tl.debug_barrier()
                b_h = tl.load(states + ((i_b.to(tl.int64) * T + parent) * NH + i_h) * P * N + tile)
            b_x = tl.load(x + (node * NH + i_h) * P + o_p).to(tl.float32)
            b_dt = tl.load(dt + node * NH + i_h).to(tl.float32)
            b_b = tl.load(Bm + (node * NG + i_g) * N + o_n).to(tl.float32)
            b_c = tl.load(C + (node * NG + i_g) * N + o_n).to(tl.float32)
            b_h = b_h * tl.exp(b_dt * b_a) + (b_dt * b_x)[:, None] * b_b[None, :]
            tl.store(out + (node * NH + i_h) * P + o_p, tl.sum(b_h * b_c[None, :], 1) + b_d * b_x)
            if IN_PLACE:
                if slot >= 0:
                    tl.store(state_pool + (slot * NH + i_h) * P * N + tile, b_h)
            else:
                tl.store(states + (node * NH + i_h) * P * N + tile, b_h)
        else:  # padding: zero output, the committed state
            tl.store(out + (node * NH + i_h) * P + o_p, tl.zeros([BP], dtype=tl.float32))
            if not IN_PLACE:
                tl.store(states + (node * NH + i_h) * P * N + tile, b_h0)


@triton.jit
def commit_node_states_kernel(
    states,        # [B, T, E] fp32, E = one state's elements
    accepted,      # [B, A]
    num_accepted,  # [B]
    state_pool,    # [S, E] fp32
    state_slots,   # [B]
    T,
    A,
    E,
    BLOCK: tl.constexpr,
):
    i_e, i_b = tl.program_id(0), tl.program_id(1)
    count = tl.load(num_accepted + i_b)
    slot = tl.load(state_slots + i_b).to(tl.int64)
    if count > 0 and slot >= 0:
        last = tl.load(accepted + i_b.to(tl.int64) * A + count - 1).to(tl.int64)
        o_e = i_e * BLOCK + tl.arange(0, BLOCK)
        m_e = o_e < E
        b_s = tl.load(states + (i_b.to(tl.int64) * T + last) * E + o_e, mask=m_e)
        tl.store(state_pool + slot * E + o_e, b_s, mask=m_e)


def gdn_intermediate(q, k, v, g, beta, parents, num_nodes, state_pool, state_slots, in_place: bool = False,
                     states_out=None):
    """As verify_kernels.intermediate.naive.gdn_intermediate_ref."""
    B, T, H, K = q.shape
    HV, V = v.shape[-2:]
    _check_in_place(in_place, T)
    out = torch.empty(B, T, HV, V, device=v.device, dtype=torch.float32)
    states = None if in_place else _node_states(states_out, (B, T, HV, K, V), v.device)
    block_v = min(GDN_BLOCK_V, V)
    gdn_intermediate_kernel[(triton.cdiv(V, block_v), B * HV)](
        q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(), parents.contiguous(),
        num_nodes, state_pool, state_slots, out, out if states is None else states, T,
        H=H, HV=HV, K=K, V=V, BV=block_v, IN_PLACE=in_place, num_warps=NUM_WARPS)
    return out, states


def mamba2_intermediate(x, dt, A, Bm, C, D, parents, num_nodes, state_pool, state_slots, in_place: bool = False,
                        states_out=None):
    """As verify_kernels.intermediate.naive.mamba2_intermediate_ref."""
    B, T, NH, P = x.shape
    NG, N = Bm.shape[-2:]
    _check_in_place(in_place, T)
    out = torch.empty(B, T, NH, P, device=x.device, dtype=torch.float32)
    states = None if in_place else _node_states(states_out, (B, T, NH, P, N), x.device)
    block_p = min(MAMBA2_BLOCK_P, P)
    mamba2_intermediate_kernel[(triton.cdiv(P, block_p), B * NH)](
        x.contiguous(), dt.contiguous(), A.float().contiguous(), Bm.contiguous(), C.contiguous(),
        D.float().contiguous(), parents.contiguous(), num_nodes, state_pool, state_slots, out,
        out if states is None else states, T, NH=NH, NG=NG, P=P, N=N, BP=block_p, IN_PLACE=in_place,
        num_warps=NUM_WARPS)
    return out, states


def commit_node_states(states, accepted, num_accepted, state_pool, state_slots) -> None:
    """As verify_kernels.intermediate.naive.commit_node_states_ref (rows without a slot are skipped: no host
    check, so that the commit can be captured in a CUDA graph)."""
    B, T = states.shape[:2]
    elements = states[0, 0].numel()
    commit_node_states_kernel[(triton.cdiv(elements, COPY_BLOCK), B)](
        states.contiguous(), accepted.contiguous(), num_accepted, state_pool, state_slots, T, accepted.shape[1],
        elements, BLOCK=COPY_BLOCK)


def _node_states(states_out: torch.Tensor | None, shape: tuple[int, ...], device) -> torch.Tensor:
    """Where the kernels write the node states: states_out (the engine's preallocated buffer) or a new tensor."""
    if states_out is None:
        return torch.empty(shape, device=device, dtype=torch.float32)
    if tuple(states_out.shape) != shape or states_out.dtype != torch.float32 or not states_out.is_contiguous():
        raise ValueError(f"states_out must be a contiguous float32 tensor of shape {list(shape)}, got "
                         f"{states_out.dtype} {list(states_out.shape)}")
    return states_out


def _check_in_place(in_place: bool, T: int) -> None:
    if in_place and T != 1:
        raise ValueError(f"in-place decoding writes one node's state per row; got {T} nodes")
