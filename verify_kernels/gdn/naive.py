"""Gated DeltaNet (Qwen3.5) in pure torch: the recurrence, chunked prefill and the KVBuffer decode / verify /
commit / flush. fp32 accumulation throughout: inputs are cast to float32, outputs are float32.

Shapes: B batch rows, T tokens (or tree nodes) per row, H key heads, HV value heads (HV % H == 0; value head h
reads key head h // (HV // H)), K key dim, V value dim. q and k come in l2-normalised and q already scaled by
K ** -0.5; g is the log decay (<= 0), beta in (0, 1). The state of a value head is S [K, V]:

    S_t = e^{g_t} S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t),   o_t = S_t^T q_t

KVBuffer (DESIGN.md section 2): the committed state S0 stays read-only and the tokens since the last flush are
buffer entries (k_i [H, K], u_i [HV, V], G_i [HV]) with G_i the cumulative log decay from S0 to token i. For a
new token t with buffered / draft ancestors A(t):

    u_t = beta_t (v_t - e^{G_t} S0^T k_t - sum_{i in A(t)} e^{G_t - G_i} (k_i . k_t) u_i)
    o_t = e^{G_t} S0^T q_t + sum_{i in A(t) + {t}} e^{G_t - G_i} (k_i . q_t) u_i

Pools are indexed by slots: state_pool [S, HV, K, V] with state_slots [B] (-1: never flushed, S0 = 0 and
the pool is not read), buf_k [R, L, H, K], buf_u [R, L, HV, V], buf_gcum [R, L, HV], buf_len [R] and
req_slots [B].
Only differences G_t - G_i <= 0 or a single G <= 0 are exponentiated, and masked pairs are set to -inf before
the exp, so decays as strong as -50 per token stay finite.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F

from verify_kernels.tree import ancestor_mask, tree_cumsum


def gdn_recurrent_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV]; initial_state: [B, HV, K, V] or None (zeros).
    Returns o [B, T, HV, V] and the final state [B, HV, K, V], float32.
    """
    B, T, HV, V = v.shape
    q, k = _expand_heads(q.float(), HV), _expand_heads(k.float(), HV)
    v, g, beta = v.float(), g.float(), beta.float()
    S = q.new_zeros(B, HV, k.shape[-1], V) if initial_state is None else initial_state.float().clone()
    o = v.new_zeros(B, T, HV, V)
    for t in range(T):
        S = g[:, t, :, None, None].exp() * S
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t]))
        S = S + k[:, t, :, :, None] * u[:, :, None, :]
        o[:, t] = torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o, S


