"""The Triton KV commit (verify_kernels/attention/kv_commit.py) against its torch reference (commit_kv_ref): the
committed positions of every row after the commit, for chains (nothing moves), tree paths that skip nodes, rows
that accept nothing, and head dims that are not powers of two. In Triton's interpreter on the CPU, on the GPU at
Qwen3.5-9B's KV heads."""

from __future__ import annotations

import pytest
import torch

from verify_kernels.attention import commit_kv, commit_kv_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# per row: (committed tokens, accepted path, root first; the rest -1)
ROWS = [
    (10, [0, 1, 2, 3]),   # a chain prefix: in place
    (0, [0, 2, 3]),       # a path through a tree: nodes 2 and 3 move to positions 1 and 2
    (7, [0, 3]),          # node 3 to position 1
    (40, []),             # nothing accepted (a padding row)
    (3, [0, 1, 4]),       # node 4 to position 2; nodes 0 and 1 stay
]


def pools_and_step(heads: int, dim: int, dtype, slots: int = 7, positions: int = 64, width: int = 5):
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(slots, positions, heads, dim, generator=gen).to(dtype)
    value = torch.randn(slots, positions, heads, dim, generator=gen).to(dtype)
    req_slots = torch.randperm(slots, generator=gen)[:len(ROWS)]
    seq_lens = torch.tensor([seq for seq, _ in ROWS])
    accepted = torch.tensor([path + [-1] * (width - len(path)) for _, path in ROWS])
    return [t.to(DEVICE) for t in (key, value, req_slots, seq_lens, accepted)]


def committed(pool: torch.Tensor, req_slots: torch.Tensor) -> list[torch.Tensor]:
    """Each row's positions up to its new committed end."""
    return [pool[slot, :seq + len(path)] for slot, (seq, path) in zip(req_slots.tolist(), ROWS, strict=True)]


@pytest.mark.parametrize(("heads", "dim", "dtype"), [(2, 16, torch.float32), (1, 24, torch.bfloat16),
                                                     (3, 32, torch.float16)], ids=["fp32", "bf16-dim24", "fp16-3heads"])
def test_kv_commit_matches_reference(heads, dim, dtype):
    key, value, req_slots, seq_lens, accepted = pools_and_step(heads, dim, dtype)
    ours_key, ours_value = key.clone(), value.clone()
    commit_kv(ours_key, ours_value, req_slots, seq_lens, accepted)
    commit_kv_ref(key, value, req_slots, seq_lens, accepted)
    for ours, theirs in ((ours_key, key), (ours_value, value)):
        for mine, reference in zip(committed(ours, req_slots), committed(theirs, req_slots), strict=True):
            assert torch.equal(mine, reference)
    # and the path did move: node 2 of row 1 now sits at position 1
    assert torch.equal(ours_key[req_slots[1], 1], key[req_slots[1], 1])


def test_kv_commit_refuses_mismatched_pools():
    key, value, req_slots, seq_lens, accepted = pools_and_step(2, 16, torch.float32)
    with pytest.raises(ValueError, match="one shape"):
        commit_kv(key, value[:, :32].contiguous(), req_slots, seq_lens, accepted)
    with pytest.raises(ValueError, match="seq_lens must have shape"):
        commit_kv(key, value, req_slots, seq_lens[:2], accepted)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cpu", reason="needs a CUDA device")
def test_kv_commit_at_model_size_in_a_cuda_graph():
    """Qwen3.5-9B's attention layers (4 KV heads of 256, bf16), replayed from a CUDA graph."""
    key, value, req_slots, seq_lens, accepted = pools_and_step(4, 256, torch.bfloat16, positions=512)
    ours_key, ours_value = key.clone(), value.clone()
    commit_kv(ours_key.clone(), ours_value.clone(), req_slots, seq_lens, accepted)  # compiled before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        commit_kv(ours_key, ours_value, req_slots, seq_lens, accepted)
    graph.replay()
    commit_kv_ref(key, value, req_slots, seq_lens, accepted)
    for mine, reference in zip(committed(ours_key, req_slots), committed(key, req_slots), strict=True):
        assert torch.equal(mine, reference)
    for mine, reference in zip(committed(ours_value, req_slots), committed(value, req_slots), strict=True):
        assert torch.equal(mine, reference)
