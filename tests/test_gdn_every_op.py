"""The Gated DeltaNet kernels, every op on the same batch: shared block sizes, batch one, long buffers, rows without a
state, strong decay, bad inputs; the `gpu` cases at Qwen3.5's head sizes, against the torch references
(verify_kernels/gdn/naive.py) through tests/gdn_checks.py. Without a GPU the kernels run in Triton's interpreter
(tests/conftest.py) on small heads."""

import pytest
import torch

from tests.gdn_checks import (
    COMMITS,
    CUDA,
    DIMS,
    GPU_DIMS,
    GPU_ROWS,
    GPU_TOL,
    ROWS,
    TOL,
    Dims,
    L,
    check_commit,
    check_decode,
    check_decode_commit,
    check_flush,
    check_verify,
    make_batch,
    swapped_caps,
)
from tests.reference_checks import NAN, TREE
from verify_kernels.gdn import commit as commit_module
from verify_kernels.gdn import decode as decode_module
from verify_kernels.gdn import fold as fold_module
from verify_kernels.gdn import gdn_decode, gdn_decode_commit, gdn_verify
from verify_kernels.gdn import verify as verify_module
from verify_kernels.tree import chain_parents

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")


def test_outputs_are_nan_poisoned():
    assert torch.empty(3).isnan().all() and torch.empty_like(torch.zeros(2, 2)).isnan().all()



def test_small_blocks(monkeypatch):
    """V = K = 32 in blocks of 16: two V blocks per head (a key head's entries written once, gcum by one block; the
    decode's buffer loaded before and after buf_len), two K blocks in verify's products and S0 reads, verify's S0
    reads as dots and one node at a time (per value head), fused (its loads first and not) and in two passes; the
    small trees' node-by-node tree pass."""
    monkeypatch.setattr(fold_module, "FOLD_BLOCK_V", 16)
    monkeypatch.setattr(decode_module, "BLOCK_V", 16)
    monkeypatch.setattr(decode_module, "SMALL_BLOCK_V", 16)
    for configs in ("STATE_DOT_CONFIGS", "FUSED_CONFIGS"):
        monkeypatch.setattr(verify_module, configs, {bt: (16, 4) for bt in getattr(verify_module, configs)})
    monkeypatch.setattr(verify_module, "STATE_FMA_CONFIG", (16, 4))
    monkeypatch.setattr(verify_module, "TREE_CONFIG", (16, 2))
    monkeypatch.setattr(verify_module, "TREE_SMALL_CONFIG", (16, 2))
    monkeypatch.setattr(verify_module, "STATE_BLOCK_K", 16)
    d = DIMS["k32-hv2"]
    # decode + commit with the fold kernel, then folding in place with the buffer loaded only up to buf_len
    for small_batch, before_len in ((0, True), (len(ROWS), False)):
        monkeypatch.setattr(decode_module, "SMALL_BATCH", small_batch)
        monkeypatch.setattr(decode_module, "BUFFER_BEFORE_LEN", before_len)
        check_decode(make_batch(d, ROWS, seed=6))
        check_decode_commit(make_batch(d, ROWS, seed=6), 6)
    # verify's S0 reads as dots over two K blocks in two passes, one node at a time in the fused kernel, then one
    # node at a time in the state pass, per value head
    monkeypatch.setattr(verify_module, "STATE_SHARE_KEY_HEAD", False)
    for fma_max_nodes, fused_max_batch, loads_first in ((0, 0, False), (64, len(ROWS), False), (64, len(ROWS), True),
                                                        (0, len(ROWS), True), (64, 0, False)):
        monkeypatch.setattr(verify_module, "FMA_MAX_NODES", fma_max_nodes)
        monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", fused_max_batch)
        monkeypatch.setattr(verify_module, "FUSED_LOADS_FIRST", loads_first)
        check_verify(make_batch(d, ROWS, seed=6, T=12, num_nodes=[12, 5, 9, 0, 12], shape="random"))
    # the small trees' node-by-node tree pass over two V blocks in one program and two K steps, a key head's value
    # heads a program
    monkeypatch.setattr(verify_module, "SMALL_TREE_PASS", True)
    monkeypatch.setattr(verify_module, "SMALL_TREE_CONFIG", (16, 2, 1))
    monkeypatch.setattr(verify_module, "SMALL_TREE_FEW_ROWS", 0)
    monkeypatch.setattr(verify_module, "SMALL_TREE_BLOCK_K", 16)
    monkeypatch.setattr(verify_module, "SMALL_TREE_HEADS_PER_PROGRAM", None)
    check_verify(make_batch(d, ROWS, seed=6, T=4, num_nodes=[4, 3, 1, 0, 4], shape="chain"))
    check_commit(make_batch(d, ROWS, seed=6, T=len(TREE), shape="tree"), *COMMITS["fold-and-append"][::-1])
    check_flush(make_batch(d, ROWS, seed=6))



