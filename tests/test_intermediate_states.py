"""The intermediate-state baseline (verify_kernels/intermediate): every node's output and state equal the
plain recurrence along its root path, commit keeps the last accepted node's state, and the engine running the
target this way emits the KVBuffer engine's tokens."""

from __future__ import annotations

import math

import pytest
import torch

from specdec.api import LLM
from specdec.cache.linear_state import IntermediateStates
from specdec.cache.spec import CacheConfig
from specdec.engine.engine import EngineConfig
from tests.reference_checks import PADDING_PARENT, assert_close, root_path
from verify_kernels import intermediate
from verify_kernels.gdn import gdn_recurrent_ref
from verify_kernels.mamba2 import mamba2_recurrent_ref

# the torch references, and the Triton kernels (on a CPU in Triton's interpreter, tests/conftest.py)
IMPLEMENTATIONS = {
    "reference": (intermediate.gdn_intermediate_ref, intermediate.mamba2_intermediate_ref,
                  intermediate.commit_node_states_ref),
    "triton": (intermediate.gdn_intermediate, intermediate.mamba2_intermediate, intermediate.commit_node_states),
}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# rows of one batch: a chain, a branching tree, a tree with padding, a single node (decode) and an empty row
TREES = [[-1, 0, 1, 2, 3], [-1, 0, 0, 1, 2], [-1, 0, 1, PADDING_PARENT, PADDING_PARENT],
         [-1, PADDING_PARENT, PADDING_PARENT, PADDING_PARENT, PADDING_PARENT], [PADDING_PARENT] * 5]
NUM_NODES = [5, 5, 3, 1, 0]
STATE_SLOTS = [2, -1, 0, 3, 1]  # -1: no committed state yet (zeros)


