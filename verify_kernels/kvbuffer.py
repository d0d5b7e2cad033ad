"""The KVBuffer's slot-indexed pools in pure torch, shared by the mixers whose state of a head is a decayed sum of
outer products: gdn S [HV, K, V] += k u^T, mamba2 h [NH, P, N] += xdt B^T (docs/design.md section 2).

A token's buffer entry is (key [H, K], value [HV, V], gcum [HV]): gdn (k, u, G), mamba2 (B, xdt, G). H key
heads (mamba2: groups), HV value heads (HV % H == 0; value head h reads key head h // (HV // H)), K the key dim
(mamba2: N), V the value dim (mamba2: P), G the cumulative log decay from the committed state to the token.

Pools are indexed by slots: state_pool [S, HV, ...] with state_slots [B] (-1: never flushed, the committed state
is 0 and the pool is not read), buf_key [R, L, H, K], buf_value [R, L, HV, V], buf_gcum [R, L, HV], buf_len [R]
and req_slots [B].
The mixers differ in how a state is laid out, so each one reads its state itself and hands the fold its outer
product (FoldOuter); all the rest is here. Decays are exponentiated only as differences G_t - G_i <= 0 or a
single G <= 0, with masked pairs set to -inf before the exp.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from verify_kernels.tree import ancestor_mask

# (decay [B, n, HV], key [B, n, HV, K], value [B, n, HV, V]) -> sum_i decay_i (outer product of key_i and
# value_i in the mixer's state layout): [B, HV, ...]
FoldOuter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class Committed(NamedTuple):
    """A batch's committed start, fp32: the state and the buffer rows with entries past `length` zeroed."""

    state: torch.Tensor   # [B, HV, ...], zeros where state_slots == -1
    key: torch.Tensor     # [B, L, HV, K], key heads expanded to the value heads
    value: torch.Tensor   # [B, L, HV, V]
    gcum: torch.Tensor    # [B, L, HV]
    length: torch.Tensor  # [B] int64, valid entries per row

    @property
    def in_buffer(self) -> torch.Tensor:
        """[B, L] bool: position i holds a valid entry."""
        return torch.arange(self.key.shape[1], device=self.key.device) < self.length[:, None]

    @property
    def last_gcum(self) -> torch.Tensor:
        """[B, HV]: the gcum of the last buffered entry (0 for an empty buffer), where new tokens start from."""
        return _last_gcum(self.gcum, self.length)


def gather_committed(state_pool, state_slots, buf_key, buf_value, buf_gcum, buf_len, req_slots) -> Committed:
    """Each row's committed state and buffer, gathered from the pools (module docstring)."""
    B, L = req_slots.shape[0], buf_key.shape[1]
    has_state = state_slots >= 0
    state = state_pool.new_zeros(B, *state_pool.shape[1:], dtype=torch.float32)
    state[has_state] = state_pool[state_slots[has_state]].float()          # rows without a state read nothing
    length = buf_len[req_slots]
    # entries past buf_len are stale (possibly never written) and must not leak, not even as 0 * NaN
    in_buffer = torch.arange(L, device=buf_key.device) < length[:, None]   # [B, L]
    key, value, gcum = (_zero_padding(x[req_slots].float(), in_buffer) for x in (buf_key, buf_value, buf_gcum))
    return Committed(state, expand_heads(key, value.shape[-2]), value, gcum, length)


def read_buffer(x: torch.Tensor, gcum: torch.Tensor, c: Committed) -> torch.Tensor:
    """The buffer's part of reading the committed state with x_t: sum_{i in buffer} e^{G_t - G_i} (k_i . x_t) v_i.

    x: [B, T, HV, K] (gdn: keys or queries, mamba2: C of new tokens); gcum: [B, T, HV], their G_t.
    Returns [B, T, HV, V].
    """
    decay = torch.where(c.in_buffer[:, None, :, None], gcum[:, :, None] - c.gcum[:, None], -torch.inf).exp()
    scores = torch.einsum("bthk,blhk->btlh", x, c.key) * decay              # [B, T, L, HV]
    return torch.einsum("btlh,blhv->bthv", scores, c.value)


