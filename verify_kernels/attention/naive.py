"""Tree attention over a slot-indexed KV pool, in torch: the oracle of the Triton kernel (flash_tree.py) and the
CPU path of the engine. The math is docs/design.md section 2 (full-attention layers).

Each row of a step holds T nodes (a draft tree, a chain, a decoded token or a prompt) on top of its request's
committed tokens. The pool row req_slots[b] holds those tokens at positions 0 .. seq_lens[b] - 1; node j of the
step goes to position seq_lens[b] + j. Node j attends to the committed prefix, its ancestors and itself:

    key position p is visible to node j  iff  p < seq_len  or  (i = p - seq_len) is j or an ancestor of j

Padding nodes (no ancestors) see the prefix and themselves, so no softmax row is empty. Grouped-query attention:
query head h reads KV head h // (Hq / Hkv).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def tree_attention_mask(seq_lens: torch.Tensor, ancestors: torch.Tensor, kv_len: int) -> torch.Tensor:
    """[B, T, kv_len] bool: the visibility rule above; ancestors [B, T, T] bool (ancestors[b, j, i]: node i is j or
    an ancestor of j), seq_lens [B]."""
    batch, width, _ = ancestors.shape
    device = ancestors.device
    tree = ancestors | torch.eye(width, dtype=torch.bool, device=device)[None]
    key_pos = torch.arange(kv_len, device=device)[None, :]  # [1, P]
    committed = key_pos < seq_lens[:, None]  # [B, P]
    node_of_key = key_pos - seq_lens[:, None]  # [B, P]: the node held at key position p
    in_step = (node_of_key >= 0) & (node_of_key < width)
    gather_index = node_of_key.clamp(0, width - 1)[:, None, :].expand(batch, width, kv_len)
    sees_node = torch.gather(tree, 2, gather_index) & in_step[:, None, :]
    return committed[:, None, :] | sees_node


def write_nodes_ref(key: torch.Tensor, value: torch.Tensor, key_pool: torch.Tensor, value_pool: torch.Tensor,
                    req_slots: torch.Tensor, seq_lens: torch.Tensor) -> None:
    """Store node j of row b at key_pool / value_pool[req_slots[b], seq_lens[b] + j], cast to the pool's dtype.
    Padding nodes are stored too, past the valid ones, where nothing committed lives: the write has the same shape
    every step (no data-dependent indexing: CUDA graphs)."""
    width = key.shape[1]
    slots = req_slots[:, None].expand(-1, width)
    positions = seq_lens[:, None] + torch.arange(width, device=key.device)
    key_pool[slots, positions] = key.to(key_pool.dtype)
    value_pool[slots, positions] = value.to(value_pool.dtype)


def tree_attention_ref(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_pool: torch.Tensor,
    value_pool: torch.Tensor,
    req_slots: torch.Tensor,
    seq_lens: torch.Tensor,
    ancestors: torch.Tensor,
    scale: float,
    kv_len: int,
) -> torch.Tensor:
    """Write the step's nodes into the pool, then attend every node to its visible keys.

    query: [B, T, Hq, D]; key, value: [B, T, Hkv, D], the step's nodes; key_pool, value_pool: [R, S, Hkv, D] (one
    row of S positions per request slot, written in place); req_slots, seq_lens: [B] int64; ancestors: [B, T, T]
    bool; scale: the softmax scale; kv_len: key positions read per row, >= max(seq_lens) + T (CUDA graphs pass a
    bucket). Returns [B, T, Hq, D] in query's dtype.

    Gathers pool[req_slots, :kv_len] into a fresh [B, kv_len, Hkv, D] tensor and runs SDPA with the boolean mask.
    """
    write_nodes_ref(key, value, key_pool, value_pool, req_slots, seq_lens)
    keys, values = key_pool[req_slots, :kv_len], value_pool[req_slots, :kv_len]  # [B, P, Hkv, D]
    return masked_attention_ref(query, keys, values, tree_attention_mask(seq_lens, ancestors, kv_len), scale)


def masked_attention_ref(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                         scale: float) -> torch.Tensor:
    """query [B, T, Hq, D]; keys, values [B, P, Hkv, D]; mask [B, T, P] bool -> [B, T, Hq, D] (SDPA, query's dtype)."""
    B, T, Hq, D = query.shape
    Hkv = keys.shape[2]
    groups = Hq // Hkv
    # grouped-query attention without copying the keys per query head: the query heads that share a KV head
    # (heads j * groups .. j * groups + groups - 1) become rows of one sequence, [B, Hkv, groups * T, D]
    query = query.reshape(B, T, Hkv, groups, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, groups * T, D)
    mask = mask[:, None, None].expand(-1, -1, groups, -1, -1).reshape(B, 1, groups * T, -1)
    out = F.scaled_dot_product_attention(query, keys.transpose(1, 2).to(query.dtype),
                                         values.transpose(1, 2).to(query.dtype), attn_mask=mask, scale=scale)
    return out.view(B, Hkv, groups, T, D).permute(0, 3, 1, 2, 4).reshape(B, T, Hq, D)


def commit_kv_ref(key_pool: torch.Tensor, value_pool: torch.Tensor, req_slots: torch.Tensor, seq_lens: torch.Tensor,
                  accepted: torch.Tensor) -> None:
    """Keep each row's accepted path: accepted [B, A] node indices (root first, increasing, -1 padded) move from
    seq_lens[b] + accepted[b, i] to seq_lens[b] + i (a no-op for an accepted chain prefix), in place.

    Every column moves, with the same shapes every step (CUDA graphs): column i past the path copies node 0 to
    seq_len + i, past the new committed end, where nothing committed lives."""
    width = accepted.shape[1]
    slots = req_slots[:, None].expand(-1, width)
    source = seq_lens[:, None] + accepted.clamp(min=0)
    target = seq_lens[:, None] + torch.arange(width, device=accepted.device)
    moved_key, moved_value = key_pool[slots, source], value_pool[slots, source]  # gathered before any write
    key_pool[slots, target] = moved_key
    value_pool[slots, target] = moved_value
