"""The Triton tree attention (verify_kernels/attention/flash_tree.py) against its torch reference (naive.py): the
outputs of every node, padding nodes included, and the pool after the nodes' keys / values are written. Without a
GPU the kernel runs in Triton's interpreter (tests/conftest.py) on small heads; the `gpu` cases use Qwen3.5-9B's and
Nemotron-3-Nano's attention sizes, and one replays the kernel in a CUDA graph on changed rows.

The kernel's pools hold NaN wherever nothing committed lives (other slots, positions from seq_len on, the node
positions before the write): a read there, or of a node from the pool instead of the step's inputs, fails. The
reference reads its kv_len positions through a mask, so it gets zeros there. The output is NaN-poisoned."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from verify_kernels.attention import tree_attention, tree_attention_ref, write_nodes_ref
from verify_kernels.tree import ancestor_mask

# every output a kernel allocates starts as NaN (tests/conftest.py); not for the engine test at the end
nan_empty = pytest.mark.usefixtures("nan_empty")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(DEVICE == "cpu", reason="needs a CUDA device")
PAD = 1000  # a padding node's parent entry: out of range on purpose, ignored


class Heads(NamedTuple):
    Hq: int
    Hkv: int
    D: int


class Row(NamedTuple):
    seq_len: int  # committed tokens
    parents: list[int]  # the step's nodes (PAD past the valid ones)


CHAIN5 = [-1, 0, 1, 2, 3]
TREE5 = [-1, 0, 0, 1, 2]  # two branches
FOREST5 = [-1, -1, 0, 1, -1]  # several children of the committed end
# ragged rows: T = 5, fewer valid nodes in some rows, committed prefixes from 0 to several key blocks
# (BLOCK_N = 64: 128 ends on a block boundary, 150 and 200 straddle one)
RAGGED = [Row(150, TREE5), Row(0, [-1, 0, PAD, PAD, PAD]), Row(37, FOREST5), Row(128, [-1, PAD, PAD, PAD, PAD])]
CASES = {
    "decode-g1": (Heads(2, 2, 16), [Row(70, [-1]), Row(0, [-1]), Row(5, [-1])]),
    "chains-g2": (Heads(4, 2, 32), [Row(200, CHAIN5), Row(3, CHAIN5), Row(0, CHAIN5)]),
    "ragged-trees-g2": (Heads(4, 2, 16), RAGGED),
    "ragged-trees-g8": (Heads(8, 1, 16), RAGGED),
    "head-dim-24": (Heads(4, 2, 24), [Row(90, TREE5), Row(0, FOREST5)]),  # masked head dims (padded to 32)
    "prompt-40": (Heads(4, 2, 16), [Row(70, list(range(-1, 39))), Row(0, list(range(-1, 25)) + [PAD] * 14)]),
}


def make_step(gen, heads: Heads, rows: list[Row], dtype, slots: int = 6, positions: int = 256):
    """-> the op's arguments: query, key, value, key_pool, value_pool (NaN wherever nothing committed lives),
    req_slots (a random subset of the pool's slots), seq_lens, ancestors, scale, kv_len (exact)."""
    B, T = len(rows), len(rows[0].parents)
    parents = torch.tensor([r.parents for r in rows])
    num_nodes = torch.tensor([sum(p != PAD for p in r.parents) for r in rows])
    ancestors = ancestor_mask(parents, num_nodes)
    seq_lens = torch.tensor([r.seq_len for r in rows])
    req_slots = torch.randperm(slots, generator=gen)[:B]
    query = torch.randn(B, T, heads.Hq, heads.D, generator=gen)
    key = torch.randn(B, T, heads.Hkv, heads.D, generator=gen)
    value = torch.randn(B, T, heads.Hkv, heads.D, generator=gen)
    committed = torch.arange(positions)[None, :] < seq_lens[:, None]  # [B, S]
    pool_mask = torch.zeros(slots, positions, dtype=torch.bool)
    pool_mask[req_slots] = committed
    pools = []
    for _ in range(2):
        data = torch.randn(slots, positions, heads.Hkv, heads.D, generator=gen)
        pools.append(torch.where(pool_mask[..., None, None], data, float("nan")))
    to = dict(device=DEVICE, dtype=dtype)
    args = [query.to(**to), key.to(**to), value.to(**to), *(p.to(**to) for p in pools), req_slots.to(DEVICE),
            seq_lens.to(DEVICE), ancestors.to(DEVICE), heads.D**-0.5, int(seq_lens.max()) + T]
    return args


def reference(args):
    """The reference's output in fp32 (from zeros where the kernel's pools hold NaN) and the pools the kernel
    should leave: its own, with the nodes written."""
    query, key, value, key_pool, value_pool, req_slots, seq_lens, ancestors, scale, kv_len = args
    clean = [torch.nan_to_num(p, nan=0.0).float() for p in (key_pool, value_pool)]
    out = tree_attention_ref(query.float(), key.float(), value.float(), *clean, req_slots, seq_lens, ancestors,
                             scale, kv_len)
    pools = [key_pool.clone(), value_pool.clone()]
    write_nodes_ref(key, value, *pools, req_slots, seq_lens)
    return out, pools


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rms_tol: float, max_tol: float) -> None:
    """Finite; relative RMS error and largest error against the (fp32) reference."""
    assert torch.isfinite(actual).all(), "non-finite values in the output"
    diff = actual.float() - expected.float()
    rms = (diff.pow(2).mean() / expected.float().pow(2).mean()).sqrt().item()
    assert rms <= rms_tol, f"relative RMS error {rms:.2e} > {rms_tol:.0e}"
    assert diff.abs().max().item() <= max_tol, f"largest error {diff.abs().max().item():.2e} > {max_tol:.0e}"


