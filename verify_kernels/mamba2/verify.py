"""Triton kernel for Mamba2 KVBuffer tree verification, with the same signature and semantics as mamba2_verify_ref:
a token tree of up to 64 nodes per row (ragged: num_nodes per row) scored on top of the row's committed h0 + buffer
in one launch, with no per-node state and no triangular solve (Mamba2 entries are independent of each other).

Grid (row b, head h, P block); a program holds all BLOCK_T >= 16 nodes of its row (T padded to a power of two for
tl.dot) and computes, with G_t = G_last + Gl_t and Gl_t the sum of dt A over t's root path (its ancestor row):

    y_t = e^{G_t} h0 C_t                                               (state: h0 tile read once per row and head)
        + sum_{i < buf_len} e^{(G_last - G_i) + Gl_t} (B_i . C_t) xdt_i  (buffer, BLOCK_L entries at a time)
        + sum_{i in anc(t) + {t}} e^{Gl_t - Gl_i} (B_i . C_t) xdt_i      (draft nodes)
        + D x_t

The score matrices C B^T are [BLOCK_T, BLOCK_T] and [BLOCK_T, BLOCK_L] tl.dots summed over N in BLOCK_N slices, then
weighed by the decays and multiplied with xdt [*, BLOCK_P]. Every decay exponent is a difference of G along a path
(<= 0), taken from the small tree-local sums Gl rather than from G itself, and masked pairs are -inf before the exp.
Padding nodes load as zeros (their inputs and parents are never read), so they come out as zeros and add nothing.
The tl.dots run in "tf32x3": each fp32 operand split into a TF32 part and its TF32 residual, three tensor-core
products, fp32-level accuracy (plain TF32 would not be: 10 mantissa bits). In IEEE fp32 ("ieee") they ran on the
FMA units instead, which made this kernel the slowest op of a Nemotron verify step on the H200 (2.2 ms per layer at
batch 256, 4-chains, against 0.7 ms for the intermediate-state baseline's kernel).
"""

import torch
import triton
import triton.language as tl

from verify_kernels.mamba2.commit import check_indices, check_pools, check_tokens

# tunables: P block of a program, N slice of the score dots, buffer entries per step (>= 16), warps by BLOCK_T
# (a 64-node program holds [64, 64] scores, decays and ancestor mask at once)
BLOCK_P_MAX = 32
BLOCK_N_MAX = 32
BLOCK_L = 32
NUM_WARPS = {16: 4, 32: 4, 64: 8}
MAX_NODES = 64


