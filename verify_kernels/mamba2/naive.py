"""Mamba2 (Nemotron-H) selective state space in pure torch: the recurrence, chunked prefill and the
KVBuffer decode / verify / commit / flush. fp32 accumulation: inputs are cast to float32, outputs are float32.

Shapes: B batch rows, T tokens (or tree nodes) per row, NH heads of dim P, NG groups (NH % NG == 0; head h
reads group h // (NH // NG)), N state size. x: [.., NH, P]; dt: [.., NH], already softplus'ed and clamped
(> 0); A: [NH] (< 0); Bm, C: [.., NG, N]; D: [NH]. The log decay of a token is a_t = dt_t A and the
state of a head is h [P, N]:

    h_t = e^{a_t} h_{t-1} + dt_t x_t B_t^T,   y_t = h_t C_t + D x_t

KVBuffer (DESIGN.md section 2): the committed state h0 stays read-only and the tokens since the last flush are
buffer entries (B_i [NG, N], xdt_i = dt_i x_i [NH, P], G_i [NH]) with G_i the cumulative log decay from h0 to
token i. For a new token t with buffered / draft ancestors A(t) (no triangular solve: the entries are
independent of each other):

    y_t = e^{G_t} h0 C_t + sum_{i in A(t) + {t}} e^{G_t - G_i} (B_i . C_t) xdt_i + D x_t

Pools are indexed by slots: state_pool [S, NH, P, N] with state_slots [B] (-1: never flushed, h0 = 0 and
the pool is not read), buf_b [R, L, NG, N], buf_xdt [R, L, NH, P], buf_gcum [R, L, NH], buf_len [R] and
req_slots [B].
Only differences G_t - G_i <= 0 or a single G <= 0 are exponentiated, and masked pairs are set to -inf before
the exp, so decays as strong as -50 per token stay finite.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F

from verify_kernels.tree import ancestor_mask, tree_cumsum


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
    Bm, C = _expand_groups(Bm.float(), NH), _expand_groups(C.float(), NH)
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
    pad = -T % Q
    xdt = _to_chunks(dt.float()[..., None] * x.float(), pad, Q)            # [B, NC, Q, NH, P]
    Bm, C = (_to_chunks(_expand_groups(z.float(), NH), pad, Q) for z in (Bm, C))   # [B, NC, Q, NH, N]
    a = _to_chunks((dt.float() * A.float())[..., None], pad, Q)[..., 0]   # [B, NC, Q, NH]

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
    Bm, C = _expand_groups(Bm.float(), NH), _expand_groups(C.float(), NH)
    c = _committed(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots, NH)
    gcum = _last_gcum(c.gcum, c.length) + dt * A.float()                  # [B, NH]
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
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A token tree per row on top of its committed h0 + buffer; writes nothing, forms no per-node state.

    x: [B, T, NH, P]; dt: [B, T, NH]; A: [NH]; Bm, C: [B, T, NG, N]; D: [NH]; parents: [B, T] int64 and
    num_nodes: [B] int64 (verify_kernels.tree); pools as in the module docstring. Returns y [B, T, NH, P] and
    the nodes' buffer entries xdt [B, T, NH, P] and gcum [B, T, NH] (gcum = gcum of the parent + dt A),
    float32, zeros at padding.
    """
    B, T, NH, P = x.shape
    node = torch.arange(T, device=x.device) < num_nodes[:, None]           # [B, T]
    # padding nodes are zeroed: they then add nothing and come out as zeros
    x, dt, Bm, C = (_zero_padding(z.float(), node) for z in (x, dt, Bm, C))
    Bm, C = _expand_groups(Bm, NH), _expand_groups(C, NH)
    c = _committed(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots, NH)
    gcum = tree_cumsum(dt * A.float(), parents, num_nodes, initial=_last_gcum(c.gcum, c.length))  # [B, T, NH]
    xdt = dt[..., None] * x

    # e^{G_t - G_i} for i an ancestor of t or t itself, 0 elsewhere: [B, T(t), T(i), NH]
    on_path = ancestor_mask(parents, num_nodes)[..., None]
    decay = torch.where(on_path, gcum[:, :, None] - gcum[:, None], -torch.inf).exp()
    scores = torch.einsum("bthn,bihn->btih", C, Bm) * decay
    y = _read_committed(C, gcum, c) + torch.einsum("btih,bihp->bthp", scores, xdt)
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
    B, A = accepted.shape
    NH = xdt.shape[-2]
    _check_flush_length(flush_length, buf_b.shape[1])
    c = _committed(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots, NH)
    flushed = c.length + num_accepted >= flush_length                      # [B]
    _check_state_slots(state_slots, flushed)

    # the accepted entries in path order: [B, A, ...], zero past num_accepted
    taken = torch.arange(A, device=xdt.device) < num_accepted[:, None]     # [B, A]
    node = torch.where(taken, accepted, 0)
    acc_b, acc_xdt, acc_g = (_zero_padding(_take(z.float(), node), taken) for z in (bm, xdt, gcum))

    # rows that flush: fold the buffer's entries, then the accepted ones, into the state (one write per row)
    g_last = torch.where(
        num_accepted[:, None] > 0, _last_gcum(acc_g, num_accepted), _last_gcum(c.gcum, c.length)
    )
    state = _fold(
        c.state,
        torch.cat([c.b, _expand_groups(acc_b, NH)], 1),
        torch.cat([c.xdt, acc_xdt], 1),
        torch.cat([c.gcum, acc_g], 1),
        torch.cat([c.in_buffer, taken], 1),
        g_last,
    )
    state_pool[state_slots[flushed]] = state[flushed].to(state_pool.dtype)

    # rows that keep buffering: write at buf_len .. buf_len + a - 1
    append = taken & ~flushed[:, None]
    rows = req_slots[:, None].expand(B, A)[append]
    pos = (c.length[:, None] + torch.arange(A, device=xdt.device))[append]
    buf_b[rows, pos] = acc_b[append].to(buf_b.dtype)
    buf_xdt[rows, pos] = acc_xdt[append].to(buf_xdt.dtype)
    buf_gcum[rows, pos] = acc_g[append].to(buf_gcum.dtype)
    return flushed


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
    NH = buf_xdt.shape[-2]
    c = _committed(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots, NH)
    flushing = c.length > 0
    _check_state_slots(state_slots, flushing)
    state = _fold(c.state, c.b, c.xdt, c.gcum, c.in_buffer, _last_gcum(c.gcum, c.length))
    state_pool[state_slots[flushing]] = state[flushing].to(state_pool.dtype)