def gdn_chunk_prefill_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule (UT / WY transform inside each chunk, state carried across chunks).

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV]; initial_state: [B, HV, K, V] or None (zeros).
    Returns o [B, T, HV, V] and the final state [B, HV, K, V], float32. T is padded to a multiple of
    chunk_size with g = 0, beta = 0 tokens, which leave the state unchanged (as do such tokens in the input:
    the model uses them to right-pad ragged batches).

    Inside a chunk, with G the cumulative log decay since the chunk start and S the state at the chunk start,
    the u of the chunk solve (I + A) u = beta (v - e^G S^T k), A[t, i] = beta_t e^{G_t - G_i} (k_t . k_i) for
    i < t. So u = U - W S with U = (I + A)^-1 beta v and W = (I + A)^-1 beta e^G k, both independent of S.
    """
    B, T, HV, V = v.shape
    C = chunk_size
    pad = -T % C
    # head-major chunks: [B, HV, NC, C, ...], so the (t, i) pairs of a chunk are the last two dims
    q, k = (_to_chunks(_expand_heads(x.float(), HV), pad, C) for x in (q, k))
    v = _to_chunks(v.float(), pad, C)
    g, beta = (_to_chunks(x.float()[..., None], pad, C)[..., 0] for x in (g, beta))

    G = g.cumsum(-1)                                                        # [B, HV, NC, C]
    causal = torch.ones(C, C, dtype=torch.bool, device=G.device).tril()
    decay = torch.where(causal, G[..., :, None] - G[..., None, :], -torch.inf).exp()  # [B, HV, NC, C, C]
    A = (beta[..., None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    eye = torch.eye(C, device=G.device)
    U = torch.linalg.solve_triangular(eye + A, beta[..., None] * v, upper=False)          # [B, HV, NC, C, V]
    W = torch.linalg.solve_triangular(eye + A, (beta * G.exp())[..., None] * k, upper=False)  # [..., C, K]
    qk = (q @ k.transpose(-1, -2)) * decay                                  # causal incl. the diagonal
    q_decayed = q * G.exp()[..., None]                                      # reads S at the chunk start
    k_decayed = k * (G[..., -1:] - G).exp()[..., None]                      # writes into the chunk-end state

    S = q.new_zeros(B, HV, k.shape[-1], V) if initial_state is None else initial_state.float()
    o = torch.zeros_like(v)
    for c in range(v.shape[2]):
        u = U[:, :, c] - W[:, :, c] @ S                                     # [B, HV, C, V]
        o[:, :, c] = q_decayed[:, :, c] @ S + qk[:, :, c] @ u
        S = G[:, :, c, -1, None, None].exp() * S + k_decayed[:, :, c].transpose(-1, -2) @ u
    o = o.flatten(2, 3)[:, :, :T].transpose(1, 2)                           # [B, T, HV, V]
    return o, S


def gdn_decode_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_k: torch.Tensor,
    buf_u: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One new token per row on top of its committed S0 + buffer; writes nothing.

    q, k: [B, H, K]; v: [B, HV, V]; g, beta: [B, HV]; pools as in the module docstring.
    Returns o [B, HV, V], the token's buffer entry u [B, HV, V] and gcum [B, HV], float32.
    """
    HV = v.shape[-2]
    q, k = _expand_heads(q.float(), HV), _expand_heads(k.float(), HV)
    c = _committed(state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots, HV)
    gcum = _last_gcum(c.gcum, c.length) + g.float()                       # [B, HV]
    k_read = _read_committed(k[:, None], gcum[:, None], c)[:, 0]         # [B, HV, V]
    q_read = _read_committed(q[:, None], gcum[:, None], c)[:, 0]
    u = beta.float()[..., None] * (v.float() - k_read)
    o = q_read + (q * k).sum(-1, keepdim=True) * u
    return o, u, gcum


