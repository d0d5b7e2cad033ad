"""Adaptive speculation's plain steps (nobody drafts) run plain decoding's decode steps (Engine.plain_step): committed
in the forward, sampled on the device, a run of them pipelined one step ahead of the host. Checked on the CPU against
plain decoding (greedy, with requests ending mid-run on an end-of-sequence token or their length, one queued), the
drafter told of every root scored without drafting, the stats and the policy's observations; sampled requests
reproduce under a seed; drafters that read the target's features keep verify steps of width 1; a warm-up builds the
decode graphs too; a plain step launches the very kernels of plain decoding's step."""

from __future__ import annotations

import types

import pytest
import torch

from drafters import DraftModelDrafter, NgramDrafter
from specdec.cache.spec import CacheConfig
from specdec.engine import engine as engine_module
from specdec.engine.engine import Engine, EngineConfig
from specdec.models import load_model
from specdec.runner import cuda_graphs
from specdec.speculation import SamplingParams, TreeShape
from specdec.speculation.adaptive import AdaptiveConfig
from tests.test_cuda_graphs import prompts, save

MAX_NEW = [24, 7, 15, 24]  # per prompt: rows whose last token is in flight while others go on
CACHE = CacheConfig(max_requests=3, max_seq_len=128, flush_length=3)  # 4 prompts: one queues, prefilled mid-run


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save("qwen3_5", tmp_path_factory)


@pytest.fixture
def clock(monkeypatch):
    """The engine's clock ticks 2**-10 s a reading, exact in binary (1e-3 steps are not: 1 ms came out a few ulps
    apart from reading to reading, and near-tied plans flipped): the policy's step costs, so its plans, repeat from
    run to run."""
    ticks = iter(range(10**9))
    monkeypatch.setattr(engine_module, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks) / 1024))


