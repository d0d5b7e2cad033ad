"""The Gated DeltaNet verify (verify_kernels/gdn/verify.py) on chains and trees, in two passes or fused, against the
torch references (verify_kernels/gdn/naive.py) through tests/gdn_checks.py. Without a GPU the kernels run in Triton's
interpreter (tests/conftest.py) on small heads."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.gdn_checks import DIMS, ROWS, TOL, Dims, check_verify, make_batch, swapped_caps
from tests.reference_checks import TreeBatch, tree_batches
from verify_kernels.gdn import verify as verify_module

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")


@pytest.fixture(params=["two-passes", "fused", "fused-loads-first-swapped", "tree-pass-heads-swapped",
                        "stacked-products-swapped", "stacked-reads-swapped", "small-tree-pass"])
def verify_path(request, monkeypatch):
    """Verify runs as the state pass then the tree pass, or for batches up to FUSED_MAX_BATCH as one kernel (with its
    loads first where FUSED_LOADS_FIRST is off and the other way round: verify_fused.py); or with
    the tree pass's programs swapped: per value head up to FMA_MAX_NODES nodes (each recomputing its key head's
    products), per key head past them (the defaults are the other way round); or with the tree pass's products over
    K stacked or not, whichever the default is not (STACKED_PRODUCTS), and its buffer reads with them
    (STACKED_READS); or with trees up to SMALL_TREE_MAX_NODES nodes through the node-by-node tree pass
    (SMALL_TREE_PASS) at these few rows too (which by default take the tensor-core pass: SMALL_TREE_FEW_ROWS), its
    programs per value head where the default is a key head's and the other way round, and its register cap, the
    state dots' and the trees' tree pass's (SMALL_TREE_MAX_REGISTERS, STATE_DOT_MAX_REGISTERS, TREE_DOT_MAX_REGISTERS:
    the launch option Triton's interpreter takes too) on where they are off and off where on."""
    if request.param == "small-tree-pass":
        monkeypatch.setattr(verify_module, "SMALL_TREE_PASS", True)
        monkeypatch.setattr(verify_module, "SMALL_TREE_FEW_ROWS", 0)
        monkeypatch.setattr(verify_module, "SMALL_TREE_HEADS_PER_PROGRAM",
                            1 if verify_module.SMALL_TREE_HEADS_PER_PROGRAM is None else None)
        monkeypatch.setattr(verify_module, "SMALL_TREE_MAX_REGISTERS",
                            128 if verify_module.SMALL_TREE_MAX_REGISTERS is None else None)
        monkeypatch.setattr(verify_module, "STATE_DOT_MAX_REGISTERS",
                            swapped_caps(verify_module.STATE_DOT_MAX_REGISTERS))
        monkeypatch.setattr(verify_module, "TREE_DOT_MAX_REGISTERS",
                            swapped_caps(verify_module.TREE_DOT_MAX_REGISTERS))
    if request.param == "stacked-products-swapped":
        monkeypatch.setattr(verify_module, "STACKED_PRODUCTS", not verify_module.STACKED_PRODUCTS)
    if request.param == "stacked-reads-swapped":
        monkeypatch.setattr(verify_module, "STACKED_READS", not verify_module.STACKED_READS)
    monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", len(ROWS) if request.param.startswith("fused") else 0)
    if request.param == "fused-loads-first-swapped":
        monkeypatch.setattr(verify_module, "FUSED_LOADS_FIRST", not verify_module.FUSED_LOADS_FIRST)
    if request.param == "tree-pass-heads-swapped":
        monkeypatch.setattr(verify_module, "TREE_HEADS_PER_PROGRAM", 1)
        monkeypatch.setattr(verify_module, "TREE_DOT_HEADS_PER_PROGRAM", None)
    return request.param


VERIFIES = {
    # dims, T, tree shape, nodes per row of ROWS (ragged, 0 included)
    "T1-chain": ("k16-hv1", 1, "chain", [1, 1, 0, 1, 1]),
    "T3-flat": ("k16-hv1", 3, "flat", [3, 2, 3, 0, 1]),
    "T17-random": ("k16-hv1", 17, "random", [17, 9, 16, 1, 0]),
    "T4-chain-k32-hv2": ("k32-hv2", 4, "chain", [4, 3, 0, 4, 2]),
    "T5-chain-k32-hv2": ("k32-hv2", 5, "chain", [5, 4, 0, 5, 2]),
    "T33-chain": ("k16-hv1", 33, "chain", [33, 32, 5, 0, 17]),
    "T64-random": ("k16-hv1", 64, "random", [64, 63, 0, 40, 1]),
    "T64-chain-k32-hv2": ("k32-hv2", 64, "chain", [64, 64, 64, 64, 64]),
}


@pytest.mark.parametrize("case", VERIFIES.values(), ids=VERIFIES.keys())
def test_verify_trees(case, verify_path):
    dims, T, shape, num_nodes = case
    check_verify(make_batch(DIMS[dims], ROWS, seed=T, T=T, num_nodes=num_nodes, shape=shape))