def gdn_verify_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    num_nodes: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_k: torch.Tensor,
    buf_u: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A token tree per row on top of its committed S0 + buffer; writes nothing, forms no per-node state.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV]; parents: [B, T] int64 and num_nodes: [B] int64
    (verify_kernels.tree); pools as in the module docstring. Returns o [B, T, HV, V] and the nodes' buffer
    entries u [B, T, HV, V] and gcum [B, T, HV] (gcum = gcum of the parent + g), float32, zeros at padding.
    A node's u depends only on its ancestors, so the entries of any accepted root path can be committed as-is.
    """
    B, T, HV, V = v.shape
    node = torch.arange(T, device=v.device) < num_nodes[:, None]           # [B, T]
    # padding nodes are zeroed: then they add nothing and come out as zeros (beta = 0: u = 0; q = 0: o = 0)
    q, k, v, g, beta = (_zero_padding(x.float(), node) for x in (q, k, v, g, beta))
    q, k = _expand_heads(q, HV), _expand_heads(k, HV)
    c = _committed(state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots, HV)
    gcum = tree_cumsum(g, parents, num_nodes, initial=_last_gcum(c.gcum, c.length))   # [B, T, HV]
    k_read = _read_committed(k, gcum, c)                                    # [B, T, HV, V]
    q_read = _read_committed(q, gcum, c)

    # e^{G_t - G_i} for i an ancestor of t or t itself, 0 elsewhere: [B, T(t), T(i), HV]
    on_path = ancestor_mask(parents, num_nodes)[..., None]
    decay = torch.where(on_path, gcum[:, :, None] - gcum[:, None], -torch.inf).exp()
    kk = torch.einsum("bthk,bihk->btih", k, k) * decay
    qk = torch.einsum("bthk,bihk->btih", q, k) * decay
    # forward substitution in topological order: the ancestors i < t of node t are solved before t
    u = torch.zeros_like(v)
    for t in range(T):
        ancestors = torch.einsum("bih,bihv->bhv", kk[:, t, :t], u[:, :t])
        u[:, t] = beta[:, t, :, None] * (v[:, t] - k_read[:, t] - ancestors)
    o = q_read + torch.einsum("btih,bihv->bthv", qk, u)
    return o, u, gcum


def gdn_commit_ref(
    k: torch.Tensor,
    u: torch.Tensor,
    gcum: torch.Tensor,
    accepted: torch.Tensor,
    num_accepted: torch.Tensor,
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_k: torch.Tensor,
    buf_u: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
    flush_length: int,
) -> torch.Tensor:
    """Commit the accepted root path of each row: append its entries to the buffer, or fold into the state.

    k: [B, T, H, K] (verify input); u: [B, T, HV, V] and gcum: [B, T, HV] (verify outputs); accepted: [B, A]
    int64 node indices, root first, -1 padded; num_accepted: [B] int64 (may be 0); pools as in the module
    docstring; flush_length: 1 <= flush_length <= L. With n = buf_len[r] + num_accepted[b]: if
    n < flush_length the entries go to buffer positions buf_len[r] .. n - 1; otherwise the buffer's entries
    then the accepted ones are folded into state_pool[state_slots[b]] (which must be >= 0; the caller
    allocates a zeroed slot first). buf_len is not modified (all layers share it; the caller sets it to 0
    if flushed else n). Returns flushed [B] bool.
    """
    B, A = accepted.shape
    HV = u.shape[-2]
    _check_flush_length(flush_length, buf_k.shape[1])
    c = _committed(state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots, HV)
    flushed = c.length + num_accepted >= flush_length                      # [B]
    _check_state_slots(state_slots, flushed)

    # the accepted entries in path order: [B, A, ...], zero past num_accepted
    taken = torch.arange(A, device=k.device) < num_accepted[:, None]       # [B, A]
    node = torch.where(taken, accepted, 0)
    acc_k, acc_u, acc_g = (_zero_padding(_take(x.float(), node), taken) for x in (k, u, gcum))

    # rows that flush: fold the buffer's entries, then the accepted ones, into the state (one write per row)
    g_last = torch.where(
        num_accepted[:, None] > 0, _last_gcum(acc_g, num_accepted), _last_gcum(c.gcum, c.length)
    )
    state = _fold(
        c.state,
        torch.cat([c.k, _expand_heads(acc_k, HV)], 1),
        torch.cat([c.u, acc_u], 1),
        torch.cat([c.gcum, acc_g], 1),
        torch.cat([c.in_buffer, taken], 1),
        g_last,
    )
    state_pool[state_slots[flushed]] = state[flushed].to(state_pool.dtype)

    # rows that keep buffering: write at buf_len .. buf_len + a - 1
    append = taken & ~flushed[:, None]
    rows = req_slots[:, None].expand(B, A)[append]
    pos = (c.length[:, None] + torch.arange(A, device=k.device))[append]
    buf_k[rows, pos] = acc_k[append].to(buf_k.dtype)
    buf_u[rows, pos] = acc_u[append].to(buf_u.dtype)
    buf_gcum[rows, pos] = acc_g[append].to(buf_gcum.dtype)
    return flushed


def gdn_flush_ref(
    state_pool: torch.Tensor,
    state_slots: torch.Tensor,
    buf_k: torch.Tensor,
    buf_u: torch.Tensor,
    buf_gcum: torch.Tensor,
    buf_len: torch.Tensor,
    req_slots: torch.Tensor,
) -> None:
    """Fold each row's buffer into its state, in place (rows with buf_len > 0, whose state slot must be >= 0).

    Pools as in the module docstring. buf_len is not modified (the caller resets it).
    """
    HV = buf_u.shape[-2]
    c = _committed(state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots, HV)
    flushing = c.length > 0
    _check_state_slots(state_slots, flushing)
    state = _fold(c.state, c.k, c.u, c.gcum, c.in_buffer, _last_gcum(c.gcum, c.length))
    state_pool[state_slots[flushing]] = state[flushing].to(state_pool.dtype)


class _Committed(NamedTuple):
    """A batch's committed start, fp32: S0 and the buffer rows with entries past `length` zeroed."""

    state: torch.Tensor   # [B, HV, K, V], zeros where state_slots == -1
    k: torch.Tensor       # [B, L, HV, K], key heads expanded to the value heads
    u: torch.Tensor       # [B, L, HV, V]
    gcum: torch.Tensor    # [B, L, HV]
    length: torch.Tensor  # [B] int64, valid entries per row

    @property
    def in_buffer(self) -> torch.Tensor:
        """[B, L] bool: position i holds a valid entry."""
        return torch.arange(self.k.shape[1], device=self.k.device) < self.length[:, None]


