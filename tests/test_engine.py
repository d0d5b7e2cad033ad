"""The engine end to end on tiny models: speculative greedy output equals plain greedy output token for token,
requests of different lengths join and leave, and bad requests are refused before any work."""

from __future__ import annotations

import pytest
import torch

from drafters import DraftModelDrafter, DraftRequest, NgramDrafter
from specdec.cache.spec import CacheConfig
from specdec.engine.engine import Engine, EngineConfig
from specdec.engine.prefill import prefill_forwards
from specdec.models import load_model
from specdec.speculation import SamplingParams, TreeShape
from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny

NEW_TOKENS = 64


@pytest.fixture(scope="module", params=["qwen3_5", "nemotron_h"])
def model(request, tmp_path_factory):
    config = qwen35_text_config() if request.param == "qwen3_5" else nemotron_h_config()
    directory = tmp_path_factory.mktemp(request.param)
    save_tiny(config, directory, seed=21)
    return load_model(directory, device="cpu")


def prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    pattern = torch.randint(0, 90, (6,), generator=gen).tolist()
    return [pattern * 3, torch.randint(0, 90, (2,), generator=gen).tolist(),
            torch.randint(0, 90, (19,), generator=gen).tolist() + pattern * 2]


def generate(model, drafter, flush_length: int, shape=TreeShape(steps=4), max_batch: int = 3,
             max_prefill_tokens: int = 16384, prefills: list | None = None):
    """prefills: gets the prompt lengths of every prefill forward, in order."""
    config = EngineConfig(cache=CacheConfig(max_requests=max_batch, max_seq_len=160, flush_length=flush_length),
                          shape=shape, max_prefill_tokens=max_prefill_tokens, speculation="fixed")
    engine = Engine(model, drafter, config)
    if prefills is not None:
        forward = engine.runner.prefill_with_features

        def recorded(slots, prompts):
            prefills.append([len(p) for p in prompts])
            return forward(slots, prompts)

        engine.runner.prefill_with_features = recorded
    requests = [engine.add_request(p, SamplingParams(), NEW_TOKENS) for p in prompts()]
    engine.run()
    assert engine.runner.cache.free_request_slots == max_batch, "a finished request kept its slot"
    return requests


@pytest.mark.parametrize("flush_length", [1, 3, 16], ids=lambda length: f"L{length}")
def test_ngram_speculation_is_lossless_under_greedy(model, flush_length):
    plain = generate(model, None, flush_length)
    speculative = generate(model, NgramDrafter(), flush_length)
    for ours, reference in zip(speculative, plain, strict=True):
        assert ours.output == reference.output
        assert len(ours.output) == NEW_TOKENS
    accepted = sum(sum(r.stats.emitted_per_step) - len(r.stats.emitted_per_step) for r in speculative)
    assert accepted > 0, "the n-gram drafter never got a token accepted: the test would not exercise commits"
    assert sum(r.stats.steps for r in speculative) < sum(r.stats.steps for r in plain)


def test_requests_join_and_leave_between_steps(model):
    """More requests than slots: they queue, run two at a time, and each equals its own solo run."""
    solo = [generate(model, None, 16, max_batch=1)]
    batched = generate(model, NgramDrafter(), 16, max_batch=2)
    assert [r.output for r in batched] == [r.output for r in solo[0]]


def test_a_prefill_token_budget_splits_the_prefill_and_changes_no_token(model):
    """Prompts of 18, 2 and 31 tokens admitted together: one forward by default; under a budget of 40 padded tokens
    two (18 + 2 pad to 2 x 18 = 36; with the 31 they would pad to 93); under 8, the long prompts in pieces of 8, one
    forward a step, each continuing from the state the one before committed (through the buffer, then the chunked
    path: flush length 16). The same outputs under greedy."""
    whole, split, pieces = [], [], []
    reference = generate(model, NgramDrafter(), 16, prefills=whole)
    grouped = generate(model, NgramDrafter(), 16, max_prefill_tokens=40, prefills=split)
    chunked = generate(model, NgramDrafter(), 16, max_prefill_tokens=8, prefills=pieces)
    assert whole == [[18, 2, 31]] and split == [[18, 2], [31]]
    assert pieces == [[8], [8], [2, 2], [8], [8], [8], [7]]  # (the 18-token prompt's last 2 beside the 2-token one)
    assert [r.output for r in grouped] == [r.output for r in reference]
    assert [r.output for r in chunked] == [r.output for r in reference]


def test_a_long_prompt_prefills_between_the_decode_steps_of_the_running_requests(model):
    """A 31-token prompt admitted while a request decodes, under a budget of 8: its four pieces take four steps,
    each of which also decodes the running request; both outputs equal their solo runs."""
    config = EngineConfig(cache=CacheConfig(max_requests=2, max_seq_len=160, flush_length=16), max_prefill_tokens=8,
                          speculation="fixed")
    engine = Engine(model, NgramDrafter(), config)
    short, long = prompts()[1], prompts()[2]
    running = engine.add_request(short, SamplingParams(), NEW_TOKENS)
    engine.step()
    engine.step()
    late = engine.add_request(long, SamplingParams(), NEW_TOKENS)
    for piece in range(4):
        before = len(running.output)
        engine.step()
        assert len(running.output) > before, "the running request waited for the long prefill"
        assert (late.prefilled, len(late.output)) == (min(8 * (piece + 1), 31), int(piece == 3))
    engine.run()
    solo = [generate(model, None, 16, max_batch=1)[index] for index in (1, 2)]
    assert [running.output, late.output] == [r.output for r in solo]


