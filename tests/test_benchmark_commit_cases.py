"""The commit cases of the kernel benchmarks (benchmarks/commit_cases.py), on the CPU with each timed call run once
(the timing itself needs CUDA graphs): the buffers filled so that the named rows fold, what the folds read, and the
baseline's commit copying each row's last accepted node state into its slot."""

import torch

from benchmarks import commit_cases


def run_once(calls):
    for call in calls:
        call()
    return 1e-6  # (a microsecond a call)


def test_cases_fill_the_buffers_so_that_the_named_rows_fold(monkeypatch):
    monkeypatch.setattr(commit_cases, "time_calls", run_once)
    batch, rotations, accepted, flush_length = 16, 2, 3, 16
    buf_len = torch.zeros(rotations * batch, dtype=torch.long)
    seen = []

    def commit(r):
        return lambda: seen.append((r, buf_len.clone()))

    rows = commit_cases.time_commit_cases(batch, rotations, buf_len, accepted, flush_length, commit)
    assert [row["folded_rows"] for row in rows] == [0, 2, 16]
    assert [row["entries_read"] for row in rows] == [0, 2 * 16, 16 * 16]  # a folding row: its full buffer
    assert all(row["ours_us"] == 1.0 for row in rows)
    for case, (_, fills) in zip(rows, seen[1::2], strict=True):  # (rotation 1's call of each case)
        folding = fills[batch:] + accepted >= flush_length
        assert int(folding.sum()) == case["folded_rows"]


def test_baseline_commit_copies_the_last_accepted_state(monkeypatch):
    monkeypatch.setattr(commit_cases, "time_calls", run_once)
    torch.manual_seed(0)
    batch, nodes = 3, 4
    pool = torch.zeros(2 * batch, 2, 4, 8)
    slots = [torch.arange(batch), torch.arange(batch, 2 * batch)]
    accepted, num_accepted = commit_cases.chain_prefix(batch, 3, device="cpu")
    rows = [{"ours_us": 0.5}, {"ours_us": 2.0}]
    commit_cases.add_baseline_commit(rows, pool, slots, nodes, accepted, num_accepted)
    assert [row["speedup_vs_baseline"] for row in rows] == [2.0, 0.5]
    assert rows[0]["baseline_bytes_moved"] == 2 * batch * 2 * 4 * 8 * 4
    assert bool((pool != 0).all())  # every slot written, with a node state (random normals)
