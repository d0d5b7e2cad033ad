"""The Gated DeltaNet fold of the buffer into the state (verify_kernels/gdn/fold.py): the flush, and the fold lanes of
the commit and the decode + commit, against the torch references (verify_kernels/gdn/naive.py) through
tests/gdn_checks.py. Without a GPU the kernels run in Triton's interpreter (tests/conftest.py) on small heads."""

import pytest

from tests.gdn_checks import COMMITS, DIMS, ROWS, check_commit, check_decode_commit, check_flush, make_batch
from tests.reference_checks import TREE
from verify_kernels.gdn import commit as commit_module
from verify_kernels.gdn import decode as decode_module
from verify_kernels.gdn import fold as fold_module

# every output a kernel allocates starts as NaN: an element it forgets to write fails (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nan_empty")


def check_fold_paths(d, rows, seed: int) -> None:
    """The commit (every row folding; some folding, the others appending), the flush and the decode + commit of
    these rows against their references: every path of the fold kernel at the settings in force."""
    for flush_length, lengths in (COMMITS["fold-all"], COMMITS["fold-and-append"]):
        check_commit(make_batch(d, rows, seed=seed, T=len(TREE), shape="tree"), lengths[:len(rows)], flush_length)
    check_flush(make_batch(d, rows, seed=seed))
    assert check_decode_commit(make_batch(d, rows, seed=seed), 1).all()


def large_batch_kernels(monkeypatch) -> None:
    """Every batch through the large-batch launches (the fold kernel), not the small batches' one-launch commit or
    decode that fold in their own programs."""
    monkeypatch.setattr(commit_module, "ONE_LAUNCH_MAX_BATCH", 0)
    monkeypatch.setattr(decode_module, "SMALL_BATCH", 0)


@pytest.mark.parametrize("d", DIMS.values(), ids=DIMS.keys())
def test_flush(d):
    check_flush(make_batch(d, ROWS, seed=5))


@pytest.mark.parametrize(("lanes", "scan_block", "stages"), [(2, 2, 1), (1, 4, 1), (2, 2, 2), (1, 4, 3)],
                         ids=["2-lanes", "1-lane", "2-lanes-pipelined", "1-lane-pipelined"])
def test_fold_lanes_and_scan_blocks(monkeypatch, lanes, scan_block, stages):
    """Fewer fold lanes than folding rows (each lane folds several, in rank order) and the rows' flags scanned a few
    at a time: the fold of the commit, the flush and the decode + commit; with the row loop software-pipelined
    (FOLD_STAGES > 1: each row's entries in one block) too."""
    monkeypatch.setattr(fold_module, "FOLD_STAGES", stages)
    monkeypatch.setattr(fold_module, "FOLD_LANES", lanes)
    monkeypatch.setattr(fold_module, "SCAN_BLOCK", scan_block)
    large_batch_kernels(monkeypatch)
    check_fold_paths(DIMS["k16-hv2-bf16"], ROWS, seed=11)


@pytest.mark.parametrize(("stages", "one_launch", "tma"),
                         [(1, False, True), (3, False, True), (1, True, True), (1, False, False), (3, False, False)],
                         ids=["looped-tma", "pipelined-tma", "one-launch-commit-tma", "looped-pointers",
                              "pipelined-pointers"])
def test_fold_tile_loads(monkeypatch, stages, one_launch, tma):
    """S0's tiles read and written through a tensor descriptor of the pool (FOLD_TMA, the default where the device
    has TMA) or through pointers (the fallback elsewhere), in the looped and the pipelined row loop and in the small
    batches' one-launch commit (which appends too): the commit, the flush and the decode + commit against their
    references."""
    monkeypatch.setattr(fold_module, "FOLD_TMA", tma)
    monkeypatch.setattr(fold_module, "FOLD_STAGES", stages)
    for setting in ("FOLD_BLOCK_V", "TMA_FOLD_BLOCK_V", "LOOPED_FOLD_BLOCK_V"):  # two V blocks of 32 columns: boxes
        monkeypatch.setattr(fold_module, setting, 16)                            # at column 0 and 16
    if not one_launch:
        large_batch_kernels(monkeypatch)
    check_fold_paths(DIMS["k32-hv2"], ROWS[:commit_module.ONE_LAUNCH_MAX_BATCH] if one_launch else ROWS, seed=13)