def _committed(state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots, HV) -> _Committed:
    B, L = req_slots.shape[0], buf_k.shape[1]
    has_state = state_slots >= 0
    state = state_pool.new_zeros(B, *state_pool.shape[1:], dtype=torch.float32)
    state[has_state] = state_pool[state_slots[has_state]].float()          # rows without a state read nothing
    length = buf_len[req_slots]
    # entries past buf_len are stale (possibly never written) and must not leak, not even as 0 * NaN
    in_buffer = torch.arange(L, device=buf_k.device) < length[:, None]     # [B, L]
    k, u, gcum = (_zero_padding(x[req_slots].float(), in_buffer) for x in (buf_k, buf_u, buf_gcum))
    return _Committed(state, _expand_heads(k, HV), u, gcum, length)


def _read_committed(x: torch.Tensor, gcum: torch.Tensor, c: _Committed) -> torch.Tensor:
    """S_c^T x_t for the committed state S_c = S0 + buffer decayed to token t, without forming S_c.

    x: [B, T, HV, K] (keys or queries of new tokens); gcum: [B, T, HV], G_t of the new tokens.
    Returns e^{G_t} S0^T x_t + sum_{i in buffer} e^{G_t - G_i} (k_i . x_t) u_i: [B, T, HV, V].
    """
    exponent = gcum[:, :, None] - c.gcum[:, None]                           # [B, T, L, HV]
    decay = torch.where(c.in_buffer[:, None, :, None], exponent, -torch.inf).exp()
    scores = torch.einsum("bthk,blhk->btlh", x, c.k) * decay
    from_state = gcum.exp()[..., None] * torch.einsum("bthk,bhkv->bthv", x, c.state)
    return from_state + torch.einsum("btlh,blhv->bthv", scores, c.u)


def _fold(state, k, u, gcum, valid, g_last) -> torch.Tensor:
    """S <- e^{G_last} S + sum_{valid i} e^{G_last - G_i} k_i u_i^T.

    state: [B, HV, K, V]; k: [B, n, HV, K]; u: [B, n, HV, V]; gcum: [B, n, HV]; valid: [B, n] bool;
    g_last: [B, HV], the gcum of the last folded entry. Returns [B, HV, K, V].
    """
    decay = torch.where(valid[..., None], g_last[:, None] - gcum, -torch.inf).exp()  # [B, n, HV]
    return g_last.exp()[..., None, None] * state + torch.einsum("bnh,bnhk,bnhv->bhkv", decay, k, u)


def _last_gcum(gcum: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """gcum [B, n, HV] at position length - 1, 0 where length == 0: [B, HV]."""
    last = gcum.gather(1, (length - 1).clamp(min=0)[:, None, None].expand(-1, 1, gcum.shape[-1]))[:, 0]
    return torch.where(length[:, None] > 0, last, 0.0)


def _take(x: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """x [B, T, ...] at node indices [B, A]: [B, A, ...]."""
    return x[torch.arange(x.shape[0], device=x.device)[:, None], node]


def _expand_heads(x: torch.Tensor, HV: int) -> torch.Tensor:
    """Key heads [..., H, K] -> value heads [..., HV, K]: value head h reads key head h // (HV // H)."""
    return x.repeat_interleave(HV // x.shape[-2], dim=-2)


def _zero_padding(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """x [B, T, ...] with the positions where valid [B, T] is False set to 0 (NaN included)."""
    return torch.where(valid.view(*valid.shape, *(1,) * (x.dim() - 2)), x, 0.0)


def _to_chunks(x: torch.Tensor, pad: int, C: int) -> torch.Tensor:
    """[B, T, HV, D] -> right-padded with zeros, head-major chunks [B, HV, NC, C, D]."""
    x = F.pad(x, (0, 0, 0, 0, 0, pad)).transpose(1, 2)
    return x.reshape(*x.shape[:2], -1, C, x.shape[-1])


def _check_flush_length(flush_length: int, L: int) -> None:
    if not 1 <= flush_length <= L:
        raise ValueError(f"flush_length must be in [1, {L}] (the buffer capacity), got {flush_length}")


def _check_state_slots(state_slots: torch.Tensor, flushing: torch.Tensor) -> None:
    if (flushing & (state_slots < 0)).any():
        raise ValueError("rows that flush need a state slot (state_slots >= 0): allocate a zeroed one first")
