"""benchmarks/graph_steps.py's variants run on the CPU (device "cpu": the same engines and steps, eager, no graphs):
those that hold the adaptive policy to one shape must still fit the policy's interface (a stub of theirs that fell
behind its signature failed two variants of a device call on 2026-12-05) and run the shape they promise."""

from __future__ import annotations

import tempfile

import pytest

from benchmarks.graph_steps import time_variant, variants
from benchmarks.host_step import tiny_checkpoint

CHAINS = "adaptive (chains 1, 2, 4), a policy that plans 4-chains and learns nothing"
IDLE = "adaptive, a policy that plans plain steps and learns nothing"


@pytest.fixture(scope="module")
def target():
    return tiny_checkpoint(tempfile.mkdtemp(prefix="graph_steps_"))


@pytest.mark.parametrize("name", ["fixed 4-chains", CHAINS, IDLE])
def test_variant_runs_its_shape(target, name):
    config, draft, change = variants(max_batch=1)[name]
    ms, launch, captured, clocks, shapes = time_variant(target, config, draft, change, new_tokens=12, rounds=1,
                                                        device="cpu")
    steps = int(shapes.split()[0])
    assert ms > 0 and launch == 0 and captured == 0  # eager: no graph replayed, none captured
    if name == CHAINS:  # every step a 4-chain, none plain
        assert shapes == f"{steps} steps (chain-4 {steps})"
    elif name == IDLE:  # every step plain: one token each
        assert steps == 11 and "chain" not in shapes  # (the prefill emits the first of the 12 tokens)
    else:  # fixed 4-chains at 2.72 accepted: fewer steps than tokens
        assert steps < 11