class _Committed(NamedTuple):
    """A batch's committed start, fp32: h0 and the buffer rows with entries past `length` zeroed."""

    state: torch.Tensor   # [B, NH, P, N], zeros where state_slots == -1
    b: torch.Tensor       # [B, L, NH, N], groups expanded to the heads
    xdt: torch.Tensor     # [B, L, NH, P]
    gcum: torch.Tensor    # [B, L, NH]
    length: torch.Tensor  # [B] int64, valid entries per row

    @property
    def in_buffer(self) -> torch.Tensor:
        """[B, L] bool: position i holds a valid entry."""
        return torch.arange(self.b.shape[1], device=self.b.device) < self.length[:, None]


def _committed(state_pool, state_slots, buf_b, buf_xdt, buf_gcum, buf_len, req_slots, NH) -> _Committed:
    B, L = req_slots.shape[0], buf_b.shape[1]
    has_state = state_slots >= 0
    state = state_pool.new_zeros(B, *state_pool.shape[1:], dtype=torch.float32)
    state[has_state] = state_pool[state_slots[has_state]].float()          # rows without a state read nothing
    length = buf_len[req_slots]
    # entries past buf_len are stale (possibly never written) and must not leak, not even as 0 * NaN
    in_buffer = torch.arange(L, device=buf_b.device) < length[:, None]     # [B, L]
    b, xdt, gcum = (_zero_padding(z[req_slots].float(), in_buffer) for z in (buf_b, buf_xdt, buf_gcum))
    return _Committed(state, _expand_groups(b, NH), xdt, gcum, length)


