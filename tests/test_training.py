"""Training the shipped models' kind on CPU at toy sizes: the corpus split, the tokenizer, and `specdec train`
(loss goes down; the checkpoint, MTP layer included, loads in our loader and in transformers, and they agree)."""

from __future__ import annotations

import gzip
import json
import lzma

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.cli import main as cli_main
from specdec.training.corpus import IM_END, IM_START, as_chat, read_corpus, split_text
from specdec.training.lm import TrainConfig, build_model, train_lm
from specdec.training.mtp import MtpHead, mtp_hidden
from specdec.training.tokenizer import train_tokenizer
from tests.test_loading import our_prefill_logits

PROSE = "\n".join(f"The {w} of line {i} goes on, and the {w} goes home at {i % 24} o'clock."
                  for i, w in enumerate(["river", "king", "garden", "lamp", "letter"] * 60))
CODE = "\n".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(150))
WIKI = "\n\n".join(f"Topic {i}\nTopic {i} is a thing that was made in {1900 + i} by people." for i in range(120))

QWEN = {"model_type": "qwen3_5_text", "mtp_layers": 1, "config": dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1,
    head_dim=16, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
    tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1],
                                               "mrope_interleaved": True})}
NEMOTRON = {"model_type": "nemotron_h", "mtp_layers": 1, "config": dict(
    hidden_size=32, intermediate_size=64, layers_block_type=["linear_attention", "mlp", "full_attention", "moe"],
    mamba_num_heads=2, mamba_head_dim=16, n_groups=1, ssm_state_size=16, conv_kernel=4, num_attention_heads=2,
    num_key_value_heads=1, head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
    moe_shared_expert_intermediate_size=32, tie_word_embeddings=False, time_step_min=1e-9)}


