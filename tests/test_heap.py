"""The heap frozen after warm-up and the collector's pauses measured (specdec/engine/heap.py)."""

import gc
import weakref

import pytest

from specdec.api import LLM
from specdec.engine.heap import GcPauses, freeze_heap


@pytest.fixture
def unfrozen():
    """Each test starts and leaves the heap unfrozen (the test process's objects collectable as usual)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class Node:
    def __init__(self):
        self.other = self


def test_freezing_collects_the_garbage_first_then_moves_the_rest_out_of_reach(unfrozen):
    cycle, kept = Node(), Node()
    dead = weakref.ref(cycle)
    del cycle  # unreachable, held by its own reference: only a collection frees it
    freeze_heap()
    assert dead() is None
    assert gc.get_freeze_count() > 0
    with GcPauses() as pauses:  # a full collection no longer walks what was frozen
        gc.collect()
    assert pauses.full == 1 and kept.other is kept


def test_pauses_count_the_full_collections_and_their_time():
    callbacks = len(gc.callbacks)
    with GcPauses() as pauses:
        gc.collect(0)
        gc.collect()
        gc.collect()
    assert pauses.full == 2
    assert 0.0 < pauses.full_seconds <= pauses.seconds
    assert len(gc.callbacks) == callbacks  # (removed on exit)
    gc.collect()
    assert pauses.full == 2


def test_the_engine_freezes_the_heap_once_its_steps_are_prepared(unfrozen):
    llm = LLM("specdec/checkpoints/qwen3.5-tiny")
    assert gc.get_freeze_count() == 0
    llm.engine.prepare_steps(2, 8, 4)
    assert gc.get_freeze_count() > 0