class TellingDrafter(DraftModelDrafter):
    """The draft model (its cache follows the request: it catches up on skipped roots), recording what it is told:
    every skipped root must be the token before the request's newest (Drafter.skipped)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.told: dict[int, int] = {}  # request id -> roots told skipped
        self.widest_pending = 0  # the most pending tokens any row carried into a drafting level

    def _score(self, requests, trees):
        self.widest_pending = max([self.widest_pending] + [len(self.pending[r.request_id]) for r in requests])
        return super()._score(requests, trees)

    def skipped(self, requests, roots, target_hidden=None):
        for request, root in zip(requests, roots, strict=True):
            assert request.tokens[-2] == root, "a skipped root is not the token scored before the newest"
            self.told[request.request_id] = self.told.get(request.request_id, 0) + 1
        super().skipped(requests, roots, target_hidden)


def run(engine: Engine, params: SamplingParams, eos=()) -> tuple[list, list[int]]:
    """Every prompt to the end, step by step. -> (the requests, the tokens in flight after each step)."""
    requests = [engine.add_request(p, params, n, eos) for p, n in zip(prompts(), MAX_NEW, strict=True)]
    in_flight = []
    while not engine.scheduler.idle:
        engine.step()
        in_flight.append(sum(r.in_flight for r in requests))
    return requests, in_flight


def adaptive_engine(checkpoint) -> Engine:
    """Requests always collapsed: plain steps, a drafting probe every 6 (runs of plain steps between)."""
    shape = TreeShape(steps=2)
    drafter = TellingDrafter(load_model(checkpoint / "draft", device="cpu"), CACHE, shape, cuda_graphs=False)
    config = EngineConfig(cache=CACHE, shape=shape, cuda_graphs=False, speculation="adaptive",
                          adaptive=AdaptiveConfig(collapse=1.01, probe_every=6))
    return Engine(load_model(checkpoint, device="cpu"), drafter, config)


def test_plain_steps_decode_pipelined_and_generate_the_plain_tokens(checkpoint, clock):
    plain_engine = Engine(load_model(checkpoint, device="cpu"), None, EngineConfig(cache=CACHE, cuda_graphs=False,
                                                                                   speculation="fixed"))
    first, _ = run(plain_engine, SamplingParams())
    eos = {first[0].output[12]}  # request 0 ends on it (at 12 or before), maybe others too
    plain, _ = run(Engine(load_model(checkpoint, device="cpu"), None, EngineConfig(cache=CACHE, cuda_graphs=False,
                                                                                   speculation="fixed")),
                   SamplingParams(), eos)
    engine = adaptive_engine(checkpoint)
    assert engine.plain_decodes and engine.runner.decode_graphs is None  # (no graphs on the CPU: eager decode steps)
    calls = {"decode_next": 0, "score_all": 0}
    for name in calls:  # count the runner's plain and verify steps
        method = getattr(engine.runner, name)

        def counted(*args, _method=method, _name=name, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)
        setattr(engine.runner, name, counted)
    observed = []  # (shape label, seconds told) per step
    members = []  # the requests of each step, in the steps' order
    observe = engine.policy.observe

    def recorded(ids, drafted, accepted, seconds, planned=None, trees=None):
        observed.append(((planned or engine.policy._planned).plan.label, seconds))
        members.append(set(ids))
        observe(ids, drafted, accepted, seconds, planned, trees)
    engine.policy.observe = recorded
    firsts = []  # after the first plain step of each run: whether its tokens were left in flight
    plain_step = engine.plain_step

    def watched(requests, start):
        first = engine._plain_run == 0
        plain_step(requests, start)
        if first:
            firsts.append(engine._decoding is not None)
    engine.plain_step = watched
    adaptive, in_flight = run(engine, SamplingParams(), eos)

    assert [r.output for r in adaptive] == [r.output for r in plain]
    untimed = [i for i, (_, seconds) in enumerate(observed) if seconds is None]
    timed_plain = [i for i, (label, seconds) in enumerate(observed) if label == "plain" and seconds is not None]
    assert timed_plain, "no run of plain steps reached its third step"
    for i in timed_plain:  # only pipelined plain steps are timed: the third of a run on
        assert [label for label, _ in observed[i - 2:i]] == ["plain", "plain"]
    for i in untimed:  # and the first and second of a run are not
        assert observed[i][0] == "plain" and (i < 2 or [label for label, _ in observed[i - 2:i]] != ["plain"] * 2)
    assert all(seconds is not None for label, seconds in observed if label != "plain")
    assert any(in_flight), "no plain step was left in flight (pipelined)"
    # the first of a run too: the host plans and launches the next step while the device runs it
    assert len(firsts) > 1 and all(firsts)
    counts = engine.policy.counts
    assert calls == {"decode_next": counts["plain"], "score_all": sum(counts.values()) - counts["plain"]}
    assert counts["plain"] > 0 and calls["score_all"] > 0
    assert engine.policy.steps == sum(counts.values())  # every step observed, plain ones included
    for request in adaptive:
        stats = request.stats
        assert sum(stats.shapes.values()) == stats.steps == len(stats.emitted_per_step) > 0
        assert engine.drafter.told.get(request.request_id, 0) == stats.drafted_per_step.count(0)
        # in the order of its steps (a speculative step's stats are recorded after the next launch:
        # Engine.record_stats), but for plain steps at its end whose tokens it dropped (it had ended)
        kinds = [label != "plain" for (label, _), ids in zip(observed, members, strict=True)
                 if request.request_id in ids]
        recorded_kinds = [drafted > 0 for drafted in stats.drafted_per_step]
        assert kinds[:len(recorded_kinds)] == recorded_kinds and not any(kinds[len(recorded_kinds):])
        assert sum(drafting for drafting in recorded_kinds) == sum(n for label, n in stats.shapes.items()
                                                                   if label != "plain") > 0
    # the skipped roots were committed in one catch-up forward before drafting, not scored in front of every level
    assert max(engine.drafter.told.values()) > 1 and engine.drafter.widest_pending <= 1
    assert engine.runner.cache.free_request_slots == CACHE.max_requests and not engine.drafter.slots


def test_sampled_requests_reproduce_under_a_seed(checkpoint, clock):
    params = SamplingParams(temperature=0.9, seed=5)
    outputs = [[r.output for r in run(adaptive_engine(checkpoint), params)[0]] for _ in range(2)]
    assert outputs[0] == outputs[1]


def test_drafters_reading_target_features_keep_verify_steps(checkpoint):
    """A decode step hands back no features: a drafter that reads them (MTP, EAGLE-3) verifies plain steps as
    width-1 trees, as fixed speculation's steps (tests/test_adaptive.py checks their tokens)."""
    class FeatureNgram(NgramDrafter):
        target_features = ()

    config = EngineConfig(cache=CACHE, shape=TreeShape(steps=2), cuda_graphs=False, speculation="adaptive")
    target = load_model(checkpoint, device="cpu")
    assert Engine(target, NgramDrafter(), config).plain_decodes
    assert not Engine(target, FeatureNgram(), config).plain_decodes


def test_prepare_steps_builds_the_decode_graphs_beside_the_verify_graphs(checkpoint, monkeypatch):
    """Decode steps read from the prompt + 1 key positions on, verify steps from the prompt + their width: with a
    30-token prompt, decode graphs at key lengths 32 and 64, verify graphs (widths 2 and 3) at 64 alone."""
    monkeypatch.setattr(cuda_graphs, "MIN_KV_LEN", 16)
    engine = adaptive_engine(checkpoint)
    engine.runner.enable_graphs(3, max_batch=3, capture=False, decode_steps=True)
    engine.runner.graphs.set_widths(engine.verify_widths)
    built = []  # (built_one: a call after each graph, a server's progress)
    assert engine.prepare_steps(rows=3, prompt_tokens=30, max_new_tokens=20, built_one=lambda: built.append(1)) == 12
    assert len(built) == 12
    assert set(engine.runner.decode_graphs._steps) == {(1, rows, kv) for rows in (1, 2, 3) for kv in (32, 64)}
    assert set(engine.runner.graphs._steps) == {(width, rows, 64) for width in (2, 3) for rows in (1, 2, 3)}