def write_corpus(directory):
    """Prose as plain text, code xz-compressed (as the shipped corpus) and Wikipedia-style blocks gzip-compressed:
    every kind of file the reader takes."""
    (directory / "prose.txt").write_text(PROSE)
    with lzma.open(directory / "code.txt.xz", "wt") as handle:
        handle.write(CODE)
    with gzip.open(directory / "wiki_en.txt.gz", "wt") as handle:
        handle.write(WIKI)
    return directory


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def tokenizer_dir(corpus, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tokenizer")
    assert cli_main(["train-tokenizer", "--data", str(corpus), "--vocab-size", "400", "--out", str(directory)]) == 0
    return directory


def test_held_out_text_is_the_tail_cut_at_a_line():
    text = "".join(f"line {i}\n" for i in range(100))
    train, held_out = split_text(text, 0.1)
    assert train + held_out == text and held_out.startswith("line 9") and train.endswith("\n")
    assert 0.05 < len(held_out) / len(text) < 0.15


def test_wikipedia_blocks_become_chat_exchanges(corpus):
    chat = as_chat("Alpha\nAlpha is a letter.\n\nBeta\nBeta is another.\n\nGamma\nGamma too.")
    assert chat.startswith(f"{IM_START}user\nTell me about Alpha.{IM_END}\n{IM_START}assistant\nAlpha is a letter."
                           f"{IM_END}")
    assert "\n\nBeta\nBeta is another." in chat and "Tell me about Gamma." in chat
    files = {f.name: f for f in read_corpus(corpus)}
    assert set(files) == {"prose", "code", "wiki_en"}
    assert IM_START in files["wiki_en"].train and IM_START not in files["prose"].train
    assert files["code"].held_out and CODE.startswith(files["code"].train)


def test_empty_corpus_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no \\*.txt"):
        read_corpus(tmp_path)


def test_tokenizer_round_trips_and_knows_the_chat_template(tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert 256 + 3 < len(tokenizer) <= 400, "bytes + specials + merges, as many as the tiny corpus allows"
    for text in ["The river of line 12 goes home.", "def f3(x):\n    return x * 3 + 3\n", "naïve café 2026 ✓"]:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert tokenizer.decode(ids) == text
    assert tokenizer("2026", add_special_tokens=False)["input_ids"] == [tokenizer.convert_tokens_to_ids(d)
                                                                         for d in "2026"], "digits one by one"
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                         add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids(IM_START) and tokenizer.convert_tokens_to_ids(IM_END) in ids
    assert tokenizer.decode(ids).endswith(f"{IM_START}assistant\n")


def test_too_small_a_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["abc"], vocab_size=100)


@pytest.mark.parametrize("preset", [QWEN, NEMOTRON], ids=["qwen3_5-with-mtp", "nemotron_h-with-mtp"])
def test_training_lowers_the_loss_and_saves_a_checkpoint_both_loaders_read(preset, corpus, tokenizer_dir, tmp_path):
    cfg = TrainConfig(steps=60, batch_size=8, seq_len=32, lr=1e-2, warmup=5, eval_tokens=256)
    record = train_lm(preset, tokenizer_dir, tmp_path, cfg, data=corpus, device="cpu")
    curve = record["curve"]
    assert curve[-1]["loss"] < curve[0]["loss"] - 0.5, curve
    if preset["mtp_layers"]:
        assert curve[-1]["mtp_loss"] < curve[0]["mtp_loss"] - 0.5, curve
    assert set(record["held_out_perplexity"]) == {"prose", "code", "wiki_en", "all"}
    assert json.loads((tmp_path / "training.json").read_text())["final_loss"] == record["final_loss"]

    names = set()
    for file in tmp_path.glob("*.safetensors"):
        with safe_open(file, framework="pt") as handle:
            names |= set(handle.keys())
            assert all(handle.get_tensor(name).dtype == torch.bfloat16 for name in handle.keys()
                       if not name.endswith("e_score_correction_bias"))
    mtp = {name for name in names if name.startswith("mtp.")}
    if preset["model_type"] == "qwen3_5_text":
        assert {"mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight"} <= mtp
    else:  # Nemotron-3's layout: fusion on the first block, the final norm on the last
        assert {"mtp.layers.0.eh_proj.weight", "mtp.layers.0.enorm.weight", "mtp.layers.0.mixer.q_proj.weight",
                "mtp.layers.1.mixer.gate.weight", "mtp.layers.1.final_layernorm.weight"} <= mtp

    prompt = AutoTokenizer.from_pretrained(tmp_path)("The river of line", add_special_tokens=False)["input_ids"]
    ours = our_prefill_logits(tmp_path, prompt, dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = reference(torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(ours, theirs, atol=2e-4, rtol=2e-4)


def test_mtp_layer_is_causal_and_named_as_in_qwen35_checkpoints(tokenizer_dir):
    model = build_model(QWEN, AutoTokenizer.from_pretrained(tokenizer_dir)).eval()
    from transformers.models.qwen3_5 import modeling_qwen3_5

    assert not hasattr(modeling_qwen3_5.torch_chunk_gated_delta_rule, "__wrapped__"), \
        "training must run transformers' torch delta rule, never the kernel a wrapper picked at import"
    mtp = MtpHead(model).eval()
    assert {"fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight",
            "layers.0.self_attn.q_norm.weight", "layers.0.mlp.down_proj.weight"} <= set(mtp.state_dict())
    assert mtp.fc.weight.shape == (32, 64)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 9, 32, generator=gen)
    tokens = torch.randint(0, 300, (2, 9), generator=gen)
    changed = tokens.clone()
    changed[:, 5] = (changed[:, 5] + 1) % 300
    with torch.no_grad():
        before, after = mtp_hidden(mtp, model, hidden, tokens), mtp_hidden(mtp, model, hidden, changed)
    torch.testing.assert_close(before[:, :5], after[:, :5])
    assert (before[:, 5:] - after[:, 5:]).abs().amax(-1).min() > 0, "rows from 5 on see token 5"


def test_a_time_budget_cuts_the_steps(corpus, tokenizer_dir, tmp_path):
    cfg = TrainConfig(steps=100000, batch_size=2, seq_len=16, warmup=2, eval_tokens=64, max_minutes=0.05)
    record = train_lm(NEMOTRON, tokenizer_dir, tmp_path, cfg, data=corpus, device="cpu")
    assert 6 < record["config"]["steps"] < 100000 and record["curve"][-1]["step"] == record["config"]["steps"] - 1
    assert record["seconds"] < 20


def test_a_time_budget_spent_before_a_refit_stops_at_the_steps_run(monkeypatch):
    """A refit that finds the budget already spent (a slow machine) stops after the step it ran: the config says
    the steps that ran and the curve ends at the last of them (it once said one fewer)."""
    from specdec.training import lm

    clock = iter(range(0, 10**6, 30))  # 30 s per call of time.time(): over budget by the probe step
    monkeypatch.setattr(lm.time, "time", lambda: next(clock))
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    ran = []

    def step_loss():
        ran.append(1)
        return (weight - 1).pow(2).sum(), {}

    cfg = lm.TrainConfig(steps=1000, warmup=1, max_minutes=1.0)
    curve, cfg = lm.run_steps(cfg, "test", optimizer, [weight], step_loss)
    assert cfg.steps == len(ran) == lm.PROBE_STEPS + 1
    assert curve[-1]["step"] == cfg.steps - 1


def test_unknown_preset_names_the_known_ones(tokenizer_dir, tmp_path):
    with pytest.raises(ValueError, match="qwen3.5-tiny"):
        train_lm("qwen9", tokenizer_dir, tmp_path, TrainConfig(steps=1), device="cpu")
