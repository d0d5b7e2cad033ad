"""The commits that the GDN and Mamba2 kernel benchmarks time (benchmarks/gdn.py, benchmarks/mamba2.py): a
speculative step's commit of `accepted` nodes per row with no row folding its buffer, one row in eight (about what
a step at the shipped acceptance and a 16-entry buffer meets) and every row, the buffers filled to match."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from benchmarks.timing import time_calls
from verify_kernels.intermediate import commit_node_states

# (case, buffered entries of a folding row, of the others, rows that fold: every n-th), for `accepted` new entries a
# row and a buffer of flush_length: a folding row's buffer holds flush_length - accepted
CASES = (
    ("commit, no row folds", None, 4, 0),
    ("commit, 1 row in 8 folds", "full", 4, 8),
    ("commit, every row folds", "full", None, 1),
)


def time_commit_cases(batch: int, rotations: int, buf_len: torch.Tensor, accepted: int, flush_length: int,
                      commit: Callable[[int], Callable[[], object]]) -> list[dict]:
    """Each case timed: buf_len (the pool's, [rotations * batch]) set to its fills, commit(r) the call of rotation
    r -> per case {case, batch, rotations, folded_rows, entries_read (of the folding rows' buffers and new entries),
    ours_us}."""
    rows = []
    for case, folding_fill, other_fill, every in CASES:
        folds = torch.zeros(batch, dtype=torch.bool, device=buf_len.device)
        if every:
            folds[::every] = True
        fill = torch.where(folds, flush_length - accepted if folding_fill else 0, other_fill or 0)
        buf_len.copy_(fill.repeat(rotations))
        seconds = time_calls([commit(r) for r in range(rotations)])
        folded = int(folds.sum())
        rows.append({"case": case, "batch": batch, "rotations": rotations, "folded_rows": folded,
                     "entries_read": int(fill[folds].sum()) + folded * accepted, "ours_us": seconds * 1e6})
    return rows


def chain_prefix(batch: int, accepted: int, device="cuda") -> tuple[torch.Tensor, torch.Tensor]:
    """Every row's accepted path, the first `accepted` nodes of its chain: accepted [B, A], num_accepted [B]."""
    nodes = torch.arange(accepted, device=device).expand(batch, accepted).contiguous()
    return nodes, torch.full((batch,), accepted, device=device)


def add_baseline_commit(rows: list[dict], state_pool: torch.Tensor, slots: list[torch.Tensor], nodes: int,
                        accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """The intermediate-state baseline's commit beside each of `rows` (one batch's cases): the last accepted node's
    state, of the `nodes` states a row its verify wrote ([B, T, *state] a rotation), copied into the row's slot of
    the pool (verify_kernels/intermediate: the engine's, as SGLang's and vLLM's); it does not depend on folds."""
    rotations, batch = len(slots), accepted.shape[0]
    states = torch.empty(rotations, batch, nodes, *state_pool.shape[1:], device=state_pool.device).normal_(std=0.1)
    seconds = time_calls([partial(commit_node_states, states[r], accepted, num_accepted, state_pool, slots[r])
                          for r in range(rotations)])
    for row in rows:
        row.update(baseline_us=seconds * 1e6, baseline_bytes_moved=2 * states[0, :, 0].nbytes,
                   speedup_vs_baseline=seconds * 1e6 / row["ours_us"])