def test_the_policy_is_told_the_draft_models_backlog(checkpoint, clock):
    """Before a row first drafts, the draft model owes it its prompt and every root it sat out (the catch-up that
    adaptive speculation prices, CatchUpCost); a drafting step clears it."""
    engine = adaptive_engine(checkpoint)
    told = []  # (backlog told, backlog of the rows as the engine's requests show it) per plan
    plan = engine.policy.plan

    def recorded(ids, contexts, backlog=0):
        rows = [r for r in engine.scheduler.running if r.request_id in ids]
        unread = [r for r in rows if r.request_id in engine.drafter.unread_prompts]
        owed = [len(r.prompt) + engine.drafter.told.get(r.request_id, 0) for r in unread]
        owed = sum(n for n in owed if n > 1)  # (a single token is scored in front of the tree instead)
        told.append((backlog, owed, len(unread) == len(rows)))
        return plan(ids, contexts, backlog)
    engine.policy.plan = recorded
    run(engine, SamplingParams())
    fresh = [(backlog, owed) for backlog, owed, all_unread in told if all_unread]
    assert fresh and all(backlog == owed > 0 for backlog, owed in fresh)
    assert any(backlog < owed or not all_unread for backlog, owed, all_unread in told)  # read by a drafting step


def launches_of_a_decode_step(checkpoint, adaptive: bool, monkeypatch) -> list:
    """Every Triton launch of two decode steps (one request, its third and fourth), each as (kernel, grid,
    its arguments: tensors by shape, strides and dtype, the rest by value): plain decoding's, or adaptive
    speculation's whose every width (chains of 1, 2 and 4, the tree of 16 drafts) is measured and whose request is
    collapsed, so that its steps are plain. Both on the static steps of the CUDA graphs, run eagerly."""
    from triton.runtime import jit

    from specdec.eval.synthetic import synthetic_speculation

    cache = CacheConfig(max_requests=2, max_seq_len=128, flush_length=4)
    target = load_model(checkpoint, device="cpu")
    if adaptive:
        drafter, acceptance = synthetic_speculation("synthetic:1.2", 4)
        config = EngineConfig(cache=cache, shape=TreeShape(steps=4, topk=2, max_tokens=16), cuda_graphs=False,
                              speculation="adaptive",
                              adaptive=AdaptiveConfig(collapse=1.01, probe_every=10**9, refresh_every=0))
        engine = Engine(target, drafter, config, acceptance)
        for width in engine.policy.config.widths:  # (measured, and far dearer than a plain step: nothing drafts)
            for _ in range(2):
                engine.policy.cost.observe(1, width, 20.0, 1e3 if width > 1 else 1e-3)
    else:
        engine = Engine(target, None, EngineConfig(cache=cache, cuda_graphs=False, speculation="fixed"))
    width = engine.config.shape.budget + 1 if adaptive else 1
    engine.runner.enable_graphs(width, max_batch=1, capture=False, decode_steps=engine.plain_decodes)
    if adaptive:
        engine.runner.graphs.set_widths(engine.verify_widths)
    engine.add_request(prompts()[0], SamplingParams(), max_new_tokens=12)
    engine.admit_and_prefill()
    replays = engine.runner.decode_graphs.replays
    while replays[1] < 3:
        engine.step()

    def described(value):
        if isinstance(value, torch.Tensor):
            return tuple(value.shape), value.stride(), value.dtype
        return value if isinstance(value, int | float | bool | str | type(None)) else type(value).__name__

    launched = []
    launch = jit.KernelInterface.__getitem__

    def recorded(kernel, grid):
        run = launch(kernel, grid)

        def logged(*args, **kwargs):
            launched.append((getattr(kernel, "__name__", repr(kernel)), grid if isinstance(grid, tuple) else "fn",
                             tuple(map(described, args)), sorted((k, described(v)) for k, v in kwargs.items())))
            return run(*args, **kwargs)
        return logged

    monkeypatch.setattr(jit.KernelInterface, "__getitem__", recorded)
    while replays[1] < 5 and not engine.scheduler.idle:  # (the third and fourth decode steps: the same tokens
        engine.step()  # and lengths in both engines)
    monkeypatch.undo()
    assert engine.policy is None or set(engine.policy.counts) == {"plain"}
    return launched


@pytest.mark.parametrize("name", ["qwen3_5", "nemotron_h"])
def test_a_plain_step_launches_what_plain_decodings_step_launches(name, tmp_path_factory, monkeypatch):
    """An adaptive engine holds steps of every width its policy may choose, yet its plain step launches the very
    kernels of plain decoding's step: the same Triton kernels, grids, shapes, strides and compile-time arguments (in
    the interpreter, on the CPU). On an H100 its plain steps still took ~8 us (0.2%) longer than plain decoding's at
    Nemotron-3-Nano batch 1 (benchmarks/results/paired_adaptive_h100_2026-12-07b): not from what they launch."""
    checkpoint = save(name, tmp_path_factory)
    monkeypatch.setenv("SPECDEC_BACKEND", "triton")
    plain = launches_of_a_decode_step(checkpoint, False, monkeypatch)
    monkeypatch.setenv("SPECDEC_BACKEND", "triton")  # (undone with the launches' hook)
    adaptive = launches_of_a_decode_step(checkpoint, True, monkeypatch)
    assert len(plain) > 20 and adaptive == plain
