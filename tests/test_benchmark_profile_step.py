"""benchmarks/profile_step.py's idle time between device events: short gaps (inside a step's graph) apart from
long ones (between steps), overlapping events counted once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from benchmarks.profile_step import GRAPH_GAP_US, device_gaps


def event(start: float, end: float, device: bool = True):
    kind = torch.autograd.DeviceType.CUDA if device else torch.autograd.DeviceType.CPU
    return SimpleNamespace(time_range=SimpleNamespace(start=start, end=end), device_type=kind)


def test_gaps_split_at_the_graph_gap_and_overlaps_count_once():
    long_gap = GRAPH_GAP_US + 30.0
    events = [event(0, 10), event(12, 20), event(15, 18),  # 2 us idle, then one inside another: no gap
              event(21, 30), event(30 + long_gap, 40 + long_gap),  # 1 us, then a long gap (the next step)
              event(0, 500, device=False)]  # (a host event: not the GPU's)
    within, between = device_gaps(events, steps=2)
    assert within == pytest.approx((2 + 1) / 1e3 / 2)
    assert between == pytest.approx(long_gap / 1e3 / 2)
