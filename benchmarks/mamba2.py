"""Mamba2 at Nemotron-3-Nano shapes (64 heads, head dim 64, state 128, 8 groups, fp32 state): decode."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from benchmarks.inputs import Pools, rotation_slots
from benchmarks.timing import rotations_for, time_calls
from verify_kernels.mamba2 import mamba2_decode_commit

NH, P, N, NG = 64, 64, 128, 8
STATE_BYTES = NH * P * N * 4
BUFFER_CAPACITY = 32


def decode_rows(batches, flush_lengths, sglang_ssu) -> list[dict]:
    rows = []
    for batch in batches:
        rows += _decode_batch(batch, flush_lengths, sglang_ssu)
        torch.cuda.empty_cache()
    return rows


def _decode_batch(batch: int, flush_lengths, sglang_ssu) -> list[dict]:
    rotations = rotations_for(batch * STATE_BYTES)
    pools = Pools.make(rotations * batch, BUFFER_CAPACITY, (NH, P, N), (NG, N), (NH, P), NH)
    slots = [rotation_slots(r, batch) for r in range(rotations)]
    x = torch.randn(rotations, batch, NH, P, device="cuda")
    dt_raw = torch.randn(rotations, batch, NH, device="cuda") - 2.0
    dt = F.softplus(dt_raw)
    bm = torch.randn(rotations, batch, NG, N, device="cuda") * 0.1
    cm = torch.randn(rotations, batch, NG, N, device="cuda") * 0.1
    a_neg = -torch.rand(NH, device="cuda") * 4
    d_skip = torch.randn(NH, device="cuda")

    base = {"section": "mamba2_decode", "batch": batch, "rotations": rotations}
    if sglang_ssu is not None:
        seconds = _sglang_seconds(sglang_ssu, x, dt_raw, a_neg, bm, cm, d_skip, slots, rotations, batch)
        base["baseline_us"] = seconds * 1e6
    calls = [(x[r], dt[r], a_neg, bm[r], cm[r], d_skip, pools.state, slots[r], *pools.args()[1:], slots[r])
             for r in range(rotations)]
    rows = []
    for flush_length in flush_lengths:
        pools.buf_len.fill_((flush_length - 2) // 2)
        step_s = time_calls([partial(mamba2_decode_commit, *args, flush_length) for args in calls])
        pools.buf_len.fill_(flush_length - 1)
        flush_s = time_calls([partial(mamba2_decode_commit, *args, flush_length) for args in calls])
        amortised = ((flush_length - 1) * step_s + flush_s) / flush_length
        row = dict(base, flush_length=flush_length, ours_step_us=step_s * 1e6, ours_flush_us=flush_s * 1e6,
                   ours_us=amortised * 1e6)
        if "baseline_us" in base:
            row["speedup_vs_baseline"] = base["baseline_us"] / row["ours_us"]
        rows.append(row)
    return rows


def _sglang_seconds(ssu, x, dt_raw, a_neg, bm, cm, d_skip, slots, rotations, batch) -> float:
    """SGLang's (mamba_ssm-derived) selective_state_update: reads and writes each state in place. dt, A, D and
    dt_bias are per head, broadcast over the head dim with stride 0, as the serving engines pass them."""
    states = torch.randn(rotations * batch, NH, P, N, device="cuda") * 0.1
    out = torch.empty(batch, NH, P, device="cuda")
    a_full = a_neg[:, None, None].expand(NH, P, N)
    d_full = d_skip[:, None].expand(NH, P)
    dt_bias = torch.zeros(NH, device="cuda")[:, None].expand(NH, P)
    return time_calls([
        partial(ssu, states, x[r], dt_raw[r][..., None].expand(batch, NH, P), a_full, bm[r], cm[r], d_full,
                dt_bias=dt_bias, dt_softplus=True, state_batch_indices=slots[r], out=out)
        for r in range(rotations)
    ])
