"""EAGLE-3: the inference head (specdec/models/eagle3.py) against the training module it is trained as, training
with `specdec train-drafter` (EAGLE-3 and MTP) on CPU, greedy losslessness through the engine, bad checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from drafters import Eagle3Drafter, MtpDrafter
from specdec.cache.spec import CacheConfig
from specdec.cache.step import StepBatch
from specdec.cli import main as cli_main
from specdec.engine.engine import Engine, EngineConfig
from specdec.models import load_model
from specdec.models.checkpoint import CheckpointError
from specdec.models.eagle3 import load_eagle3
from specdec.speculation import SamplingParams, TreeShape
from specdec.training.eagle3 import Eagle3Trainee, head_config, save_eagle3
from specdec.training.lm import TrainConfig, train_lm
from tests.test_training import QWEN, write_corpus


@pytest.fixture(scope="module")
def trained_target(tmp_path_factory):
    """A tiny Qwen3.5 (with an MTP layer) trained for a few steps on a small corpus, and that corpus."""
    corpus = write_corpus(tmp_path_factory.mktemp("corpus"))
    tokenizer = tmp_path_factory.mktemp("tokenizer")
    assert cli_main(["train-tokenizer", "--data", str(corpus), "--vocab-size", "400", "--out", str(tokenizer)]) == 0
    target = tmp_path_factory.mktemp("target")
    train_lm(QWEN, tokenizer, target, TrainConfig(steps=40, batch_size=8, seq_len=32, lr=1e-2, warmup=5,
                                                 eval_tokens=64), data=corpus, device="cpu")
    return target, corpus


@pytest.fixture(scope="module")
def random_head(trained_target, tmp_path_factory):
    """An untrained EAGLE-3 head for the target (random weights, a draft vocabulary of 200 ids), saved and its
    training module."""
    target_dir, _ = trained_target
    reference = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    hot = torch.randperm(reference.config.vocab_size, generator=gen)[:200].sort().values
    trainee = Eagle3Trainee(head_config(reference.config, 200), hot, reference.get_input_embeddings())
    with torch.no_grad():
        for param in trainee.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * (0.3 if param.ndim > 1 else 0.1) + (param.ndim == 1))
    out = tmp_path_factory.mktemp("eagle3")
    save_eagle3(trainee, out, reference.config)
    with torch.no_grad():  # the weights as saved (bf16); buffers (rotary frequencies) stay fp32
        for param in trainee.parameters():
            param.copy_(param.to(torch.bfloat16).float())
    return out, trainee, reference


def test_inference_head_equals_the_training_module(random_head, trained_target):
    """Rows 0..7 committed, then row 8 (step 0) and its child (step 1 of the unroll): the same outputs."""
    head_dir, trainee, reference = random_head
    target = load_model(trained_target[0], device="cpu", dtype=torch.float32)
    head, layers = load_eagle3(head_dir, target)
    tokens = torch.randint(0, 300, (1, 11), generator=torch.Generator().manual_seed(1))
    features = torch.randn(1, 9, 3 * target.hf_config.hidden_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        positions = torch.arange(9).expand(1, 9)
        cache = []
        step0 = trainee.step(tokens[:, 1:10], trainee.fc(features), positions, cache)
        step1 = trainee.step(tokens[:, 2:11], step0, positions + 1, cache)
        pool = head.make_cache(CacheConfig(max_requests=1, max_seq_len=32))
        slot = pool.allocate_request()
        batch = StepBatch.chains([slot], [tokens[0, 1:9].tolist()], prefill=True)
        ctx = pool.begin_step(batch)
        first = head(batch.tokens, head.project(features[:, :8]), ctx, pool)
        pool.commit_all(ctx)
        batch = StepBatch.trees([slot], [[tokens[0, 9].item()]], [[-1]])
        root = head(batch.tokens, head.project(features[:, 8:9]), pool.begin_step(batch), pool)
        batch = StepBatch.trees([slot], [[tokens[0, 9].item(), tokens[0, 10].item()]], [[-1, 0]])
        pair = head(batch.tokens, torch.cat([head.project(features[:, 8:9]), root], 1), pool.begin_step(batch), pool)
    torch.testing.assert_close(torch.cat([first, root], 1), step0, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pair[:, 1], step1[:, 8], atol=1e-4, rtol=1e-4)
    logits = head.compute_logits(step0)
    assert torch.isinf(logits).sum(-1).eq(target.hf_config.vocab_size - 200).all(), "only draft ids score"
    torch.testing.assert_close(logits[..., trainee.hot_ids], trainee.draft_logits(step0), atol=1e-4, rtol=1e-4)


def test_train_drafter_eagle3_lowers_the_loss_and_drafts_losslessly(trained_target, tmp_path):
    target_dir, corpus = trained_target
    out = tmp_path / "eagle3"
    assert cli_main(["train-drafter", "--target", str(target_dir), "--method", "eagle3", "--out", str(out),
                     "--data", str(corpus), "--steps", "40", "--batch-size", "4", "--seq-len", "24",
                     "--lr", "3e-3", "--draft-vocab-size", "128", "--device", "cpu"]) == 0
    record = json.loads((out / "training.json").read_text())
    assert record["curve"][-1]["loss"] < record["curve"][0]["loss"] - 0.3, record["curve"]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 128
    with safe_open(out / "model.safetensors", framework="pt") as handle:
        names = set(handle.keys())
        assert handle.get_tensor("d2t").dtype == torch.int64 and handle.get_tensor("t2d").sum() == 128
    assert {"fc.weight", "midlayer.hidden_norm.weight", "midlayer.self_attn.q_proj.weight", "lm_head.weight",
            "norm.weight"} <= names and not any("embed" in n for n in names)
    check_lossless(target_dir, lambda model, cache: Eagle3Drafter(model, out, cache))
    assert cli_main(["run", "--target", str(target_dir), "--draft", f"eagle3:{out}", "--prompt", "The river of",
                     "--max-new-tokens", "12", "--device", "cpu"]) == 0


def test_train_drafter_mtp_gives_a_target_without_one_its_trained_layer(trained_target, tmp_path):
    """A target trained without an MTP layer (its tokenizer is the trained target's) gets one in a copy."""
    trained_dir, corpus = trained_target
    target_dir = tmp_path / "no_mtp"
    train_lm({**QWEN, "mtp_layers": 0}, trained_dir, target_dir, TrainConfig(steps=40, batch_size=8, seq_len=32,
                                                                             lr=1e-2, warmup=5, eval_tokens=64),
             data=corpus, device="cpu")
    out = tmp_path / "with_mtp"
    assert cli_main(["train-drafter", "--target", str(target_dir), "--method", "mtp", "--out", str(out),
                     "--data", str(corpus), "--steps", "40", "--batch-size", "4", "--seq-len", "24",
                     "--lr", "1e-2", "--device", "cpu"]) == 0
    record = json.loads((out / "mtp_training.json").read_text())
    assert record["curve"][-1]["mtp_loss"] < record["curve"][0]["mtp_loss"] - 0.5, record["curve"]
    before, after = load_model(target_dir, device="cpu"), load_model(out, device="cpu")
    assert not before.mtp_weights and "fc.weight" in after.mtp_weights
    torch.testing.assert_close(before.lm_head.weight, after.lm_head.weight)  # the target itself is unchanged
    check_lossless(out, MtpDrafter)
    assert cli_main(["run", "--target", str(out), "--draft", "mtp", "--prompt", "def f3(x):", "--max-new-tokens",
                     "12", "--device", "cpu"]) == 0


def check_lossless(target_dir, make_drafter) -> None:
    model = load_model(target_dir, device="cpu")
    prompts = [[5, 9, 14, 5, 9, 14, 5, 9], [3], list(range(20, 45))]
    outputs = []
    for drafter, shape in [(None, TreeShape()), (make_drafter, TreeShape(steps=4)),
                           (make_drafter, TreeShape(steps=3, topk=2, max_tokens=6)),
                           (make_drafter, TreeShape(steps=4, topk=3, max_tokens=10, dynamic=True))]:
        cache = CacheConfig(max_requests=2, max_seq_len=128, flush_length=3)
        engine = Engine(model, drafter(model, cache) if drafter else None, EngineConfig(cache=cache, shape=shape,
                                                                                        speculation="fixed"))
        requests = [engine.add_request(p, SamplingParams(), 48) for p in prompts]
        engine.run()
        outputs.append([r.output for r in requests])
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0] and outputs[3] == outputs[0]


def test_bad_eagle3_checkpoints_fail_clearly(random_head, trained_target, tmp_path):
    head_dir, _, _ = random_head
    target = load_model(trained_target[0], device="cpu")
    with safe_open(head_dir / "model.safetensors", framework="pt") as handle:
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    config = json.loads((head_dir / "config.json").read_text())

    def write(name, tensors, **config_changes):
        directory = tmp_path / name
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps({**config, **config_changes}))
        save_file(tensors, directory / "model.safetensors")
        return directory

    no_d2t = write("no_d2t", {n: t for n, t in tensors.items() if n != "d2t"})
    with pytest.raises(CheckpointError, match="no d2t"):
        load_eagle3(no_d2t, target)
    with pytest.raises(CheckpointError, match="hidden size"):
        load_eagle3(write("wide", tensors, hidden_size=64), target)
    narrow_fc = write("narrow_fc", {**tensors, "fc.weight": tensors["fc.weight"][:, :-3].contiguous()})
    with pytest.raises(CheckpointError, match="fc.weight .* has shape"):
        load_eagle3(narrow_fc, target)
    with pytest.raises(CheckpointError, match="not an EAGLE-3 head"):
        load_eagle3(write("llama", tensors, architectures=["LlamaForCausalLM"]), target)