def path_decay(gcum: torch.Tensor, parents: torch.Tensor, num_nodes: torch.Tensor,
               ancestors: torch.Tensor | None = None) -> torch.Tensor:
    """e^{G_t - G_i} for i an ancestor of t or t itself, 0 elsewhere: [B, T(t), T(i), HV]. gcum: [B, T, HV];
    ancestors: the trees' ancestor_mask [B, T, T] when the caller has it already (else derived here)."""
    on_path = (ancestor_mask(parents, num_nodes) if ancestors is None else ancestors)[..., None]
    return torch.where(on_path, gcum[:, :, None] - gcum[:, None], -torch.inf).exp()


def commit_entries(fold_outer: FoldOuter, key, value, gcum, accepted, num_accepted, state_pool, state_slots,
                   buf_key, buf_value, buf_gcum, buf_len, req_slots, flush_length: int) -> torch.Tensor:
    """The commit of every mixer (gdn_commit_ref and mamba2_commit_ref give the contract): append each row's
    accepted entries to its buffer, or fold the buffer's then the accepted entries into its state.

    key: [B, T, H, K]; value: [B, T, HV, V]; gcum: [B, T, HV]; accepted: [B, A]; num_accepted: [B].
    Returns flushed [B] bool.
    """
    B, A = accepted.shape
    _check_flush_length(flush_length, buf_key.shape[1])
    length = buf_len[req_slots]
    flushed = length + num_accepted >= flush_length                         # [B]
    _check_state_slots(state_slots, flushed)

    # the accepted entries in path order: [B, A, ...], zero past num_accepted
    taken = torch.arange(A, device=value.device) < num_accepted[:, None]   # [B, A]
    node = torch.where(taken, accepted, 0)
    acc_key, acc_value, acc_g = (_zero_padding(_take(x.float(), node), taken) for x in (key, value, gcum))

    # rows that flush: fold the buffer's entries, then the accepted ones, into the state (one write per row); most
    # steps flush no row, and then nothing is folded at all
    if bool(flushed.any()):
        f = flushed
        c = gather_committed(state_pool, state_slots, buf_key, buf_value, buf_gcum, buf_len, req_slots)
        g_last = torch.where(num_accepted[f, None] > 0, _last_gcum(acc_g[f], num_accepted[f]), c.last_gcum[f])
        state = _fold(
            fold_outer,
            c.state[f],
            torch.cat([c.key[f], expand_heads(acc_key[f], c.value.shape[-2])], 1),
            torch.cat([c.value[f], acc_value[f]], 1),
            torch.cat([c.gcum[f], acc_g[f]], 1),
            torch.cat([c.in_buffer[f], taken[f]], 1),
            g_last,
        )
        state_pool[state_slots[f]] = state.to(state_pool.dtype)

    # rows that keep buffering: write at buf_len .. buf_len + a - 1
    append = taken & ~flushed[:, None]
    rows = req_slots[:, None].expand(B, A)[append]
    pos = (length[:, None] + torch.arange(A, device=value.device))[append]
    for buf, acc in ((buf_key, acc_key), (buf_value, acc_value), (buf_gcum, acc_g)):
        buf[rows, pos] = acc[append].to(buf.dtype)
    return flushed


def flush_buffers(fold_outer: FoldOuter, state_pool, state_slots, buf_key, buf_value, buf_gcum, buf_len,
                  req_slots) -> None:
    """Fold each row's buffer into its state, in place (rows with buf_len > 0, whose state slot must be >= 0).
    buf_len is not modified (the caller resets it)."""
    c = gather_committed(state_pool, state_slots, buf_key, buf_value, buf_gcum, buf_len, req_slots)
    flushing = c.length > 0
    _check_state_slots(state_slots, flushing)
    state = _fold(fold_outer, c.state, c.key, c.value, c.gcum, c.in_buffer, c.last_gcum)
    state_pool[state_slots[flushing]] = state[flushing].to(state_pool.dtype)


