"""KVBufferCache bookkeeping: slots, lazy committed states, running out of them without losing work, bad steps."""

from __future__ import annotations

import pytest
import torch

from specdec import CacheConfig, ModelRunner, StepBatch, load_model
from specdec.cache import CacheFullError
from specdec.cache.step import StepContext
from specdec.engine.engine import Engine, EngineConfig
from specdec.speculation import SamplingParams
from tests.tiny_models import qwen35_text_config, save_tiny


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    directory = tmp_path_factory.mktemp("qwen")
    save_tiny(qwen35_text_config(), directory, seed=2)
    return load_model(directory, device="cpu")


def runner_for(model, **config) -> ModelRunner:
    return ModelRunner.create(model, CacheConfig(**{"max_requests": 3, "max_seq_len": 64, **config}))


def test_request_slots_run_out_with_a_clear_error_and_come_back(model):
    runner = runner_for(model, max_requests=2)
    slots = [runner.cache.allocate_request(), runner.cache.allocate_request()]
    with pytest.raises(CacheFullError, match="all 2 request slots are in use"):
        runner.cache.allocate_request()
    runner.cache.release_request(slots[0])
    assert runner.cache.allocate_request() == slots[0]
    with pytest.raises(ValueError, match="not allocated"):
        runner.cache.release_request(7)


def test_committed_states_are_taken_lazily_and_returned(model):
    runner = runner_for(model, flush_length=8, num_state_slots=2)
    short, long = runner.cache.allocate_request(), runner.cache.allocate_request()
    runner.prefill([short, long], [[1, 2, 3], list(range(1, 20))])
    assert runner.cache.state_slot[short] == -1, "3 tokens fit the buffer: no state"
    assert runner.cache.state_slot[long] >= 0, "a chunked prefill writes a committed state"
    assert runner.cache.buf_len[short] == 3 and runner.cache.buf_len[long] == 0
    assert runner.cache.free_state_slots == 1
    runner.cache.release_request(long)
    assert runner.cache.free_state_slots == 2


def test_a_prefill_forward_writes_its_conv_windows_and_chunk_states_and_keeps_no_scratch_of_them(model,
                                                                                                monkeypatch):
    """A prefill keeps every node, so its forward writes what the commit would (the conv windows, the chunk rows'
    states) instead of holding every layer's conv inputs and states until the commit; the commit then appends the
    short prompt's entries alone. Outputs and committed cache: those of the same prefill with everything left to
    the commit (StepContext.prefill off)."""
    prompts = [[1, 2, 3], list(range(1, 20))]

    def prefill(runner):
        slots = [runner.cache.allocate_request() for _ in prompts]
        batch = StepBatch.chains(slots, prompts, prefill=True)
        ctx = runner.cache.begin_step(batch)
        hidden, _ = runner.forward_step(batch.tokens, ctx)
        scratch = list(ctx.scratch.values())
        runner.cache.commit_all(ctx)
        return slots, hidden, scratch

    slots, hidden, scratch = prefill(runner := runner_for(model, flush_length=8))
    assert scratch and all(s.conv_input is None and s.final_state is None and s.tree is not None for s in scratch)
    with monkeypatch.context() as patch:
        patch.setattr(StepContext, "prefill", property(lambda ctx: False))
        _, hidden_then, scratch_then = prefill(reference := runner_for(model, flush_length=8))
    assert all(s.conv_input is not None and s.final_state is not None for s in scratch_then)  # (the reference's)
    torch.testing.assert_close(hidden, hidden_then, atol=0, rtol=0)
    long_state = runner.cache.state_slot[slots[1]]
    assert long_state == reference.cache.state_slot[slots[1]] >= 0
    for mine, theirs in zip(runner.cache.linear, reference.cache.linear, strict=True):
        torch.testing.assert_close(mine.conv[slots], theirs.conv[slots], atol=0, rtol=0)
        torch.testing.assert_close(mine.state[long_state], theirs.state[long_state], atol=0, rtol=0)
        assert mine.state[long_state].abs().sum() > 0
        torch.testing.assert_close(mine.buf_key[slots[0], :3], theirs.buf_key[slots[0], :3], atol=0, rtol=0)
    assert runner.cache.buf_len[slots[0]] == 3 and runner.cache.buf_len[slots[1]] == 0


