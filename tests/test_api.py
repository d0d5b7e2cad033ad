"""The Python API on tiny checkpoints with a tokenizer: text in, text out, drafters by name, streaming, chat,
stop strings, seeds, and bad input refused before any work with the engine still usable."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec import LLM, EngineConfig
from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny, save_tiny_tokenizer

PROMPT = "aa ae ai ao au ay ar aa ae ai"
SHORT = EngineConfig.from_flags(max_seq_len=128, speculation="fixed")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    target, draft, other = (tmp_path_factory.mktemp(name) for name in ("target", "draft", "other"))
    save_tiny(qwen35_text_config(), target, seed=41)
    save_tiny(qwen35_text_config(hidden_size=16), draft, seed=42)
    save_tiny(nemotron_h_config(vocab_size=64), other, seed=43)
    for directory in (target, draft):
        save_tiny_tokenizer(directory)
    return target, draft, other


@pytest.fixture(scope="module")
def plain(checkpoints):
    return LLM(str(checkpoints[0]), config=SHORT)


def test_text_in_text_out_equal_across_drafters(checkpoints, plain):
    target, draft, _ = checkpoints
    reference = plain.generate([PROMPT, "ba be"], max_new_tokens=24)
    assert all(out.text and len(out.token_ids) <= 24 for out in reference)
    # (checkpoint directories as Paths, as well as strings)
    with_draft = LLM(target, draft=draft, config=SHORT).generate([PROMPT, "ba be"], max_new_tokens=24)
    with_ngram = specdec.generate([PROMPT, "ba be"], target=str(target), draft="ngram", config=SHORT,
                                  max_new_tokens=24)
    for a, b, c in zip(reference, with_draft, with_ngram, strict=True):
        assert a.token_ids == b.token_ids == c.token_ids and a.text == b.text == c.text
        assert b.stats.steps <= a.stats.steps and b.stats.mean_accepted_length >= 1


def test_an_llm_beside_another_shares_its_target_and_decodes_alike(checkpoints, plain):
    """LLM.beside: another engine over the same loaded target (its weights and tokenizer, not loaded again), with a
    drafter, pools and policy of its own; greedy output equal to the target's plain decoding; a misspelt drafter
    refused before anything is built; the first LLM untouched and still usable."""
    _, draft, _ = checkpoints
    engine = plain.engine
    reference = plain.generate([PROMPT, "ba be"], max_new_tokens=24)
    adaptive = plain.beside(draft, config=EngineConfig.from_flags(max_seq_len=128, speculation="adaptive"))
    assert adaptive.model is plain.model and adaptive.tokenizer is plain.tokenizer
    assert adaptive.engine is not plain.engine and adaptive.engine.runner is not plain.engine.runner
    assert plain.drafter is None and adaptive.drafter is not None and adaptive.engine.policy is not None
    ngram = adaptive.beside("ngram", config=SHORT)
    assert ngram.model is plain.model and ngram.drafter is not adaptive.drafter and ngram.engine.policy is None
    for llm in (adaptive, ngram):
        outputs = llm.generate([PROMPT, "ba be"], max_new_tokens=24)
        assert [o.token_ids for o in outputs] == [o.token_ids for o in reference]
    assert sum(o.stats.steps for o in ngram.generate([PROMPT], max_new_tokens=24)) >= 1
    with pytest.raises(ValueError, match="ngrm"):
        plain.beside("ngrm")
    assert plain.engine is engine and [o.token_ids for o in plain.generate([PROMPT, "ba be"], max_new_tokens=24)] \
        == [o.token_ids for o in reference]


def test_stream_pieces_add_up_to_the_generated_text(plain):
    expected = plain.generate(PROMPT, max_new_tokens=16)[0].text
    assert "".join(plain.stream(PROMPT, max_new_tokens=16)) == expected


def test_a_stream_closed_early_frees_its_request(plain):
    stream = plain.stream(PROMPT, max_new_tokens=16)
    assert next(stream)
    stream.close()  # the caller stops reading (or Ctrl-C): the request is aborted, its slots freed
    assert plain.engine.scheduler.idle
    assert "".join(plain.stream(PROMPT, max_new_tokens=16)) == plain.generate(PROMPT, max_new_tokens=16)[0].text


def test_chat_template_and_stop_strings(plain):
    chat = plain.generate(PROMPT, max_new_tokens=8, chat=True)[0]
    assert chat.prompt_token_ids == plain.encode("user " + PROMPT + " assistant")
    full = plain.generate(PROMPT, max_new_tokens=24)[0]
    stop_word = full.text.split()[3]
    stopped = plain.generate(PROMPT, max_new_tokens=24, stop=[stop_word])[0]
    assert stopped.finish_reason == "stop" and stop_word not in stopped.text
    assert full.text.startswith(stopped.text)


def test_seeded_sampling_is_reproducible(plain):
    first = plain.generate(PROMPT, max_new_tokens=16, temperature=0.9, top_p=0.9, seed=7)[0]
    again = plain.generate(PROMPT, max_new_tokens=16, temperature=0.9, top_p=0.9, seed=7)[0]
    assert first.token_ids == again.token_ids


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(prompts=""), "the prompt is empty"), (dict(prompts=PROMPT, max_new_tokens=0), "max_new_tokens"),
     (dict(prompts=PROMPT, temperature=-1.0), "temperature"), (dict(prompts=PROMPT, top_p=1.5), "top_p"),
     (dict(prompts=[PROMPT, ""], max_new_tokens=8), "the prompt is empty")],
    ids=["empty-prompt", "no-new-tokens", "negative-temperature", "top-p", "one-bad-in-a-batch"],
)
def test_bad_generation_input(plain, kwargs, message):
    with pytest.raises(ValueError, match=message):
        plain.generate(**kwargs)
    assert plain.engine.scheduler.idle, "a refused call left work behind"
    assert plain.generate("aa", max_new_tokens=2)[0].token_ids  # still usable


def test_bad_models(checkpoints):
    target, _, other = checkpoints
    with pytest.raises(ValueError, match="unknown model 'llama-9'"):
        LLM("llama-9")
    with pytest.raises(ValueError, match="vocabulary"):
        LLM(str(target), draft=str(other), config=SHORT)
    # devices: a name torch does not know, one it knows but specdec does not run on (both before any loading)
    with pytest.raises(ValueError, match="unknown device 'tpu'; use 'cpu', 'cuda' or 'cuda:N'"):
        LLM(target, device="tpu")
    with pytest.raises(ValueError, match="'meta': specdec runs on the CPU or a CUDA GPU"):
        LLM(target, device="meta")
    with pytest.raises(ValueError, match="state_memory_gb must be > 0"):
        LLM(target, state_memory_gb=-1)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [(dict(prompts=5), TypeError, "prompts must be a str, a list of int token ids"),
     (dict(prompts=b"aa ae"), TypeError, "got bytes"),
     (dict(prompts=["aa", 7]), TypeError, r"prompts\[1\]: a prompt is a str or a list of int token ids, got int"),
     (dict(prompts=[[1.5, 2.0]]), TypeError, "token ids must be ints, got 1.5"),
     (dict(prompts=[1, "a"]), TypeError, "token ids must be ints, got 'a'"),
     (dict(prompts=[True, 2]), TypeError, "token ids must be ints, got True"),
     (dict(prompts=PROMPT, max_new_tokens=1.5), TypeError, "max_new_tokens must be an int, got 1.5"),
     (dict(prompts=PROMPT, temperature="hot"), TypeError, "temperature must be a number, got 'hot'"),
     (dict(prompts=PROMPT, top_k=2.0), TypeError, "top_k must be an int"),
     (dict(prompts=PROMPT, seed="7"), TypeError, "seed must be an int or None"),
     (dict(prompts=PROMPT, stop=[1]), TypeError, "stop strings must be str"),
     (dict(prompts=PROMPT, stop=""), ValueError, "a stop string is empty"),
     (dict(prompts=[]), ValueError, "no prompts given")],
    ids=["int", "bytes", "int-in-list", "float-ids", "str-in-ids", "bool-ids", "float-max-new-tokens",
         "str-temperature", "float-top-k", "str-seed", "int-stop", "empty-stop", "no-prompts"],
)
def test_generate_argument_types(plain, kwargs, error, message):
    with pytest.raises(error, match=message):
        plain.generate(**kwargs)
    assert plain.engine.scheduler.idle


def test_one_stop_string_is_not_split_into_characters(plain):
    full = plain.generate(PROMPT, max_new_tokens=24)[0]
    stop_word = full.text.split()[3]
    as_string = plain.generate(PROMPT, max_new_tokens=24, stop=stop_word)[0]
    as_list = plain.generate(PROMPT, max_new_tokens=24, stop=[stop_word])[0]
    assert as_string.text == as_list.text and as_string.finish_reason == "stop"
    assert len(as_string.text) > len(stop_word[0])  # not cut at the word's first character


def test_token_id_prompts_as_ints_lists_and_tensors(plain):
    ids = plain.encode(PROMPT)
    by_list = plain.generate(ids, max_new_tokens=6)[0].token_ids
    assert plain.generate([ids], max_new_tokens=6)[0].token_ids == by_list
    assert plain.generate(torch.tensor(ids), max_new_tokens=6)[0].token_ids == by_list


def test_generate_each_yields_every_output_once_and_aborts_the_rest_when_closed(plain):
    prompts = [PROMPT, "ba be", "aa"]
    expected = plain.generate(prompts, max_new_tokens=12)
    seen = dict(plain.generate_each(prompts, max_new_tokens=12))
    assert sorted(seen) == [0, 1, 2]
    assert [seen[i].token_ids for i in range(3)] == [out.token_ids for out in expected]
    each = plain.generate_each(prompts, max_new_tokens=12)
    next(each)
    each.close()  # the caller stops early (or is interrupted): the others are aborted
    assert plain.engine.scheduler.idle