TOL = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 4e-2)}


def check(args, num_splits: int | None, dtype) -> None:
    expected, expected_pools = reference(args)
    out = tree_attention(*args, num_splits=num_splits)
    assert out.dtype == dtype
    assert_close(out, expected, *TOL[dtype])
    for name, ours, theirs in zip(("key_pool", "value_pool"), args[3:5], expected_pools, strict=True):
        assert torch.equal(ours.isnan(), theirs.isnan()), f"{name}: written outside the step's node positions"
        torch.testing.assert_close(ours, theirs, atol=0, rtol=0, equal_nan=True, msg=lambda m, n=name: f"{n}: {m}")


@nan_empty
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_reference(case, dtype):
    heads, rows = CASES[case]
    gen = torch.Generator().manual_seed(len(case))
    check(make_step(gen, heads, rows, dtype), None, dtype)


@nan_empty
@pytest.mark.parametrize("num_splits", [3, 8])
def test_key_splits_match_reference(num_splits):
    """Split-K: uneven splits, and 8 splits of rows with fewer key blocks than that (empty splits)."""
    gen = torch.Generator().manual_seed(num_splits)
    heads, rows = Heads(4, 2, 16), RAGGED
    check(make_step(gen, heads, rows, torch.float32), num_splits, torch.float32)


def test_kernel_refuses_what_it_cannot_take():
    gen = torch.Generator().manual_seed(0)
    args = make_step(gen, Heads(2, 2, 16), [Row(4, [-1])], torch.float32)
    with pytest.raises(ValueError, match="head dim"):
        big = make_step(gen, Heads(2, 2, 264), [Row(4, [-1])], torch.float32)
        tree_attention(*big)
    with pytest.raises(ValueError, match="ancestors"):
        tree_attention(*args[:7], args[7][:, :, :0], *args[8:])


# ---------------------------------------------------------------------------------------------------- GPU sizes

QWEN35_9B = Heads(16, 4, 256)
NEMOTRON_NANO = Heads(32, 2, 128)
GPU_ROWS = [Row(4100, TREE5), Row(0, CHAIN5), Row(1000, [-1, 0, 1, PAD, PAD]), Row(77, FOREST5), Row(2048, CHAIN5)]