@pytest.mark.parametrize(("T", "pass_ancestors"), [(12, True), (6, False)],
                         ids=["T12-S0-dots-ancestors-given", "T6-S0-node-at-a-time-ancestors-computed"])
@pytest.mark.parametrize("d", DIMS.values(), ids=DIMS.keys())
def test_verify_dims(d, T, pass_ancestors):
    """Both ways of the state pass (a key head's value heads in one program when one node at a time) on every
    head layout."""
    b = make_batch(d, ROWS, seed=3, T=T, num_nodes=[T, 5, T - 3, 0, T], shape="random")
    check_verify(b, pass_ancestors=pass_ancestors)


@settings(max_examples=12, deadline=None)
@given(batch=tree_batches(max_rows=3, max_nodes=24, max_capacity=8), ratio=st.sampled_from([1, 2]))
def test_verify_random_trees(batch: TreeBatch, ratio: int):
    rows = [(r.buffered, r.has_state) for r in batch.rows]
    b = make_batch(Dims(1, ratio, 16, 16), rows, batch.seed, T=batch.num_tokens,
                   num_nodes=[r.num_nodes for r in batch.rows], shape=[r.parents for r in batch.rows],
                   capacity=batch.capacity)
    check_verify(b)


@pytest.mark.parametrize(("dims", "T", "shape", "num_nodes"),
                         [("k32-hv2", 5, "chain", [5, 4, 0, 1, 5]), ("k16-hv1", 17, "random", [17, 9, 16, 1, 0])],
                         ids=["k32-hv2-T5-chain", "k16-hv1-T17-random"])
@pytest.mark.parametrize("split", [True, False], ids=["split-by-mask", "triton-tf32x3"])
def test_tree_pass_products_precision(tf32_products, monkeypatch, dims, T, shape, num_nodes, split):
    """TREE_SPLIT_TF32 (the default): the tree pass's tf32x3 products from operands split by a mask, three TF32
    products each (TF32 products truncating as on the GPU, tests/conftest.py's tf32_products: a missing or doubled
    term fails); and with Triton's tf32x3."""
    monkeypatch.setattr(verify_module, "TREE_SPLIT_TF32", split)
    monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", 0)
    check_verify(make_batch(DIMS[dims], ROWS, seed=T, T=T, num_nodes=num_nodes, shape=shape))


@pytest.mark.parametrize("split", [True, False], ids=["split-by-mask", "triton-tf32x3"])
@pytest.mark.parametrize("stages", [0, 3], ids=["unrolled", "pipelined"])
def test_state_pass_dots_products_precision(tf32_products, monkeypatch, split, stages):
    """STATE_SPLIT_TF32 (the default): the state pass's dots (trees past FMA_MAX_NODES) in tf32x3 from operands split
    by a mask, and with Triton's tf32x3, 16 columns a program (two V blocks at V = 32); their loop over K unrolled and
    software-pipelined (STATE_DOT_STAGES, two steps of 16 rows); TF32 products truncating, as the tree pass's test."""
    monkeypatch.setattr(verify_module, "STATE_DOT_STAGES", {16: stages, 32: stages, 64: stages})
    monkeypatch.setattr(verify_module, "STATE_BLOCK_K", 16)
    monkeypatch.setattr(verify_module, "STATE_SPLIT_TF32", split)
    monkeypatch.setattr(verify_module, "STATE_DOT_CONFIGS", {16: (16, 4), 32: (16, 4), 64: (16, 4)})
    monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", 0)
    check_verify(make_batch(DIMS["k32-hv2"], ROWS, seed=19, T=17, num_nodes=[17, 9, 16, 0, 12], shape="random"))


@pytest.mark.parametrize(("T", "shape", "num_nodes"),
                         [(5, "chain", [5, 4, 0, 1, 5]), (17, "random", [17, 9, 16, 1, 0])],
                         ids=["T5-chain", "T17-random"])
@pytest.mark.parametrize("split", [True, False], ids=["split-by-mask", "triton-tf32x3"])
@pytest.mark.parametrize("loads_first", [False, True], ids=["fused", "loads-first"])
def test_fused_kernel_products_precision(tf32_products, monkeypatch, T, shape, num_nodes, split, loads_first):
    """FUSED_SPLIT_TF32 (the default): the one-launch kernel (every row here) with its products from operands split by
    a mask, and with Triton's tf32x3, the state's reads by node and as dots; each with every load first and not
    (FUSED_LOADS_FIRST); TF32 products truncating, as the tree pass's test."""
    monkeypatch.setattr(verify_module, "FUSED_LOADS_FIRST", loads_first)
    monkeypatch.setattr(verify_module, "FUSED_SPLIT_TF32", split)
    monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", len(ROWS))
    check_verify(make_batch(DIMS["k32-hv2"], ROWS, seed=T, T=T, num_nodes=num_nodes, shape=shape))


@pytest.mark.parametrize(("T", "shape", "num_nodes"),
                         [(5, "chain", [5, 4, 0, 1, 5]), (17, "random", [17, 9, 16, 1, 0])],
                         ids=["T5-chain", "T17-random"])
