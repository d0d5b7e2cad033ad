"""The trained models shipped in specdec/checkpoints: within the size limits, read alike by our loader and by
transformers, trained (low perplexity on held-out text, drafters that get accepted), lossless with every drafter,
and `specdec run` with no arguments runs the Qwen3.5 pair."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.api import LLM
from specdec.cli import DEFAULT_PROMPT
from specdec.cli import main as cli_main
from specdec.engine.engine import EngineConfig
from specdec.presets import SHIPPED_DIR, eagle3_head_for, resolve, small_draft_for
from specdec.training.corpus import CORPUS_DIR, read_corpus
from tests.test_loading import our_prefill_logits

LANGUAGE_MODELS = ["qwen3.5-tiny", "qwen3.5-tiny-draft", "nemotron-3-tiny", "nemotron-3-tiny-draft"]
MIB = 2**20


def held_out_text(name: str = "wiki_en", chars: int = 600) -> str:
    """The start of a corpus file's held-out part: text none of the models trained on."""
    return next(f.held_out for f in read_corpus(CORPUS_DIR) if f.name == name)[:chars]


def test_every_file_is_within_the_size_limits():
    files = [path for path in SHIPPED_DIR.rglob("*") if path.is_file()]
    assert {path.parent.name for path in files} == {*LANGUAGE_MODELS, "qwen3.5-tiny-eagle3"}
    assert max(path.stat().st_size for path in files) <= 16 * MIB
    assert sum(path.stat().st_size for path in files) <= 60 * MIB


def test_aliases_name_the_shipped_models():
    assert resolve("qwen3.5") == str(SHIPPED_DIR / "qwen3.5-tiny")
    assert small_draft_for("qwen3.5") == str(SHIPPED_DIR / "qwen3.5-tiny-draft")
    assert small_draft_for(str(SHIPPED_DIR / "nemotron-3-tiny")) == str(SHIPPED_DIR / "nemotron-3-tiny-draft")
    assert small_draft_for("qwen3.5:9b") == "Qwen/Qwen3.5-0.8B"  # hub sizes keep the family's smallest
    assert eagle3_head_for("qwen3.5:tiny") == str(SHIPPED_DIR / "qwen3.5-tiny-eagle3")
    with pytest.raises(ValueError, match="eagle3:PATH"):
        eagle3_head_for("nemotron-3")


@pytest.mark.parametrize("name", LANGUAGE_MODELS)
def test_both_loaders_agree_and_the_model_is_trained(name):
    directory = SHIPPED_DIR / name
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert len(tokenizer) == 8192 and tokenizer.chat_template
    prompt = tokenizer(held_out_text(), add_special_tokens=False)["input_ids"][:48]
    ours = our_prefill_logits(directory, prompt, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = reference(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=2e-4)
    # trained: held-out perplexity far below the vocabulary's 8192 (what uniform guessing gives)
    perplexity = math.exp(F.cross_entropy(theirs[:-1], torch.tensor(prompt[1:])).item())
    assert perplexity < 200, f"{name}: held-out perplexity {perplexity:.0f}"
    record = json.loads((directory / "training.json").read_text())
    assert record["held_out_perplexity"]["all"] < 60 and record["final_loss"] < 3.5


@pytest.fixture(scope="module")
def qwen_prompts() -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_DIR / "qwen3.5-tiny")
    return [tokenizer(held_out_text(name, 300), add_special_tokens=False)["input_ids"][-40:]
            for name in ("wiki_en", "python_stdlib")]


@pytest.fixture(scope="module")
def plain_qwen(qwen_prompts) -> list[list[int]]:
    llm = LLM("qwen3.5", device="cpu", config=EngineConfig.from_flags(max_batch=2, max_seq_len=128,
                                                                      speculation="fixed"))
    return [out.token_ids for out in llm.generate(qwen_prompts, max_new_tokens=24)]


@pytest.mark.parametrize("draft, shape", [
    ("small", {}), ("mtp", {}), ("eagle3", {}),
    ("mtp", dict(topk=4, num_draft_tokens=16, dynamic_tree=True)),
    ("eagle3", dict(topk=4, num_draft_tokens=16, dynamic_tree=True)),
], ids=["draft-model", "mtp", "eagle3", "mtp-dynamic16", "eagle3-dynamic16"])
def test_qwen_drafters_are_lossless_and_accepted(draft, shape, qwen_prompts, plain_qwen):
    llm = LLM("qwen3.5", draft, device="cpu", config=EngineConfig.from_flags(max_batch=2, max_seq_len=128,
                                                                                    speculation="fixed", **shape))
    outputs = llm.generate(qwen_prompts, max_new_tokens=24)
    assert [out.token_ids for out in outputs] == plain_qwen
    steps = sum(len(out.stats.emitted_per_step) for out in outputs)
    mean_accepted = sum(sum(out.stats.emitted_per_step) for out in outputs) / steps
    assert mean_accepted > 1.5, f"{draft}: mean accepted length {mean_accepted:.2f} (untrained drafters give ~1)"


@pytest.mark.parametrize("draft", ["small", "mtp"])
def test_nemotron_drafters_are_lossless(draft):
    tokenizer = AutoTokenizer.from_pretrained(SHIPPED_DIR / "nemotron-3-tiny")
    prompt = tokenizer(held_out_text("kjv", 300), add_special_tokens=False)["input_ids"][-40:]
    config = EngineConfig.from_flags(max_batch=1, max_seq_len=128, speculation="fixed")
    plain = LLM("nemotron-3", device="cpu", config=config).generate(prompt, max_new_tokens=24)
    spec = LLM("nemotron-3", draft, device="cpu", config=config).generate(prompt, max_new_tokens=24)
    assert spec[0].token_ids == plain[0].token_ids
    assert spec[0].stats.mean_accepted_length > 1.5


def test_default_run_needs_no_arguments(capsys):
    assert cli_main(["run", "--max-new-tokens", "24"]) == 0
    out, err = capsys.readouterr()
    assert DEFAULT_PROMPT in err and "mean accepted length" in err
    words = out.split()
    assert len(words) >= 10 and sum(word.strip(".,;:").isalpha() for word in words) >= 0.8 * len(words)