@pytest.mark.parametrize("commit_batch", [0, 1], ids=["two-kernels", "one-launch"])
def test_batch_one(monkeypatch, commit_batch):
    """A single row: a 4-chain verify, a decode, a decode + commit that folds and commits that append and fold."""
    monkeypatch.setattr(commit_module, "ONE_LAUNCH_MAX_BATCH", commit_batch)
    d = DIMS["k32-hv2"]
    b = make_batch(d, [(5, True)], seed=12, T=4)
    check_verify(b)
    check_decode(b)
    assert check_decode_commit(b, 6).tolist() == [True]
    assert check_commit(b, [2], L).tolist() == [False]
    assert check_commit(b, [4], 7).tolist() == [True]


@pytest.mark.parametrize("flush_length", [48, 64], ids=["flush48", "flush64"])
def test_long_buffers_and_paths(flush_length):
    """Buffers and accepted paths longer than the kernels' blocks of entries (16): 63-entry buffers, 40-node
    chains, up to 33 entries appended or folded."""
    rows = [(40, True), (0, False), (63, True), (20, False)]
    b = make_batch(DIMS["k16-hv1"], rows, seed=10, T=40, capacity=64)
    check_verify(b)
    check_decode(b)
    check_decode_commit(b, flush_length)
    check_commit(b, [20, 33, 0, 30], flush_length)
    check_flush(b)


def test_short_context_rows_never_read_the_state_pool():
    """No row has a state and the whole state pool is NaN: verify, decode and a decode + commit that folds
    nothing."""
    rows = [(0, False), (6, False), (3, False)]
    b = make_batch(DIMS["k16-hv1"], rows, seed=7, T=5)
    b.pools.state_pool.fill_(NAN)
    check_verify(b)
    check_decode(b)
    assert not check_decode_commit(b, L).any()


def test_strong_decay_stays_finite():
    """Log decays of -50 per token on a full 63-entry buffer and a 64-node chain: finite, and the references'
    results to the fp32 resolution of G (in the thousands: |G| 2^-24 absolute on each decay exponent)."""
    rows = [(63, True), (63, False), (0, True)]
    b = make_batch(Dims(1, 2, 16, 16), rows, seed=8, T=64, capacity=64, max_decay=50.0)
    tol = max(TOL, 4 * 50 * (63 + 64) * 2**-24)
    check_verify(b, tol=tol)
    check_decode(b, tol=tol)
    assert check_decode_commit(b, 64, tol=tol).tolist() == [True, True, False]
    assert check_commit(b, [1, 0, 64], 64, tol=tol).tolist() == [True, False, True]
    check_flush(b, tol=tol)


def test_bad_inputs_raise():
    b = make_batch(DIMS["k16-hv1"], ROWS, seed=9)
    q, k, v, g, beta = b.token
    pools = b.pools.args()
    with pytest.raises(ValueError, match="K and V"):
        gdn_decode(q[..., :12].contiguous(), k[..., :12].contiguous(), v, g, beta, *pools)
    with pytest.raises(ValueError, match="multiple"):
        gdn_decode(q, k, v[:, :1].repeat(1, 3, 1), g, beta, *pools)
    with pytest.raises(ValueError, match="contiguous"):
        gdn_decode(q, k, v.transpose(1, 2).contiguous().transpose(1, 2), g, beta, *pools)
    with pytest.raises(ValueError, match="float64"):
        gdn_decode(q.double(), k, v, g, beta, *pools)
    with pytest.raises(ValueError, match="flush_length"):
        gdn_decode_commit(q, k, v, g, beta, *pools, L + 1)
    long = [x[:, None].expand(-1, 65, *x.shape[1:]).contiguous() for x in b.token]
    with pytest.raises(ValueError, match="T must be"):
        gdn_verify(*long, chain_parents(len(ROWS), 65), torch.full((len(ROWS),), 65), *pools)