def gdn_inputs(gen, B, T, H=2, HV=4, K=8, V=8):
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1) * K**-0.5
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -2 * torch.rand(B, T, HV, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    return [q, k, v, g, beta], torch.randn(4, HV, K, V, generator=gen)


def mamba2_inputs(gen, B, T, NH=4, P=8, NG=2, N=8):
    x = torch.randn(B, T, NH, P, generator=gen)
    dt = torch.rand(B, T, NH, generator=gen) + 0.05
    bm, c = torch.randn(B, T, NG, N, generator=gen), torch.randn(B, T, NG, N, generator=gen)
    return [x, dt, bm, c], torch.randn(4, NH, P, N, generator=gen)


def along(x: torch.Tensor, row: int, path: list[int]) -> torch.Tensor:
    return x[row:row + 1, path]


def on_device(*xs):
    return [x.to(DEVICE) for x in xs]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("mixer", ["gdn", "mamba2"])
def test_each_node_equals_the_recurrence_along_its_root_path(mixer, implementation):
    gdn_tree, mamba2_tree, _ = IMPLEMENTATIONS[implementation]
    gen = torch.Generator().manual_seed(0)
    B, T = len(TREES), len(TREES[0])
    parents, num_nodes, slots = torch.tensor(TREES), torch.tensor(NUM_NODES), torch.tensor(STATE_SLOTS)
    if mixer == "gdn":
        tokens, pool = gdn_inputs(gen, B, T)
        out, states = gdn_tree(*on_device(*tokens, parents, num_nodes, pool, slots))
    else:
        (x, dt, bm, c), pool = mamba2_inputs(gen, B, T)
        A, D = -torch.rand(4, generator=gen) - 0.5, torch.randn(4, generator=gen)
        out, states = mamba2_tree(*on_device(x, dt, A, bm, c, D, parents, num_nodes, pool, slots))
    out, states = out.cpu(), states.cpu()
    for row in range(B):
        start = pool[slots[row]][None] if slots[row] >= 0 else torch.zeros_like(pool[:1])
        for node in range(NUM_NODES[row]):
            path = root_path(TREES[row], node)
            if mixer == "gdn":
                o, final = gdn_recurrent_ref(*(along(t, row, path) for t in tokens), initial_state=start)
            else:
                o, final = mamba2_recurrent_ref(along(x, row, path), along(dt, row, path), A, along(bm, row, path),
                                                along(c, row, path), D, initial_state=start)
            assert_close(out[row, node], o[0, -1])
            assert_close(states[row, node], final[0])
        assert (out[row, NUM_NODES[row]:] == 0).all()  # padding nodes output zeros


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_commit_keeps_the_last_accepted_state(implementation):
    commit = IMPLEMENTATIONS[implementation][2]
    gen = torch.Generator().manual_seed(1)
    states, pool = on_device(torch.randn(3, 5, 2, 4, 4, generator=gen), torch.randn(4, 2, 4, 4, generator=gen))
    before = pool.clone()
    accepted = torch.tensor([[0, 2, 4], [0, -1, -1], [-1, -1, -1]], device=DEVICE)
    commit(states, accepted, torch.tensor([3, 1, 0], device=DEVICE), pool, torch.tensor([1, 3, -1], device=DEVICE))
    torch.testing.assert_close(pool[1], states[0, 4])
    torch.testing.assert_close(pool[3], states[1, 0])
    torch.testing.assert_close(pool[[0, 2]], before[[0, 2]])  # other slots, and the row that accepted nothing


def test_the_reference_commit_refuses_rows_without_a_slot():
    states, pool = torch.zeros(2, 3, 4), torch.zeros(2, 4)
    with pytest.raises(ValueError, match="need a state slot"):
        intermediate.commit_node_states_ref(states, torch.tensor([[0], [0]]), torch.tensor([1, 1]), pool,
                                            torch.tensor([-1, 1]))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("mixer", ["gdn", "mamba2"])
def test_decode_in_place_writes_the_slots(mixer, implementation):
    gdn_tree, mamba2_tree, _ = IMPLEMENTATIONS[implementation]
    gen = torch.Generator().manual_seed(2)
    parents, num_nodes, slots = on_device(torch.full((3, 1), -1), torch.tensor([1, 1, 0]), torch.tensor([2, 0, 1]))
    if mixer == "gdn":
        tokens, pool = gdn_inputs(gen, 3, 1)
        tokens, pool = on_device(*tokens), pool.to(DEVICE)
        run = lambda p, in_place: gdn_tree(*tokens, parents, num_nodes, p, slots, in_place=in_place)  # noqa: E731
    else:
        (x, dt, bm, c), pool = mamba2_inputs(gen, 3, 1)
        args = on_device(x, dt, -torch.rand(4, generator=gen), bm, c, torch.randn(4, generator=gen))
        pool = pool.to(DEVICE)
        run = lambda p, in_place: mamba2_tree(*args, parents, num_nodes, p, slots, in_place=in_place)  # noqa: E731
    out, states = run(pool.clone(), False)
    in_place_pool = pool.clone()
    out_in_place, none = run(in_place_pool, True)
    assert none is None
    torch.testing.assert_close(out_in_place, out)
    torch.testing.assert_close(in_place_pool[2], states[0, 0])
    torch.testing.assert_close(in_place_pool[0], states[1, 0])
    torch.testing.assert_close(in_place_pool[[1, 3]], pool[[1, 3]])  # the row without nodes keeps its state


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_node_states_land_in_the_buffer_given(implementation):
    """The engine reserves the node states once (KVBufferCache.reserve) and hands each step a view."""
    gdn = IMPLEMENTATIONS[implementation][0]
    inputs, pool = gdn_inputs(torch.Generator().manual_seed(3), len(TREES), 5)
    args = on_device(*inputs, torch.tensor(TREES), torch.tensor(NUM_NODES), pool, torch.tensor(STATE_SLOTS))
    o, states = gdn(*args)
    buffer = torch.full_like(states, float("nan"))
    o_given, states_given = gdn(*args, states_out=buffer)
    assert states_given.data_ptr() == buffer.data_ptr()
    torch.testing.assert_close(o_given, o)
    torch.testing.assert_close(buffer, states)
    with pytest.raises((ValueError, RuntimeError)):
        gdn(*args, states_out=buffer[:, :4])


def test_the_baseline_keeps_no_buffer():
    with pytest.raises(ValueError, match="flush_length must be 1"):
        CacheConfig(flush_length=16, linear_state="intermediate")
    with pytest.raises(ValueError, match="linear_state must be one of"):
        CacheConfig(linear_state="sglang")
    assert EngineConfig.from_flags(flush_length=16, linear_state="intermediate").cache.flush_length == 1


@pytest.mark.parametrize("target", ["qwen3.5", "nemotron-3"])
@pytest.mark.parametrize("draft, shape", [(None, {}), ("small", {}),
                                          ("mtp", dict(topk=4, num_draft_tokens=16, dynamic_tree=True))],
                         ids=["plain", "draft-model-chain", "mtp-dynamic-tree"])
def test_the_engine_emits_the_same_tokens_either_way(target, draft, shape):
    prompts = ["The history of the city", "def parse(text):\n    "]
    outputs = {}
    for linear_state in ("kvbuffer", "intermediate"):
        config = EngineConfig.from_flags(max_batch=2, max_seq_len=128, linear_state=linear_state, speculation="fixed",
                                         **shape)
        llm = LLM(target, draft, device="cpu", config=config)
        outputs[linear_state] = [out.token_ids for out in llm.generate(prompts, max_new_tokens=20)]
        if linear_state == "intermediate":
            assert all(isinstance(pool.linear_state, IntermediateStates) for pool in llm.engine.runner.cache.linear)
            assert llm.engine.runner.cache.config.flush_length == 1
            cache, width = llm.engine.runner.cache, llm.engine.config.shape.budget + 1
            for pool in cache.linear:  # one state per node of the widest step, per request slot, reserved once
                states = cache.config.max_requests * width * math.prod(pool.spec.state_shape) if draft else 0
                assert pool.linear_state.node_states.numel() == states
    assert outputs["intermediate"] == outputs["kvbuffer"]