def expand_heads(x: torch.Tensor, HV: int) -> torch.Tensor:
    """Key heads / groups [..., H, K] -> value heads [..., HV, K]: value head h reads key head h // (HV // H)."""
    return x.repeat_interleave(HV // x.shape[-2], dim=-2)


def zero_padding_nodes(num_nodes: torch.Tensor, *xs: torch.Tensor) -> list[torch.Tensor]:
    """xs [B, T, ...] in float32 with the padding nodes (index >= num_nodes [B]) set to 0, NaN included."""
    node = torch.arange(xs[0].shape[1], device=xs[0].device) < num_nodes[:, None]   # [B, T]
    return [_zero_padding(x.float(), node) for x in xs]


def reading_gcum(gcum: torch.Tensor, num_nodes: torch.Tensor, last_gcum: torch.Tensor) -> torch.Tensor:
    """gcum [B, T, heads] for reading the committed start: padding nodes (gcum 0) take the last committed G
    (last_gcum [B, heads]), so that their decays against buffer entries stay <= 1. With 0 they would be
    e^{-G_i}, which overflows once a buffer entry's G is below -88 and turns 0 * inf into NaN."""
    node = torch.arange(gcum.shape[1], device=gcum.device) < num_nodes[:, None]
    return torch.where(node[..., None], gcum, last_gcum[:, None])


def to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[B, T, ...] -> right-padded with zeros to a multiple of chunk_size, chunks [B, NC, chunk_size, ...]."""
    x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, -x.shape[1] % chunk_size))
    return x.unflatten(1, (-1, chunk_size))


def _fold(fold_outer: FoldOuter, state, key, value, gcum, valid, g_last) -> torch.Tensor:
    """S <- e^{G_last} S + sum_{valid i} e^{G_last - G_i} (key_i, value_i outer product).

    state: [B, HV, ...]; key: [B, n, HV, K]; value: [B, n, HV, V]; gcum: [B, n, HV]; valid: [B, n] bool;
    g_last: [B, HV], the gcum of the last folded entry. Returns [B, HV, ...].
    """
    decay = torch.where(valid[..., None], g_last[:, None] - gcum, -torch.inf).exp()  # [B, n, HV]
    return g_last.exp()[..., None, None] * state + fold_outer(decay, key, value)


def _last_gcum(gcum: torch.Tensor, length: torch.Tensor) -> torch.Tensor:
    """gcum [B, n, HV] at position length - 1, 0 where length == 0: [B, HV]."""
    last = gcum.gather(1, (length - 1).clamp(min=0)[:, None, None].expand(-1, 1, gcum.shape[-1]))[:, 0]
    return torch.where(length[:, None] > 0, last, 0.0)


def _take(x: torch.Tensor, node: torch.Tensor) -> torch.Tensor:
    """x [B, T, ...] at node indices [B, A]: [B, A, ...]."""
    return x[torch.arange(x.shape[0], device=x.device)[:, None], node]


def _zero_padding(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """x [B, T, ...] with the positions where valid [B, T] is False set to 0 (NaN included)."""
    return torch.where(valid.view(*valid.shape, *(1,) * (x.dim() - 2)), x, 0.0)


def _check_flush_length(flush_length: int, L: int) -> None:
    if not 1 <= flush_length <= L:
        raise ValueError(f"flush_length must be in [1, {L}] (the buffer capacity), got {flush_length}")


def _check_state_slots(state_slots: torch.Tensor, flushing: torch.Tensor) -> None:
    if (flushing & (state_slots < 0)).any():
        raise ValueError("rows that flush need a state slot (state_slots >= 0): allocate a zeroed one first")


def decode_then_commit(decode: Callable, commit: Callable, key_index: int, *args):
    """Plain decoding in reference form, the oracle of the fused decode-commit kernels: `decode` of one token per row,
    then `commit` of that token (accepted [[0]]): its entry appended to the buffer, or folded into the state.

    args: decode's arguments (the token inputs, then state_pool, state_slots, buf_key, buf_value, buf_gcum, buf_len,
    req_slots), then flush_length; key_index: which token input the buffer keeps as the entry's key (GDN: k,
    Mamba2: B). -> (the decode's output [B, ...], flushed [B] bool)."""
    *decode_args, flush_length = args
    out, value, gcum = decode(*decode_args)
    key, pools = decode_args[key_index], decode_args[-7:]
    rows = key.shape[0]
    accepted = torch.zeros(rows, 1, dtype=torch.long, device=key.device)
    num_accepted = torch.ones(rows, dtype=torch.long, device=key.device)
    flushed = commit(key[:, None], value[:, None], gcum[:, None], accepted, num_accepted, *pools, flush_length)
    return out, flushed