def _read_committed(C: torch.Tensor, gcum: torch.Tensor, c: _Committed) -> torch.Tensor:
    """h_c C_t for the committed state h_c = h0 + buffer decayed to token t, without forming h_c.

    C: [B, T, NH, N] of new tokens; gcum: [B, T, NH], their G_t.
    Returns e^{G_t} h0 C_t + sum_{i in buffer} e^{G_t - G_i} (B_i . C_t) xdt_i: [B, T, NH, P].
    """
    decay = torch.where(c.in_buffer[:, None, :, None], gcum[:, :, None] - c.gcum[:, None], -torch.inf).exp()
    scores = torch.einsum("bthn,blhn->btlh", C, c.b) * decay               # [B, T, L, NH]
    from_state = gcum.exp()[..., None] * torch.einsum("bhpn,bthn->bthp", c.state, C)
    return from_state + torch.einsum("btlh,blhp->bthp", scores, c.xdt)


def _fold(state, b, xdt, gcum, valid, g_last) -> torch.Tensor:
    """h <- e^{G_last} h + sum_{valid i} e^{G_last - G_i} xdt_i B_i^T.

    state: [B, NH, P, N]; b: [B, n, NH, N]; xdt: [B, n, NH, P]; gcum: [B, n, NH]; valid: [B, n] bool;
    g_last: [B, NH], the gcum of the last folded entry. Returns [B, NH, P, N].
    """
    decay = torch.where(valid[..., None], g_last[:, None] - gcum, -torch.inf).exp()  # [B, n, NH]
    return g_last.exp()[..., None, None] * state + torch.einsum("bih,bihp,bihn->bhpn", decay, xdt, b)


def _last_gcum(gcum: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """gcum [B, n, NH] at position length - 1, 0 where length == 0: [B, NH]."""
    last = gcum.gather(1, (length - 1).clamp(min=0)[:, None, None].expand(-1, 1, gcum.shape[-1]))[:, 0]
    return torch.where(length[:, None] > 0, last, 0.0)


def _take(z: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """z [B, T, ...] at node indices [B, A]: [B, A, ...]."""
    return z[torch.arange(z.shape[0], device=z.device)[:, None], node]


def _expand_groups(z: torch.Tensor, NH: int) -> torch.Tensor:
    """Groups [..., NG, N] -> heads [..., NH, N]: head h reads group h // (NH // NG)."""
    return z.repeat_interleave(NH // z.shape[-2], dim=-2)


def _zero_padding(z: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """z [B, T, ...] with the positions where valid [B, T] is False set to 0 (NaN included)."""
    return torch.where(valid.view(*valid.shape, *(1,) * (z.dim() - 2)), z, 0.0)


def _to_chunks(z: torch.Tensor, pad: int, Q: int) -> torch.Tensor:
    """[B, T, NH, D] -> right-padded with zeros, chunks [B, NC, Q, NH, D]."""
    z = F.pad(z, (0, 0, 0, 0, 0, pad))
    return z.reshape(z.shape[0], -1, Q, *z.shape[2:])


def _check_flush_length(flush_length: int, L: int) -> None:
    if not 1 <= flush_length <= L:
        raise ValueError(f"flush_length must be in [1, {L}] (the buffer capacity), got {flush_length}")


def _check_state_slots(state_slots: torch.Tensor, flushing: torch.Tensor) -> None:
    if (flushing & (state_slots < 0)).any():
        raise ValueError("rows that flush need a state slot (state_slots >= 0): allocate a zeroed one first")
