"""Mamba2 (Nemotron-H) selective state space in pure torch: the recurrence, chunked prefill and the
KVBuffer decode / verify / commit / flush. fp32 accumulation: inputs are cast to float32, outputs are float32.

Shapes: B batch rows, T tokens (or tree nodes) per row, NH heads of dim P, NG groups (NH % NG == 0; head h
reads group h // (NH // NG)), N state size. x: [.., NH, P]; dt: [.., NH], already softplus'ed and clamped
(> 0); A: [NH] (< 0); Bm, C: [.., NG, N]; D: [NH]. The log decay of a token is a_t = dt_t A and the
state of a head is h [P, N]:

    h_t = e^{a_t} h_{t-1} + dt_t x_t B_t^T,   y_t = h_t C_t + D x_t

KVBuffer (docs/design.md section 2): the committed state h0 stays read-only and the tokens since the last flush are
buffer entries (B_i [NG, N], xdt_i = dt_i x_i [NH, P], G_i [NH]) with G_i the cumulative log decay from h0 to
token i. For a new token t with buffered / draft ancestors A(t) (no triangular solve: the entries are
independent of each other):

    y_t = e^{G_t} h0 C_t + sum_{i in A(t) + {t}} e^{G_t - G_i} (B_i . C_t) xdt_i + D x_t

Pools are indexed by slots: state_pool [S, NH, P, N] with state_slots [B] (-1: never flushed, h0 = 0 and
the pool is not read), buf_b [R, L, NG, N], buf_xdt [R, L, NH, P], buf_gcum [R, L, NH], buf_len [R] and
req_slots [B] (verify_kernels.kvbuffer gathers, appends to and folds them, as for gdn).
Only differences G_t - G_i <= 0 or a single G <= 0 are exponentiated, and masked pairs are set to -inf before
the exp, so decays as strong as -50 per token stay finite.
"""

import torch

from verify_kernels import kvbuffer
from verify_kernels.kvbuffer import expand_heads, to_chunks, zero_padding_nodes
from verify_kernels.tree import tree_cumsum


def mamba2_recurrent_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    Bm: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token Mamba2 scan.

    x: [B, T, NH, P]; dt: [B, T, NH]; A: [NH]; Bm, C: [B, T, NG, N]; D: [NH];
    initial_state: [B, NH, P, N] or None (zeros). Returns y [B, T, NH, P] and the final state [B, NH, P, N].
    """
    B, T, NH, P = x.shape
    x, dt = x.float(), dt.float()
    Bm, C = expand_heads(Bm.float(), NH), expand_heads(C.float(), NH)
    a = dt * A.float()                                                      # [B, T, NH]
    h = x.new_zeros(B, NH, P, Bm.shape[-1]) if initial_state is None else initial_state.float().clone()
    y = torch.zeros_like(x)
    for t in range(T):
        xdt = dt[:, t, :, None] * x[:, t]                                   # [B, NH, P]
        h = a[:, t, :, None, None].exp() * h + xdt[..., None] * Bm[:, t, :, None, :]
        y[:, t] = torch.einsum("bhpn,bhn->bhp", h, C[:, t])
    return y + D.float()[:, None] * x, h


def mamba2_chunk_prefill_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    Bm: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked Mamba2 scan (SSD: quadratic inside a chunk, state carried across chunks).

    x: [B, T, NH, P]; dt: [B, T, NH]; A: [NH]; Bm, C: [B, T, NG, N]; D: [NH];
    initial_state: [B, NH, P, N] or None (zeros). Returns y [B, T, NH, P] and the final state [B, NH, P, N].
    T is padded to a multiple of chunk_size with dt = 0 tokens, which leave the state unchanged (as do such
    tokens in the input: the model uses them to right-pad ragged batches).
    """
    B, T, NH, P = x.shape
    Q = chunk_size
    xdt = to_chunks(dt.float()[..., None] * x.float(), Q)                  # [B, NC, Q, NH, P]
    Bm, C = (to_chunks(expand_heads(z.float(), NH), Q) for z in (Bm, C))   # [B, NC, Q, NH, N]
    a = to_chunks(dt.float() * A.float(), Q)                                # [B, NC, Q, NH]

    G = a.cumsum(2)                                                         # log decay since the chunk start
    causal = torch.ones(Q, Q, dtype=torch.bool, device=x.device).tril()[..., None]
    decay = torch.where(causal, G[:, :, :, None] - G[:, :, None], -torch.inf).exp()  # [B, NC, Q(t), Q(i), NH]
    scores = torch.einsum("bcthn,bcihn->bctih", C, Bm) * decay
    y = torch.einsum("bctih,bcihp->bcthp", scores, xdt)                    # within-chunk part

    h = x.new_zeros(B, NH, P, Bm.shape[-1]) if initial_state is None else initial_state.float()
    for c in range(xdt.shape[1]):
        y[:, c] += G[:, c, :, :, None].exp() * torch.einsum("bhpn,bthn->bthp", h, C[:, c])
        to_end = (G[:, c, -1:] - G[:, c]).exp()                             # [B, Q, NH]
        written = torch.einsum("bth,bthp,bthn->bhpn", to_end, xdt[:, c], Bm[:, c])
        h = G[:, c, -1, :, None, None].exp() * h + written
    y = y.flatten(1, 2)[:, :T] + D.float()[:, None] * x.float()
    return y, h


