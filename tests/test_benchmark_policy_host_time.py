"""benchmarks/policy_host_time.py: the policy's host time a step is timed over the steps asked, and a table row per
batch size comes out."""

from __future__ import annotations

from benchmarks import policy_host_time


def test_times_plan_and_observe_and_prints_a_row_per_batch(monkeypatch, capsys):
    monkeypatch.setattr(policy_host_time, "WARM_UP", 2)
    monkeypatch.setattr(policy_host_time, "STEPS", 5)
    monkeypatch.setattr(policy_host_time, "RUNS", 1)
    monkeypatch.setattr(policy_host_time, "BATCHES", (1, 8))
    calls = []
    plan = policy_host_time.AdaptivePolicy.plan

    def counted(self, *args, **kwargs):
        calls.append(len(args[0]))
        return plan(self, *args, **kwargs)
    monkeypatch.setattr(policy_host_time.AdaptivePolicy, "plan", counted)
    assert policy_host_time.seconds_per_step(8) > 0
    assert calls == [8] * 7  # warm-up and timed steps, each of the whole batch
    monkeypatch.setattr("sys.argv", ["policy_host_time", "--label", "here"])
    policy_host_time.main()
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "| batch | plan + observe ms a step (here) |" and [r.split("|")[1].strip() for r in rows[2:]] == [
        "1", "8"]


def test_in_engine_times_the_policys_calls_of_each_step():
    step_ms, plan_us, observe_us = policy_host_time.in_engine(held=True, prompts=1, new_tokens=8)
    assert 0 < plan_us and 0 < observe_us and 1e-3 * (plan_us + observe_us) < step_ms


def test_a_tree_offered_is_told_its_paths(monkeypatch):
    monkeypatch.setattr(policy_host_time, "WARM_UP", 2)
    monkeypatch.setattr(policy_host_time, "STEPS", 30)
    monkeypatch.setattr(policy_host_time, "RUNS", 1)
    told = []
    observe = policy_host_time.AdaptivePolicy.observe

    def recorded(self, ids, drafted, kept, seconds, planned=None, trees=None):
        told.append(trees)
        return observe(self, ids, drafted, kept, seconds, planned, trees)
    monkeypatch.setattr(policy_host_time.AdaptivePolicy, "observe", recorded)
    assert policy_host_time.seconds_per_step(4, tree=True) > 0
    tree_steps = [trees for trees in told if trees is not None]
    assert tree_steps, "the flat cost prices the tree best: it is drafted"
    assert all(path[0] == 0 and all(parents[b] == a for a, b in zip(path, path[1:], strict=False))
               for trees in tree_steps for parents, path in trees)
    assert policy_host_time.first_ranked_path(2) == [0, 1, 3]  # (the first-ranked child of node 1 is node 3)


def test_first_plan_times_a_fresh_policys_first_plan_then_its_next(monkeypatch, capsys):
    policies = []
    new = policy_host_time.AdaptivePolicy.__init__

    def made(self, *args, **kwargs):
        new(self, *args, **kwargs)
        policies.append(self)
    monkeypatch.setattr(policy_host_time.AdaptivePolicy, "__init__", made)
    first, second = policy_host_time.first_plan_ms(8, repeats=3)
    assert first > 0 and second > 0 and len(policies) == 3
    assert all(len(p.acceptance) == 8 and p.steps == 0 for p in policies)  # (planned twice, nothing observed)
    monkeypatch.setattr("sys.argv", ["policy_host_time", "--first-plan"])
    policy_host_time.main()
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].startswith("| batch | first plan of new requests")
    assert [r.split("|")[1].strip() for r in rows[2:]] == ["1", "16", "64", "256"]