def test_running_out_of_states_at_commit_loses_nothing(model):
    """A request whose buffer must fold while every state slot is taken: commit raises, the step's work stays in
    its context, and once a slot is freed the same commit goes through and decoding continues exactly."""
    prompt = [5, 6, 7]
    plain = Engine(model, None, EngineConfig(cache=CacheConfig(max_requests=1, max_seq_len=64, flush_length=4)))
    reference = plain.add_request(prompt, SamplingParams(), 8)
    plain.run()
    reference = reference.output

    runner = runner_for(model, flush_length=4, num_state_slots=1)
    holder = runner.cache.allocate_request()
    runner.prefill([holder], [list(range(1, 10))])  # takes the only state slot
    slot = runner.cache.allocate_request()
    tokens = [int(runner.prefill([slot], [prompt])[0].argmax())]
    ctx = None
    while ctx is None:
        hidden, step_ctx = runner.score(StepBatch.decode([slot], [tokens[-1]]))
        next_token = int(model.compute_logits(hidden[:, 0])[0].argmax())
        try:
            runner.cache.commit_all(step_ctx)
            tokens.append(next_token)
        except CacheFullError as error:
            assert "committed-state slots are in use" in str(error)
            ctx = step_ctx
    assert runner.cache.buf_len[slot] == 3 and runner.cache.committed_length(slot) == 3 + len(tokens) - 1
    runner.cache.release_request(holder)
    runner.cache.commit_all(ctx)
    tokens.append(next_token)
    while len(tokens) < 8:
        tokens.append(int(runner.decode([slot], [tokens[-1]])[0].argmax()))
    assert tokens == reference


def test_prompt_longer_than_the_cache_is_refused_before_any_work(model):
    runner = runner_for(model, max_seq_len=16)
    slot = runner.cache.allocate_request()
    with pytest.raises(ValueError, match="raise CacheConfig.max_seq_len"):
        runner.prefill([slot], [list(range(1, 20))])
    assert runner.cache.committed_length(slot) == 0
    runner.prefill([slot], [[1, 2, 3]])  # still usable
    assert runner.cache.committed_length(slot) == 3


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: StepBatch.chains([0], [[]], prefill=True), "at least one token"),
        (lambda: StepBatch.chains([0, 0], [[1], [2]], prefill=True), "appears twice"),
        (lambda: StepBatch([0], torch.zeros(1, 2, dtype=torch.long), torch.tensor([[-1, 0]]), torch.tensor([3])),
         "num_nodes must lie in"),
        (lambda: StepBatch.trees([0], [[1, 2]], [[-1]]), "2 tokens but 1 parents"),
    ],
    ids=["empty", "duplicate-slot", "num-nodes", "parents-length"],
)
def test_malformed_steps_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_cache_config_is_validated():
    with pytest.raises(ValueError, match="flush_length must be >= 1"):
        CacheConfig(flush_length=0)
    assert CacheConfig(max_requests=5).state_slots == 5


def test_state_slots_taken_together_are_zeroed_in_every_layer_or_none_is_taken(model):
    """A step's first folds take their state slots together (one multi-tensor zeroing for every layer): each comes
    zeroed whatever the slot held, and a step that needs more slots than are free takes none of them."""
    runner = runner_for(model, max_requests=5, num_state_slots=3)
    cache = runner.cache
    for layer in cache.linear:
        layer.state.fill_(float("nan"))  # whatever earlier requests left there
    slots = [cache.allocate_request() for _ in range(5)]
    cache._take_state_slots(slots[:2])
    taken = [cache.state_slot[s] for s in slots[:2]]
    assert len(set(taken)) == 2 and min(taken) >= 0
    for layer in cache.linear:
        assert all(bool((layer.state[s] == 0).all()) for s in taken)
    cache.release_request(slots[0])  # two state slots free now, three wanted
    with pytest.raises(CacheFullError, match="committed-state slots are in use"):
        cache._take_state_slots(slots[2:])
    assert [cache.state_slot[s] for s in slots[2:]] == [-1, -1, -1] and len(cache._free_states) == 2