def test_prefill_forwards_stay_within_the_budget():
    assert prefill_forwards([], 8) == []
    assert prefill_forwards([3, 3, 3], 9) == [[(0, 0, 3), (1, 0, 3), (2, 0, 3)]]
    assert prefill_forwards([3, 3, 3], 8) == [[(0, 0, 3), (1, 0, 3)], [(2, 0, 3)]]
    assert prefill_forwards([5, 1, 1, 1], 10) == [[(0, 0, 5), (1, 0, 1)], [(2, 0, 1), (3, 0, 1)]]  # padded to 5
    # a prompt over the budget: alone, in pieces, between the groups before and after it
    assert prefill_forwards([2, 20, 2, 2], 8) == [[(0, 0, 2)], [(1, 0, 8)], [(1, 8, 16)], [(1, 16, 20)],
                                                  [(2, 0, 2), (3, 0, 2)]]
    with pytest.raises(ValueError, match="max_prefill_tokens"):
        EngineConfig(max_prefill_tokens=0)


@pytest.mark.parametrize(
    "prompt, max_new_tokens, message",
    [([], 8, "the prompt is empty"), ([1, 2], 0, "max_new_tokens must be >= 1"),
     ([1, 2], 600, "context"), ([1, 2], 300, "cache holds"), ([1, 999], 8, "token ids must lie in")],
    ids=["empty-prompt", "no-new-tokens", "over-context", "over-cache", "bad-token"],
)
def test_bad_requests_are_refused_before_any_work(model, prompt, max_new_tokens, message):
    engine = Engine(model, NgramDrafter(), EngineConfig(cache=CacheConfig(max_requests=2, max_seq_len=256),
                                                        speculation="fixed"))
    with pytest.raises(ValueError, match=message):
        engine.add_request(prompt, SamplingParams(), max_new_tokens)
    request = engine.add_request([1, 2, 3], SamplingParams(), 4)  # the engine stays usable
    engine.run()
    assert len(request.output) == 4


@pytest.fixture(scope="module", params=["qwen3_5", "nemotron_h"])
def draft_pair(request, tmp_path_factory):
    """A target and a smaller draft of the same family (a different random init: partial agreement)."""
    target_dir, draft_dir = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("draft")
    if request.param == "qwen3_5":
        save_tiny(qwen35_text_config(), target_dir, seed=21)
        save_tiny(qwen35_text_config(hidden_size=16), draft_dir, seed=22)
    else:
        save_tiny(nemotron_h_config(), target_dir, seed=21)
        save_tiny(nemotron_h_config(hidden_size=16, layers_block_type=["linear_attention", "full_attention",
                                                                      "linear_attention"]), draft_dir, seed=22)
    return load_model(target_dir, device="cpu"), load_model(draft_dir, device="cpu")


def draft_model_drafter(draft, flush_length):
    return DraftModelDrafter(draft, CacheConfig(max_requests=3, max_seq_len=160, flush_length=flush_length))


@pytest.mark.parametrize("flush_length", [1, 16], ids=lambda length: f"L{length}")
@pytest.mark.parametrize("shape", [TreeShape(steps=4), TreeShape(steps=3, topk=2, max_tokens=6)],
                         ids=["chain4", "tree-top2"])
def test_draft_model_speculation_is_lossless_under_greedy(draft_pair, flush_length, shape):
    target, draft = draft_pair
    plain = generate(target, None, flush_length)
    speculative = generate(target, draft_model_drafter(draft, flush_length), flush_length, shape=shape)
    assert [r.output for r in speculative] == [r.output for r in plain]


def test_draft_equal_to_target_accepts_everything(draft_pair):
    """The target drafting for itself: every draft token is accepted, steps + 1 tokens per step."""
    target, _ = draft_pair
    requests = generate(target, draft_model_drafter(target, 16), 16, shape=TreeShape(steps=4))
    for request in requests:
        full_steps = request.stats.emitted_per_step[:-1]  # the last step may be cut by max_new_tokens
        assert full_steps and all(n == 5 for n in full_steps)
        assert request.stats.acceptance_rate > 0.95


def test_a_request_that_needs_a_state_is_refused_when_there_are_none(model):
    config = EngineConfig(cache=CacheConfig(max_requests=2, max_seq_len=64, flush_length=8, num_state_slots=0))
    engine = Engine(model, None, config)
    with pytest.raises(ValueError, match="no state slots"):
        engine.add_request(list(range(1, 10)), SamplingParams(), 4)
    short = engine.add_request([1, 2], SamplingParams(), 4)  # 2 + 4 + 1 < 8: stays in the buffer, runs
    engine.run()
    assert len(short.output) == 4 and engine.runner.cache.state_slot.count(-1) == 2


