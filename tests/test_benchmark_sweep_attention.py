"""benchmarks/sweep_attention.py without a GPU: every candidate names real constants of the tree attention's module
and keeps the kernel exact (Triton's interpreter, tests/test_attention_kernels.py's ragged trees), and the winner is
the candidate that beats the defaults' total by kernel_settings.WIN_MARGIN."""

import pytest
import torch

from benchmarks import kernel_settings, sweep_attention
from tests.test_attention_kernels import CASES, check, make_step
from verify_kernels.attention import flash_tree

pytestmark = pytest.mark.usefixtures("nan_empty")


@pytest.mark.parametrize("name", list(sweep_attention.CANDIDATES))
def test_every_candidate_is_a_setting_that_keeps_the_kernel_exact(name, monkeypatch):
    for constant in sweep_attention.CANDIDATES[name]:  # (restored after the test, whatever apply() sets)
        monkeypatch.setattr(flash_tree, constant, getattr(flash_tree, constant))
    monkeypatch.setattr(kernel_settings, "_applied", {})  # (the process's record of applied settings, too)
    monkeypatch.setattr(kernel_settings, "_replaced", {})
    kernel_settings.apply(sweep_attention.settings(name))
    heads, rows = CASES["ragged-trees-g2"]
    check(make_step(torch.Generator().manual_seed(3), heads, rows, torch.float32), None, torch.float32)
    check(make_step(torch.Generator().manual_seed(4), heads, rows, torch.float32), 2, torch.float32)  # split-K
    heads, rows = CASES["prompt-40"]  # 80 folded query rows: two blocks at the defaults, one of 128 at BLOCK_M_MAX 128
    check(make_step(torch.Generator().manual_seed(5), heads, rows, torch.float32), None, torch.float32)


def test_the_winner_beats_the_defaults_by_the_margin():
    def rows(times):
        return [{"config": name, "us": us} for name, values in times.items() for us in values]

    assert sweep_attention.winner(rows({"defaults": [10.0, 20.0], "keys in blocks of 16": [9.0, 18.0],
                                        "4 stages": [9.9, 19.9]})) == (
        "keys in blocks of 16", {f"{flash_tree.__name__}.BLOCK_N": 16})
    assert sweep_attention.winner(rows({"defaults": [10.0, 20.0], "4 stages": [9.9, 19.8]})) is None  # < 3%
    assert sweep_attention.winner(rows({"4 stages": [1.0]})) is None  # no defaults timed: nothing to beat
    # a candidate that failed its check (no times) or timed fewer workloads never wins
    assert sweep_attention.winner(rows({"defaults": [10.0, 20.0], "2 stages": [1.0]})) is None