@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("paths", ["small-batch-kernels", "large-batch-kernels"])
@pytest.mark.parametrize("shape", ["chain", "random"])
@pytest.mark.parametrize("d", GPU_DIMS.values(), ids=GPU_DIMS.keys())
def test_gpu_full_size(d, shape, paths, monkeypatch):
    """Every op on the rows of GPU_ROWS through the kernels of small batches (decode folding in place, verify in one
    kernel, commit in one launch) or of large ones (fold kernel with 3 lanes, each folding several rows;
    verify's two passes; append kernel)."""
    small = paths == "small-batch-kernels"
    monkeypatch.setattr(decode_module, "SMALL_BATCH", len(GPU_ROWS) if small else 0)
    monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", len(GPU_ROWS) if small else 0)
    monkeypatch.setattr(commit_module, "ONE_LAUNCH_MAX_BATCH", len(GPU_ROWS) if small else 0)
    monkeypatch.setattr(fold_module, "FOLD_LANES", 3)
    num_nodes = [64, 64, 1, 33, 0, 64, 17, 64]
    b = make_batch(d, GPU_ROWS, seed=10, T=64, num_nodes=num_nodes, shape=shape, capacity=64)
    check_verify(b, "cuda", GPU_TOL)
    # decode takes node 0 of every row as its token: no row may be empty (an empty row's inputs are NaN padding)
    tokens = make_batch(d, GPU_ROWS, seed=10, T=64, num_nodes=[max(1, n) for n in num_nodes], shape=shape,
                        capacity=64)
    check_decode(tokens, "cuda", GPU_TOL)
    for flush_length in (1, 48, 64):
        check_decode_commit(tokens, flush_length, "cuda", GPU_TOL)
    # a step in which every row folds, decoded in the fold kernel (its looped row: 64-entry buffers)
    check_decode_commit(tokens, 1, "cuda", GPU_TOL, every_row_folds=True)
    for flush_length in (1, 48, 64):
        check_commit(b, [3, 1, 1, 20, 0, 2, 17, 64], flush_length, "cuda", GPU_TOL)
    check_flush(b, "cuda", GPU_TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("T", [4, 5, 16], ids=["chain4", "chain5", "tree16"])
def test_gpu_engine_shapes(T, monkeypatch):
    """Qwen3.5-9B's heads at the engine's buffer (capacity = flush_length = 16) and a batch of 40 rows: verify of
    4- and 5-node chains (through both tree passes) / 16-node trees, decode + commit and commits that fold some rows
    (the looped row both ways: fold.LOOPED_LOADS_FIRST), with the default launch settings."""
    d = GPU_DIMS["k128"]
    rows = [(n % 16, n % 5 != 0) for n in range(40)]
    num_nodes = [T - (n % 3) for n in range(40)]
    b = make_batch(d, rows, seed=11, T=T, num_nodes=num_nodes, shape="chain" if T < 16 else "random", capacity=16)
    check_verify(b, "cuda", GPU_TOL)
    if T > verify_module.FMA_MAX_NODES:  # the trees' state dots and tree pass with their registers capped and not
        with monkeypatch.context() as patch:
            patch.setattr(verify_module, "STATE_DOT_MAX_REGISTERS",
                          swapped_caps(verify_module.STATE_DOT_MAX_REGISTERS))
            patch.setattr(verify_module, "TREE_DOT_MAX_REGISTERS",
                          {**verify_module.TREE_DOT_MAX_REGISTERS, 16: 88 if verify_module.TREE_DOT_MAX_REGISTERS[16]
                           is None else None})  # (88: the lowest sweep candidate, a build that spills)
            check_verify(b, "cuda", GPU_TOL)
            for stages in (2, 3, 4):  # the state dots' loop over K software-pipelined (STATE_DOT_STAGES)
                patch.setattr(verify_module, "STATE_DOT_STAGES", {**verify_module.STATE_DOT_STAGES, 16: stages})
                check_verify(b, "cuda", GPU_TOL)
    if T <= verify_module.SMALL_TREE_MAX_NODES:  # the chains' tree pass both ways (SMALL_TREE_PASS), at 40 rows too,
        # the small trees' pass with its registers capped and not (SMALL_TREE_MAX_REGISTERS: a build that may spill)
        for small_tree_pass, registers in ((False, None), (True, None), (True, 128)):
            with monkeypatch.context() as patch:
                patch.setattr(verify_module, "SMALL_TREE_PASS", small_tree_pass)
                patch.setattr(verify_module, "SMALL_TREE_FEW_ROWS", 0)
                patch.setattr(verify_module, "SMALL_TREE_MAX_REGISTERS", registers)
                check_verify(b, "cuda", GPU_TOL)
    for loads_first in (False, True):  # the one-launch kernel (batch 1's) on these rows, its loads first and not
        with monkeypatch.context() as patch:
            patch.setattr(verify_module, "FUSED_MAX_BATCH", len(rows))
            patch.setattr(verify_module, "FUSED_LOADS_FIRST", loads_first)
            check_verify(b, "cuda", GPU_TOL)
    assert check_decode_commit(b, 16, "cuda", GPU_TOL).any()
    with monkeypatch.context() as patch:  # the decode's state and buffer programs with their register cap swapped
        patch.setattr(decode_module, "SPLIT_ROLES_MAX_REGISTERS",
                      144 if decode_module.SPLIT_ROLES_MAX_REGISTERS is None else None)
        assert check_decode_commit(b, 16, "cuda", GPU_TOL).any()
    # plain decoding's step in which every row folds, each of its launches (the fold's pipelined row loop)
    for form in decode_module.FOLDING_DECODES:
        monkeypatch.setattr(decode_module, "FOLDING_DECODE", form)
        assert check_decode_commit(b, 1, "cuda", GPU_TOL, every_row_folds=True).all(), form
    for loads_first in (False, True):
        monkeypatch.setattr(fold_module, "LOOPED_LOADS_FIRST", loads_first)
        check_commit(b, [min(3, n) for n in num_nodes], 16, "cuda", GPU_TOL)
        assert check_decode_commit(b, 16, "cuda", GPU_TOL).any()