def test_draft_model_reads_a_prompt_only_when_the_request_first_drafts(draft_pair, monkeypatch):
    """start() runs no forward (a request that never drafts never costs a draft prefill); the first propose reads each
    new prompt in a forward of its own and the other rows' runs of skipped roots together, and drafts what a draft
    model that read every token as it came drafts."""
    _, draft = draft_pair
    shape = TreeShape(steps=3)
    gen = torch.Generator().manual_seed(3)
    old, new = (DraftRequest(i, torch.randint(0, 90, (n,), generator=gen).tolist(), SamplingParams(), None)
                for i, n in ((0, 9), (1, 23)))
    lazy, eager = draft_model_drafter(draft, 16), draft_model_drafter(draft, 16)
    forwards = []
    prefill = lazy.runner.prefill
    monkeypatch.setattr(lazy.runner, "prefill", lambda slots, tokens: forwards.append([len(t) for t in tokens])
                        or prefill(slots, tokens))
    lazy.start(old)
    assert forwards == []
    lazy._catch_up([old])  # (as its first drafting step would)
    assert forwards == [[8]]
    for token in (7, 8):  # two plain steps: their roots skipped, a token emitted after each
        lazy.skipped([old], [old.tokens[-1]])
        old.tokens.append(token)
    lazy.start(new)
    forwards.clear()
    trees = lazy.propose([old, new], shape)
    assert sorted(forwards) == [[2], [22]]  # the new prompt alone; the old row's two skipped roots
    for request in (old, new):  # every token but the root read at once
        eager.start(DraftRequest(request.request_id, request.tokens[-1:], request.params, None))
        eager.runner.prefill([eager.slots[request.request_id]], [request.tokens[:-1]])
    assert [t.tokens for t in trees] == [t.tokens for t in eager.propose([old, new], shape)]


def test_ngram_lookup():
    drafter = NgramDrafter(max_ngram=3)
    assert drafter.lookup([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]  # longest suffix [1, 2, 3] seen before
    assert drafter.lookup([5] * 6, 3) == [5, 5, 5]  # a repeating text: an earlier match with room
    assert drafter.lookup([1, 2, 3, 4], 2) == []  # nothing repeats


def test_sampled_drafts_from_the_target_itself_are_all_accepted(draft_pair):
    """Under sampling the draft distribution q equals the target's p when the target drafts for itself, so every
    draft is accepted (min(1, p/q) = 1): the sampled path's laws and acceptance line up exactly."""
    target, _ = draft_pair
    config = EngineConfig(cache=CacheConfig(max_requests=3, max_seq_len=160, flush_length=16), shape=TreeShape(steps=3),
                          speculation="fixed")
    engine = Engine(target, draft_model_drafter(target, 16), config)
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=11)
    requests = [engine.add_request(p, params, 32) for p in prompts()]
    engine.run()
    for request in requests:
        assert len(request.output) == 32
        assert all(n == 4 for n in request.stats.emitted_per_step[:-1])


def test_sampled_requests_with_mixed_parameters_equal_their_solo_runs(model):
    """Sampled rows of several parameter sets walk together (engine/acceptance.py) yet draw from their own seeds:
    each request's output is the one it gives alone, and a different seed gives another."""
    mix = [SamplingParams(temperature=0.8, seed=1), SamplingParams(temperature=1.3, top_k=7, seed=2),
           SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9, seed=3)]
    work = list(zip(prompts() + [prompts()[0]], mix, strict=True))

    def run(batch):
        engine = Engine(model, NgramDrafter(), EngineConfig(cache=CacheConfig(max_requests=4, max_seq_len=160),
                                                            speculation="fixed"))
        requests = [engine.add_request(prompt, params, 24) for prompt, params in batch]
        engine.run()
        return [request.output for request in requests]

    together = run(work)
    assert together == [run([item])[0] for item in work]
    reseeded = run([(work[0][0], SamplingParams(temperature=0.8, seed=99))])[0]
    assert reseeded != together[0]


def brute_force_lookup(tokens: list[int], count: int, max_ngram: int = 4) -> list[int]:
    """The n-gram lookup as a scan of the whole sequence (the oracle of the indexed one)."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        best: list[int] = []
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tokens[-n:]:
                following = tokens[start + n:start + n + count]
                if len(following) == count:
                    return following
                best = max(best, following, key=len)
        if best:
            return best
    return []


def test_indexed_ngram_lookup_equals_a_full_scan():
    """The per-request index, extended token by token as a request grows, finds what a scan finds."""
    gen = torch.Generator().manual_seed(0)
    drafter = NgramDrafter()
    tokens = torch.randint(0, 5, (300,), generator=gen).tolist()  # a small alphabet: many repeats
    for length in range(1, len(tokens) + 1, 7):
        request = DraftRequest(0, tokens[:length], SamplingParams(), None)
        tree = drafter.propose([request], TreeShape(steps=4))[0]
        assert tree.tokens[1:] == brute_force_lookup(tokens[:length], 4)
    drafter.finish(0)
    assert drafter.lookup(tokens, 3) == brute_force_lookup(tokens, 3)