@pytest.mark.parametrize(("stages", "tma"), [(1, False), (3, False), (1, True)],
                         ids=["looped", "pipelined", "looped-tma"])
def test_fold_with_operands_split_by_mask(monkeypatch, stages, tma):
    """FOLD_SPLIT_TF32 (a sweep candidate): the fold's tf32x3 products from operands split by a mask, accumulated
    into the tile (in the interpreter the TF32 products are exact, so this checks the algebra; the GPU sweep checks
    the error), alone and with FOLD_TMA: the commit, the flush and the decode + commit against their references."""
    monkeypatch.setattr(fold_module, "FOLD_SPLIT_TF32", True)
    monkeypatch.setattr(fold_module, "FOLD_TMA", tma)
    monkeypatch.setattr(fold_module, "FOLD_STAGES", stages)
    large_batch_kernels(monkeypatch)
    check_fold_paths(DIMS["k32-hv2"], ROWS, seed=17)


def test_fold_launch_pipelines_flushes_of_short_buffers_only():
    """The pipelined row loop for a flush whose buffer fits its one block (the engine's 16 entries); commits and the
    decode's fold (few rows fold), 32-entry buffers and the small batches' one-launch commit fold in the looped row
    (the H200: a commit folding one row in 8 at 128 against 101 us; a 32-entry flush 666 against 449)."""
    f = fold_module
    pipelined, looped = (f.FOLD_STAGES, f.FOLD_WARPS, f.FOLD_BLOCK_V), (1, f.LOOPED_FOLD_WARPS, f.LOOPED_FOLD_BLOCK_V)
    assert f.fold_launch(16, False, f.ENTRIES_NONE) == pipelined
    assert f.fold_launch(8, False, f.ENTRIES_NONE) == pipelined
    assert f.fold_launch(32, False, f.ENTRIES_NONE) == looped
    assert f.fold_launch(16, False, f.ENTRIES_ACCEPTED) == looped
    assert f.fold_launch(16, False, f.ENTRIES_TOKEN) == looped
    assert f.fold_launch(16, True, f.ENTRIES_ACCEPTED) == looped
    # with S0 through TMA the flush's own tile; the looped row keeps its own
    tma_pipelined = (f.FOLD_STAGES, f.TMA_FOLD_WARPS, f.TMA_FOLD_BLOCK_V)
    assert f.fold_launch(16, False, f.ENTRIES_NONE, tma=True) == tma_pipelined
    assert f.fold_launch(16, False, f.ENTRIES_ACCEPTED, tma=True) == looped


@pytest.mark.parametrize(("form", "stages", "tma"),
                         [("in-fold", 3, False), ("in-fold", 3, True), ("in-fold", 1, False),
                          ("decode-then-fold", 3, False), ("decode-then-fold", 3, True)],
                         ids=["in-fold-pipelined-pointers", "in-fold-pipelined-tma", "in-fold-looped",
                              "decode-then-fold-pipelined-pointers", "decode-then-fold-pipelined-tma"])
def test_a_decode_step_in_which_every_row_folds_folds_in_the_pipelined_loop(monkeypatch, form, stages, tma):
    """gdn_decode_commit(every_row_folds=True), plain decoding's step in which every row's buffer fills (the engine
    knows it on the host), in each of its launches (decode.FOLDING_DECODE): the fold kernel decodes the token from
    each tile it folds (fold.ENTRIES_DECODE: the token's reads from the folded tile, u and o, then u folded as a
    rank-one update), or the decode's launches then the token folded
    (fold.ENTRIES_TOKEN) in the flush's pipelined row loop; in that loop or the looped row, against the reference;
    rows with 0 to 7 buffered entries."""
    f = fold_module
    assert f.fold_launch(16, False, f.ENTRIES_DECODE)[0] == f.FOLD_STAGES > 1
    assert f.fold_launch(16, False, f.ENTRIES_TOKEN, every_row_folds=True)[0] == f.FOLD_STAGES
    assert f.fold_launch(16, False, f.ENTRIES_TOKEN)[0] == 1  # (a decode step in which few rows fold: looped)
    monkeypatch.setattr(decode_module, "FOLDING_DECODE", form)
    monkeypatch.setattr(fold_module, "FOLD_STAGES", stages)
    monkeypatch.setattr(fold_module, "FOLD_TMA", tma)
    for setting in ("FOLD_BLOCK_V", "TMA_FOLD_BLOCK_V", "LOOPED_FOLD_BLOCK_V"):  # two V blocks of 16 columns
        monkeypatch.setattr(fold_module, setting, 16)
    large_batch_kernels(monkeypatch)
    for d, seed in ((DIMS["k32-hv2"], 19), (DIMS["k16-hv2-bf16"], 23)):
        assert check_decode_commit(make_batch(d, ROWS, seed=seed), 1, every_row_folds=True).all()