@triton.jit
def mamba2_verify_kernel(
    x, dt, A, Bm, C, D, ancestors, num_nodes, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots,
    y, xdt_out, gcum_out,
    T: tl.constexpr, NH: tl.constexpr, NG: tl.constexpr, P: tl.constexpr, N: tl.constexpr, L: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
):
    i_b, i_h, i_p = tl.program_id(0).to(tl.int64), tl.program_id(1), tl.program_id(2)
    i_g = i_h // (NH // NG)
    i_r = tl.load(req_slots + i_b).to(tl.int64)
    i_s = tl.load(state_slots + i_b).to(tl.int64)
    n_buf = tl.load(buf_len + i_r).to(tl.int32)
    n_nodes = tl.load(num_nodes + i_b).to(tl.int32)
    o_t = tl.arange(0, BLOCK_T)
    m_t = o_t < n_nodes
    o_p = i_p * BLOCK_P + tl.arange(0, BLOCK_P)
    # node t's C / B rows for the N slice starting at n0: add n0 + arange(BLOCK_N)
    p_c = C + ((i_b * T + o_t[:, None]) * NG + i_g) * N
    p_k = Bm + ((i_b * T + o_t[:, None]) * NG + i_g) * N

    # G along each node's root path: Gl_t = sum over its ancestor row (itself included) of dt A
    b_dt = tl.load(dt + (i_b * T + o_t) * NH + i_h, mask=m_t, other=0.0).to(tl.float32)
    b_a = b_dt * tl.load(A + i_h).to(tl.float32)
    m_anc = m_t[:, None] & m_t[None, :]
    b_anc = tl.load(ancestors + (i_b * T + o_t[:, None]) * T + o_t[None, :], mask=m_anc, other=0) != 0
    b_gl = tl.sum(tl.where(b_anc, b_a[None, :], 0.0), 1)                 # [BLOCK_T]
    g_last = tl.load(buf_gcum + (i_r * L + n_buf - 1) * NH + i_h, mask=n_buf > 0, other=0.0)
    b_x = tl.load(x + ((i_b * T + o_t[:, None]) * NH + i_h) * P + o_p[None, :], mask=m_t[:, None],
                  other=0.0).to(tl.float32)
    b_xdt = b_dt[:, None] * b_x
    b_y = tl.load(D + i_h).to(tl.float32) * b_x
    b_g = g_last + b_gl
    # the entries are final here: store them now rather than hold them in registers to the end
    m_out = o_t < T
    p_out = ((i_b * T + o_t[:, None]) * NH + i_h) * P + o_p[None, :]
    tl.store(xdt_out + p_out, b_xdt, mask=m_out[:, None])
    if i_p == 0:
        tl.store(gcum_out + (i_b * T + o_t) * NH + i_h, tl.where(m_t, b_g, 0.0), mask=m_out)

    # draft nodes: scores C_t . B_i, kept for i in anc(t) + {t}
    b_s = tl.zeros([BLOCK_T, BLOCK_T], dtype=tl.float32)
    for n0 in tl.static_range(0, N, BLOCK_N):
        o_n = n0 + tl.arange(0, BLOCK_N)
        b_c = tl.load(p_c + o_n[None, :], mask=m_t[:, None], other=0.0).to(tl.float32)
        b_k = tl.load(p_k + o_n[None, :], mask=m_t[:, None], other=0.0).to(tl.float32)
        b_s += tl.dot(b_c, tl.trans(b_k), input_precision="tf32x3")
    b_decay_tree = tl.exp(tl.where(b_anc, b_gl[:, None] - b_gl[None, :], float("-inf")))
    b_y += tl.dot(b_s * b_decay_tree, b_xdt, input_precision="tf32x3")

    # the buffer's valid entries, BLOCK_L at a time
    for l0 in range(0, n_buf, BLOCK_L):
        o_l = l0 + tl.arange(0, BLOCK_L)
        m_l = o_l < n_buf
        b_sl = tl.zeros([BLOCK_T, BLOCK_L], dtype=tl.float32)
        for n0 in tl.static_range(0, N, BLOCK_N):
            o_n = n0 + tl.arange(0, BLOCK_N)
            b_c = tl.load(p_c + o_n[None, :], mask=m_t[:, None], other=0.0).to(tl.float32)
            b_ki = tl.load(buf_b + ((i_r * L + o_l[:, None]) * NG + i_g) * N + o_n[None, :], mask=m_l[:, None],
                           other=0.0)
            b_sl += tl.dot(b_c, tl.trans(b_ki), input_precision="tf32x3")
        b_gi = tl.load(buf_gcum + (i_r * L + o_l) * NH + i_h, mask=m_l, other=0.0)
        m_tl = m_t[:, None] & m_l[None, :]
        b_decay_buf = tl.exp(tl.where(m_tl, (g_last - b_gi)[None, :] + b_gl[:, None], float("-inf")))
        b_vi = tl.load(buf_xdt + ((i_r * L + o_l[:, None]) * NH + i_h) * P + o_p[None, :], mask=m_l[:, None],
                       other=0.0)
        b_y += tl.dot(b_sl * b_decay_buf, b_vi, input_precision="tf32x3")

    # the committed state: one read of the tile h0[p-block, :], none for rows without a state
    if i_s >= 0:
        b_hc = tl.zeros([BLOCK_T, BLOCK_P], dtype=tl.float32)
        for n0 in tl.static_range(0, N, BLOCK_N):
            o_n = n0 + tl.arange(0, BLOCK_N)
            b_c = tl.load(p_c + o_n[None, :], mask=m_t[:, None], other=0.0).to(tl.float32)
            b_ht = tl.load(state_pool + ((i_s * NH + i_h) * P + o_p[None, :]) * N + o_n[:, None])   # h0^T slice
            b_hc += tl.dot(b_c, b_ht, input_precision="tf32x3")
        b_y += tl.exp(b_g)[:, None] * b_hc

    tl.store(y + p_out, b_y, mask=m_out[:, None])


