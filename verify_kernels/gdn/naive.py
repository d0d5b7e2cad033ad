"""Gated DeltaNet (Qwen3.5) in pure torch: the recurrence, chunked prefill and the KVBuffer decode / verify /
commit / flush. fp32 accumulation throughout: inputs are cast to float32, outputs are float32.

Shapes: B batch rows, T tokens (or tree nodes) per row, H key heads, HV value heads (HV % H == 0; value head h
reads key head h // (HV // H)), K key dim, V value dim. q and k come in l2-normalised and q already scaled by
K ** -0.5; g is the log decay (<= 0), beta in (0, 1). The state of a value head is S [K, V]:

    S_t = e^{g_t} S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - e^{g_t} S_{t-1}^T k_t),   o_t = S_t^T q_t

KVBuffer (docs/design.md section 2): the committed state S0 stays read-only and the tokens since the last flush are
buffer entries (k_i [H, K], u_i [HV, V], G_i [HV]) with G_i the cumulative log decay from S0 to token i. For a
new token t with buffered / draft ancestors A(t):

    u_t = beta_t (v_t - e^{G_t} S0^T k_t - sum_{i in A(t)} e^{G_t - G_i} (k_i . k_t) u_i)
    o_t = e^{G_t} S0^T q_t + sum_{i in A(t) + {t}} e^{G_t - G_i} (k_i . q_t) u_i

Pools are indexed by slots: state_pool [S, HV, K, V] with state_slots [B] (-1: never flushed, S0 = 0 and
the pool is not read), buf_k [R, L, H, K], buf_u [R, L, HV, V], buf_gcum [R, L, HV], buf_len [R] and
req_slots [B] (verify_kernels.kvbuffer gathers, appends to and folds them, as for mamba2).
Only differences G_t - G_i <= 0 or a single G <= 0 are exponentiated, and masked pairs are set to -inf before
the exp, so decays as strong as -50 per token stay finite.
"""

import torch

from verify_kernels import kvbuffer
from verify_kernels.kvbuffer import expand_heads, to_chunks, zero_padding_nodes
from verify_kernels.tree import tree_cumsum


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
    q, k = expand_heads(q.float(), HV), expand_heads(k.float(), HV)
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
    # head-major chunks: [B, HV, NC, C, ...], so the (t, i) pairs of a chunk are the last two dims
    q, k = (to_chunks(expand_heads(x.float(), HV), C).movedim(3, 1) for x in (q, k))
    v, g, beta = (to_chunks(x.float(), C).movedim(3, 1) for x in (v, g, beta))

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
    o = o.flatten(2, 3)[:, :, :T].transpose(1, 2).contiguous()              # [B, T, HV, V]
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
    q, k = expand_heads(q.float(), HV), expand_heads(k.float(), HV)
    c = kvbuffer.gather_committed(state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots)
    gcum = c.last_gcum + g.float()                                          # [B, HV]
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
    ancestors: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A token tree per row on top of its committed S0 + buffer; writes nothing, forms no per-node state.

    q, k: [B, T, H, K]; v: [B, T, HV, V]; g, beta: [B, T, HV]; parents: [B, T] int64 and num_nodes: [B] int64
    (verify_kernels.tree); pools as in the module docstring; ancestors: their ancestor_mask [B, T, T] when the caller
    has it (else derived from parents). Returns o [B, T, HV, V] and the nodes' buffer
    entries u [B, T, HV, V] and gcum [B, T, HV] (gcum = gcum of the parent + g), float32, zeros at padding.
    A node's u depends only on its ancestors, so the entries of any accepted root path can be committed as-is.
    """
    B, T, HV, V = v.shape
    # padding nodes are zeroed: then they add nothing and come out as zeros (beta = 0: u = 0; q = 0: o = 0)
    q, k, v, g, beta = zero_padding_nodes(num_nodes, q, k, v, g, beta)
    q, k = expand_heads(q, HV), expand_heads(k, HV)
    c = kvbuffer.gather_committed(state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots)
    gcum = tree_cumsum(g, parents, num_nodes, initial=c.last_gcum)          # [B, T, HV]
    read_g = kvbuffer.reading_gcum(gcum, num_nodes, c.last_gcum)
    k_read = _read_committed(k, read_g, c)                                  # [B, T, HV, V]
    q_read = _read_committed(q, read_g, c)

    decay = kvbuffer.path_decay(gcum, parents, num_nodes, ancestors)        # [B, T(t), T(i), HV]
    kk = torch.einsum("bthk,bihk->btih", k, k) * decay
    qk = torch.einsum("bthk,bihk->btih", q, k) * decay
    # u_t + beta_t sum_{i in A(t)} kk[t, i] u_i = beta_t (v_t - k_read_t): a unit lower-triangular system over the
    # nodes (ancestors come first in topological order), solved per row and head by forward substitution
    system = beta.permute(0, 2, 1)[..., None] * kk.permute(0, 3, 1, 2).tril(-1)   # [B, HV, T(t), T(i)]
    system = system + torch.eye(T, device=v.device)
    rhs = (beta[..., None] * (v - k_read)).transpose(1, 2)                 # [B, HV, T, V]
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True).transpose(1, 2).contiguous()
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
    return kvbuffer.commit_entries(
        _fold_outer, k, u, gcum, accepted, num_accepted, state_pool, state_slots, buf_k, buf_u, buf_gcum,
        buf_len, req_slots, flush_length
    )


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
    kvbuffer.flush_buffers(_fold_outer, state_pool, state_slots, buf_k, buf_u, buf_gcum, buf_len, req_slots)


def _read_committed(x: torch.Tensor, gcum: torch.Tensor, c: kvbuffer.Committed) -> torch.Tensor:
    """S_c^T x_t for the committed state S_c = S0 + buffer decayed to token t, without forming S_c.

    x: [B, T, HV, K] (keys or queries of new tokens); gcum: [B, T, HV], G_t of the new tokens.
    Returns e^{G_t} S0^T x_t + sum_{i in buffer} e^{G_t - G_i} (k_i . x_t) u_i: [B, T, HV, V].
    """
    from_state = gcum.exp()[..., None] * torch.einsum("bthk,bhkv->bthv", x, c.state)
    return from_state + kvbuffer.read_buffer(x, gcum, c)


def _fold_outer(decay: torch.Tensor, k: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The fold's sum_i decay_i k_i u_i^T (S [K, V] += k u^T): decay [B, n, HV], k [B, n, HV, K],
    u [B, n, HV, V] -> [B, HV, K, V]."""
    return torch.einsum("bnh,bnhk,bnhv->bhkv", decay, k, u)