def test_an_unknown_folding_decode_launch_is_named(monkeypatch):
    monkeypatch.setattr(decode_module, "FOLDING_DECODE", "fused")
    large_batch_kernels(monkeypatch)
    with pytest.raises(ValueError, match="FOLDING_DECODE must be one of"):
        check_decode_commit(make_batch(DIMS["k32-hv2"], ROWS, seed=19), 1, every_row_folds=True)


@pytest.mark.parametrize(("tma", "stages"), [(True, 3), (False, 1)], ids=["tma", "pointers-looped-flush"])
def test_fold_with_the_other_looped_row(monkeypatch, tma, stages):
    """The looped row in the form the default does not run (LOOPED_LOADS_FIRST: on, every load of a row issued
    first, the buffer as one block and every node's entry with the accepted ones picked on chip; off, the loads
    through the accepted indices): the commit, the decode's fold where few rows fold, and with the flush in the
    looped row (FOLD_STAGES 1) its fold of the buffer alone, against their references."""
    monkeypatch.setattr(fold_module, "LOOPED_LOADS_FIRST", not fold_module.LOOPED_LOADS_FIRST)
    monkeypatch.setattr(fold_module, "FOLD_TMA", tma)
    monkeypatch.setattr(fold_module, "FOLD_STAGES", stages)
    for setting in ("FOLD_BLOCK_V", "TMA_FOLD_BLOCK_V", "LOOPED_FOLD_BLOCK_V"):  # two V blocks of 32 columns
        monkeypatch.setattr(fold_module, setting, 16)
    large_batch_kernels(monkeypatch)
    check_fold_paths(DIMS["k32-hv2"], ROWS, seed=19)


def test_loads_first_reads_nothing_of_the_nodes_not_accepted(monkeypatch):
    """With LOOPED_LOADS_FIRST every node's entry is loaded and the accepted ones picked: the others' k, u and G
    (NaN in the kernel's inputs) must be selected away, not multiplied by a zero weight. Against the commit's
    reference on the clean inputs."""
    import torch

    from tests.gdn_checks import accept, assert_pools_close, clone, for_kernel, to
    from verify_kernels.gdn import gdn_commit, gdn_commit_ref, gdn_verify_ref

    monkeypatch.setattr(fold_module, "LOOPED_LOADS_FIRST", True)
    large_batch_kernels(monkeypatch)
    b = make_batch(DIMS["k16-hv2-bf16"], ROWS, seed=23, T=len(TREE), shape="tree")
    flush_length, lengths = COMMITS["fold-and-append"]
    _, u, gcum = gdn_verify_ref(*b.x, b.parents, b.num_nodes, *b.pools.args())
    accepted, num_accepted = accept(b, lengths)
    k = b.x[1]
    taken = torch.zeros(k.shape[:2], dtype=torch.bool)
    for row, path in enumerate(accepted.tolist()):
        taken[row, [node for node in path if node >= 0]] = True
    poisoned = [t.clone() for t in (k, u, gcum)]
    for t in poisoned:
        t[~taken] = float("nan")
    ref_pools = clone(b.pools)
    ref_pools.before_commit(num_accepted, flush_length)
    pools = for_kernel(ref_pools, "cpu")
    gdn_commit(*to([*poisoned, accepted, num_accepted], "cpu"), *pools.args(), flush_length)
    flushed = gdn_commit_ref(k, u, gcum, accepted, num_accepted, *ref_pools.args(), flush_length)
    folded = ref_pools.state_slots[flushed]
    assert flushed.any() and not ref_pools.state_pool[folded].isnan().any()  # (a NaN would match a NaN)
    assert_pools_close(pools, ref_pools)