@nan_empty
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("heads", [QWEN35_9B, NEMOTRON_NANO], ids=["qwen3.5-9b", "nemotron-3-nano"])
@pytest.mark.parametrize("rows", ["trees", "decode-long"])
def test_model_sizes_match_reference(heads, rows):
    """bf16 at full head sizes: ragged 5-node trees over prefixes up to 4100, and one row decoding after 8000
    committed tokens (split-K on its own choice)."""
    gen = torch.Generator().manual_seed(3)
    step = GPU_ROWS if rows == "trees" else [Row(8000, [-1])]
    check(make_step(gen, heads, step, torch.bfloat16, positions=8192), None, torch.bfloat16)


@nan_empty
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("num_splits", [1, 4])
def test_kernel_replays_in_a_cuda_graph(num_splits):
    """Captured once, replayed on other rows: new prefixes (longer than at capture), new trees, new slots."""
    gen = torch.Generator().manual_seed(4)
    first = make_step(gen, QWEN35_9B, GPU_ROWS, torch.bfloat16, positions=8192)
    second = make_step(gen, QWEN35_9B, [Row(6000, FOREST5), Row(3, TREE5), Row(0, CHAIN5), Row(700, CHAIN5),
                                        Row(5000, [-1, PAD, PAD, PAD, PAD])], torch.bfloat16, positions=8192)
    static = [a.clone() if isinstance(a, torch.Tensor) else a for a in first]
    static[-1] = 8192  # the key-length bucket of the capture
    tree_attention(*static, num_splits=num_splits)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tree_attention(*static, num_splits=num_splits)
    for a, b in zip(static[:8], second[:8], strict=True):
        a.copy_(b)
    graph.replay()
    expected, expected_pools = reference(second)
    assert_close(out, expected, *TOL[torch.bfloat16])
    for ours, theirs in zip(static[3:5], expected_pools, strict=True):
        torch.testing.assert_close(ours, theirs, atol=0, rtol=0, equal_nan=True)


# ---------------------------------------------------------------------------------------------------- the engine


def test_engine_greedy_tokens_unchanged_on_the_kernel(tmp_path, monkeypatch):
    """A tiny Qwen3.5 (attention heads of 16; linear heads of 8, which stay on the references, so only attention
    runs in the interpreter) generates the same greedy tokens with SPECDEC_BACKEND=triton as on the references:
    prompts, n-gram drafts verified as trees, commits."""
    from drafters import NgramDrafter
    from specdec.backend import attention_op
    from specdec.cache.spec import CacheConfig
    from specdec.engine.engine import Engine, EngineConfig
    from specdec.models import load_model
    from specdec.speculation import SamplingParams, TreeShape
    from tests.tiny_models import qwen35_text_config, save_tiny

    save_tiny(qwen35_text_config(), tmp_path, seed=21)
    # float32 on either device: in bf16 the reference's own rounding flips near-ties of this random model (request 2's
    # second token has a 0.025 logit gap), so bf16 greedy tokens differ between two correct attention ops.
    model = load_model(tmp_path, device=DEVICE, dtype=torch.float32)

    def generate(backend: str) -> tuple[list[list[int]], list[int]]:
        monkeypatch.setenv("SPECDEC_BACKEND", backend)
        config = EngineConfig(cache=CacheConfig(max_requests=2, max_seq_len=64, flush_length=4),
                              shape=TreeShape(steps=3), speculation="fixed")
        engine = Engine(model, NgramDrafter(), config)
        requests = [engine.add_request(p, SamplingParams(), 10) for p in ([5, 9, 2, 5, 9, 2, 5, 9], [17, 3])]
        engine.run()
        return [r.output for r in requests], [r.stats.steps for r in requests]

    expected, steps = generate("reference")
    assert generate("triton") == (expected, steps)
    assert attention_op(torch.device(DEVICE), 16) is tree_attention
    assert min(steps) < 10, "no draft was accepted: the test would not exercise verify steps"