def mamba2_decode_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    Bm: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_b: torch.Tensor,
    buf_xdt: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One new token per row on top of its committed h0 + buffer; writes nothing.

    x: [B, NH, P]; dt: [B, NH]; A: [NH]; Bm, C: [B, NG, N]; D: [NH]; pools as in the module docstring.
    Returns y [B, NH, P], the token's buffer entry xdt [B, NH, P] and gcum [B, NH], float32.
    """
    NH = x.shape[-2]
    x, dt = x.float(), dt.float()
    Bm, C = expand_heads(Bm.float(), NH), expand_heads(C.float(), NH)
    c = kvbuffer.gather_committed(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots)
    gcum = c.last_gcum + dt * A.float()                                     # [B, NH]
    xdt = dt[..., None] * x
    y = _read_committed(C[:, None], gcum[:, None], c)[:, 0] + (Bm * C).sum(-1, keepdim=True) * xdt
    return y + D.float()[:, None] * x, xdt, gcum


def mamba2_verify_ref(
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
    """A token tree per row on top of its committed h0 + buffer; writes nothing, forms no per-node state.

    x: [B, T, NH, P]; dt: [B, T, NH]; A: [NH]; Bm, C: [B, T, NG, N]; D: [NH]; parents: [B, T] int64 and
    num_nodes: [B] int64 (verify_kernels.tree); pools as in the module docstring; ancestors: their ancestor_mask
    [B, T, T] when the caller has it (else derived from parents). Returns y [B, T, NH, P] and
    the nodes' buffer entries xdt [B, T, NH, P] and gcum [B, T, NH] (gcum = gcum of the parent + dt A),
    float32, zeros at padding.
    """
    NH = x.shape[-2]
    # padding nodes are zeroed: they then add nothing and come out as zeros
    x, dt, Bm, C = zero_padding_nodes(num_nodes, x, dt, Bm, C)
    Bm, C = expand_heads(Bm, NH), expand_heads(C, NH)
    c = kvbuffer.gather_committed(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots)
    gcum = tree_cumsum(dt * A.float(), parents, num_nodes, initial=c.last_gcum)   # [B, T, NH]
    xdt = dt[..., None] * x

    decay = kvbuffer.path_decay(gcum, parents, num_nodes, ancestors)        # [B, T(t), T(i), NH]
    scores = torch.einsum("bthn,bihn->btih", C, Bm) * decay
    read_g = kvbuffer.reading_gcum(gcum, num_nodes, c.last_gcum)
    y = _read_committed(C, read_g, c) + torch.einsum("btih,bihp->bthp", scores, xdt)
    return y + D.float()[:, None] * x, xdt, gcum


def mamba2_commit_ref(
    bm: torch.Tensor,
    xdt: torch.Tensor,
    gcum: torch.Tensor,
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_b: torch.Tensor,
    buf_xdt: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
    flush_length: int,
) -> torch.Tensor:
    """Commit the accepted root path of each row: append its entries to the buffer, or fold into the state.

    bm: [B, T, NG, N] (verify input); xdt: [B, T, NH, P] and gcum: [B, T, NH] (verify outputs); accepted:
    [B, A] int64 node indices, root first, -1 padded; num_accepted: [B] int64 (may be 0); pools as in the
    module docstring; flush_length: 1 <= flush_length <= L. With n = buf_len[r] + num_accepted[b]: if
    n < flush_length the entries go to buffer positions buf_len[r] .. n - 1; otherwise the buffer's entries
    then the accepted ones are folded into state_pool[state_slots[b]] (which must be >= 0; the caller
    allocates a zeroed slot first). buf_len is not modified (all layers share it; the caller sets it to 0 if
    flushed else n). Returns flushed [B] bool.
    """
    return kvbuffer.commit_entries(
        _fold_outer, bm, xdt, gcum, accepted, num_accepted, state_pool, state_slots, buf_b, buf_xdt, buf_gcum,
        buf_len, req_slots, flush_length
    )


def mamba2_flush_ref(
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_b: torch.Tensor,
    buf_xdt: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
) -> None:
    """Fold each row's buffer into its state, in place (rows with buf_len > 0, whose state slot must be >= 0).

    Pools as in the module docstring. buf_len is not modified (the caller resets it).
    """
    kvbuffer.flush_buffers(_fold_outer, state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots)


def _read_committed(C: torch.Tensor, gcum: torch.Tensor, c: kvbuffer.Committed) -> torch.Tensor:
    """h_c C_t for the committed state h_c = h0 + buffer decayed to token t, without forming h_c.

    C: [B, T, NH, N] of new tokens; gcum: [B, T, NH], their G_t.
    Returns e^{G_t} h0 C_t + sum_{i in buffer} e^{G_t - G_i} (B_i . C_t) xdt_i: [B, T, NH, P].
    """
    from_state = gcum.exp()[..., None] * torch.einsum("bhpn,bthn->bthp", c.state, C)
    return from_state + kvbuffer.read_buffer(C, gcum, c)


def _fold_outer(decay: torch.Tensor, b: torch.Tensor, xdt: torch.Tensor) -> torch.Tensor:
    """The fold's sum_i decay_i xdt_i B_i^T (h [P, N] += xdt B^T): decay [B, n, NH], b [B, n, NH, N],
    xdt [B, n, NH, P] -> [B, NH, P, N]."""
    return torch.einsum("bih,bihp,bihn->bhpn", decay, xdt, b)