def tree_ancestors(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    """verify_kernels.tree.ancestor_mask without its validation, so without a host synchronisation (CUDA graphs):
    the reflexive transitive closure of the parent relation by repeated squaring. [B, T, T] bool.

    parents: [B, T]; num_nodes: [B]. Parents of padding nodes are ignored; an out-of-range one makes its node a root."""
    B, T = parents.shape
    o_t = torch.arange(T, device=parents.device)
    node = o_t < num_nodes[:, None]                                        # [B, T]
    parent = torch.where(node, parents, -1)
    reach = ((parent[..., None] == o_t) | (o_t[:, None] == o_t)).float()  # self or parent: paths of length <= 1
    for _ in range((T - 1).bit_length()):                                  # paths of length <= 2^k >= T - 1
        reach = (reach @ reach).clamp(max=1.0)
    return (reach > 0) & node[:, :, None] & node[:, None, :]


def mamba2_verify_fwd(x, dt, A, Bm, C, D, parents, num_nodes, state_pool, state_slots, buf_b, buf_xdt, buf_gcum,
                      buf_len, req_slots, ancestors):
    """Launcher: checks, ancestor mask, allocation, grid."""
    NH, NG, P, N, L = check_pools(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots)
    B = req_slots.shape[0]
    if parents.dim() != 2 or parents.shape[0] != B or num_nodes.shape != (B,):
        raise ValueError(f"expected parents [B, T] and num_nodes [B] with B = {B}, got {tuple(parents.shape)} and "
                         f"{tuple(num_nodes.shape)}")
    T = parents.shape[1]
    if not 1 <= T <= MAX_NODES:
        raise ValueError(f"trees of 1 to {MAX_NODES} nodes, got T = {T}")
    check_tokens((B, T), NH, NG, P, N, x=x, dt=dt, A=A, Bm=Bm, C=C, D=D)
    check_indices(parents=parents, num_nodes=num_nodes)
    if ancestors is None:
        ancestors = tree_ancestors(parents, num_nodes)
    elif ancestors.shape != (B, T, T) or ancestors.dtype != torch.bool or not ancestors.is_contiguous():
        raise ValueError(f"ancestors must be a contiguous [B, T, T] = {(B, T, T)} bool mask, got "
                         f"{tuple(ancestors.shape)} {ancestors.dtype}")
    device = x.device
    y = torch.empty(B, T, NH, P, dtype=torch.float32, device=device)
    xdt = torch.empty(B, T, NH, P, dtype=torch.float32, device=device)
    gcum = torch.empty(B, T, NH, dtype=torch.float32, device=device)
    if B > 0:
        BLOCK_P, BLOCK_T = min(P, BLOCK_P_MAX), max(16, triton.next_power_of_2(T))
        mamba2_verify_kernel[(B, NH, P // BLOCK_P)](
            x, dt, A, Bm, C, D, ancestors, num_nodes, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len,
            req_slots, y, xdt, gcum,
            T=T, NH=NH, NG=NG, P=P, N=N, L=L, BLOCK_T=BLOCK_T, BLOCK_P=BLOCK_P, BLOCK_N=min(N, BLOCK_N_MAX),
            BLOCK_L=BLOCK_L, num_warps=NUM_WARPS[BLOCK_T],
        )
    return y, xdt, gcum


def mamba2_verify(
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
    buf_b: torch.Tensor,
    buf_xdt: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
    ancestors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A token tree per row on top of its committed h0 + buffer; writes nothing, forms no per-node state (as
    mamba2_verify_ref).

    x: [B, T, NH, P]; dt: [B, T, NH] (softplus'ed); A: [NH]; Bm, C: [B, T, NG, N]; D: [NH] (fp32 / bf16 / fp16);
    parents: [B, T] and num_nodes: [B] (verify_kernels.tree; T <= 64); pools as in mamba2_decode; ancestors:
    [B, T, T] bool, verify_kernels.tree.ancestor_mask(parents, num_nodes) shared by the layers of a step, or None
    (computed here, without validating the trees). Returns y [B, T, NH, P] and the nodes' buffer entries
    xdt [B, T, NH, P] and gcum [B, T, NH], float32, zeros at padding nodes.
    """
    return mamba2_verify_fwd(x, dt, A, Bm, C, D, parents, num_nodes, state_pool, state_slots, buf_b, buf_xdt,
                             buf_gcum, buf_len, req_slots, ancestors)