@pytest.mark.parametrize("fused", [False, True, "loads-first"], ids=["two-passes", "fused", "fused-loads-first"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_products_with_exact_q_and_k(tf32_products, monkeypatch, T, shape, num_nodes, fused, dtype):
    """q and k in a bf16 / fp16 model's dtype (the glue leaves them so for the KVBuffer), the rest fp32: the tree
    pass's products among the nodes' q and k and against the buffer's keys, the state pass's dots (T17) and the
    one-launch kernel skip the q / k remainders' products (verify_kernels/precision.py add_product_exact). TF32
    products truncate as on the GPU (tf32_products): an fp32 operand taken for exact would lose its remainder and
    fail."""
    monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", len(ROWS) if fused else 0)
    monkeypatch.setattr(verify_module, "FUSED_LOADS_FIRST", fused == "loads-first")
    b = make_batch(DIMS["k32-hv2"], ROWS, seed=41 + T, T=T, num_nodes=num_nodes, shape=shape)
    b.x[0], b.x[1] = b.x[0].to(dtype), b.x[1].to(dtype)
    check_verify(b)


@settings(max_examples=12, deadline=None)
@given(batch=tree_batches(max_rows=3, max_nodes=verify_module.SMALL_TREE_MAX_NODES, max_capacity=16),
       ratio=st.sampled_from([1, 2]), heads_per_program=st.sampled_from([None, 1]),
       config=st.sampled_from([(16, 1, 1), (8, 1, 1), (4, 1, 4), (8, 2, 2)]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_small_tree_pass_random_trees(batch: TreeBatch, ratio: int, heads_per_program, config, dtype):
    """The small trees' node-by-node tree pass (SMALL_TREE_PASS) on random trees of up to SMALL_TREE_MAX_NODES
    nodes, ragged rows with and without a state, buffers of up to 16 entries, a key head's value heads a program or
    one, V (16) in one program or split over programs along V (SMALL_TREE_CONFIG: columns a block, warps, programs
    along V), q and k in fp32 or bf16."""
    rows = [(r.buffered, r.has_state) for r in batch.rows]
    b = make_batch(Dims(1, ratio, 16, 16), rows, batch.seed, T=batch.num_tokens,
                   num_nodes=[r.num_nodes for r in batch.rows], shape=[r.parents for r in batch.rows],
                   capacity=batch.capacity)
    b.x[0], b.x[1] = b.x[0].to(dtype), b.x[1].to(dtype)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(verify_module, "SMALL_TREE_PASS", True)
        patch.setattr(verify_module, "SMALL_TREE_HEADS_PER_PROGRAM", heads_per_program)
        patch.setattr(verify_module, "SMALL_TREE_CONFIG", config)
        patch.setattr(verify_module, "SMALL_TREE_FEW_ROWS", 0)
        patch.setattr(verify_module, "FUSED_MAX_BATCH", 0)
        check_verify(b)


@pytest.mark.parametrize("heads_per_program", [None, 1], ids=["key-head", "value-head"])
@pytest.mark.parametrize("few_rows", [0, 64], ids=["one-program-along-V", "programs-along-V"])
def test_small_tree_pass_buffers_more_than_half_full(monkeypatch, heads_per_program, few_rows):
    """The small trees' tree pass sums over half a 16-entry buffer's entries when it is at most half full: rows more
    than half full (9-15 entries) beside rows at most half full, 5-node chains; a batch below SMALL_TREE_FEW_ROWS
    (programs along V) or not."""
    monkeypatch.setattr(verify_module, "SMALL_TREE_PASS", True)
    monkeypatch.setattr(verify_module, "SMALL_TREE_FEW_ROWS", few_rows)
    monkeypatch.setattr(verify_module, "SMALL_TREE_FEW_ROWS_CONFIG", (32, 1, 4))
    monkeypatch.setattr(verify_module, "SMALL_TREE_HEADS_PER_PROGRAM", heads_per_program)
    monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", 0)
    rows = [(15, True), (9, True), (12, False), (8, True), (0, True)]
    check_verify(make_batch(DIMS["k32-hv2"], rows, seed=23, T=5, num_nodes=[5, 4, 5, 2, 5], shape="chain",
                            capacity=16))


def test_small_tree_pass_strong_decay(monkeypatch):
    """Log decays of -50 per token on full 16-entry buffers under 5-node chains through the small trees' tree pass:
    finite, and the reference's results to the fp32 resolution of G (tests/test_gdn_every_op.py's strong-decay
    tolerance)."""
    monkeypatch.setattr(verify_module, "SMALL_TREE_PASS", True)
    monkeypatch.setattr(verify_module, "SMALL_TREE_FEW_ROWS", 0)  # (three rows: else the tensor-core pass)
    monkeypatch.setattr(verify_module, "FUSED_MAX_BATCH", 0)
    rows = [(15, True), (15, False), (0, True)]
    b = make_batch(Dims(1, 2, 16, 16), rows, seed=8, T=5, capacity=16, max_decay=50.0)
    check_verify(b, tol=max(TOL, 4 * 50 * (15 + 5) * 2**-24))
