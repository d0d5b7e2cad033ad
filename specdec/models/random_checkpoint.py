"""Random weights in the real Hugging Face layout: checkpoints written by transformers' own model classes (tests and
examples at tiny sizes: the files are what save_pretrained writes for a real model, so they go through the same
loader), and `random:NAME` targets at real model shapes for benchmarks, whose weights are drawn on the device where
the model is built (loading.random_model) instead of written to disk and read back: the full 52-layer Nemotron-3-Nano
and the 35B-A3B Qwen3.5 would not fit the benchmark machine's disk.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from transformers import (
    NemotronHForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
)

TRANSFORMERS_CLASSES = {
    "qwen3_5_text": Qwen3_5ForCausalLM,
    "qwen3_5_moe_text": Qwen3_5MoeForCausalLM,
    "qwen3_5": Qwen3_5ForConditionalGeneration,
    "qwen3_5_moe": Qwen3_5MoeForConditionalGeneration,
    "nemotron_h": NemotronHForCausalLM,
}


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Weights giving unit-scale activations, so logits are peaked and greedy decoding has clear winners; norms and
    gates away from their identity initialisation, so a misplaced weight shows; log decays from mild to strong."""
    device = next(model.parameters()).device
    generator = torch.Generator(device).manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, device=device)
            if name.endswith("A_log"):  # A in [0.05, 12]
                param.copy_(torch.empty(param.shape, device=device).uniform_(math.log(0.05), math.log(12.0),
                                                                             generator=generator))
            elif name.endswith(("dt_bias", ".D")):
                param.copy_(0.5 * noise)
            elif param.ndim == 1:  # norm weights
                param.add_(0.2 * noise)
            elif "embed" in name:
                param.copy_(noise)
            else:
                param.copy_(noise / math.sqrt(param.shape[-1]))
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.1 * torch.randn(buffer.shape, generator=generator, device=device))


def save_random_checkpoint(config, directory: str | Path, seed: int = 0, dtype: torch.dtype | None = None,
                           device: str | torch.device = "cpu", **save_kwargs) -> torch.nn.Module:
    """Build transformers' model for `config` on `device`, randomise it, save_pretrained it into `directory` (in
    `dtype` when given); return it (eval). The weights depend on the seed and on the device's random generator.

    save_kwargs go to save_pretrained (e.g. max_shard_size="20KB" for a sharded checkpoint)."""
    if config.model_type not in TRANSFORMERS_CLASSES:
        raise ValueError(f"no random checkpoint for model_type {config.model_type!r}; "
                         f"supported: {sorted(TRANSFORMERS_CLASSES)}")
    torch.manual_seed(seed)
    with torch.device(device):
        model = TRANSFORMERS_CLASSES[config.model_type](config).eval()
    randomize(model, seed)
    if dtype is not None:
        model.to(dtype)
    model.save_pretrained(directory, **save_kwargs)
    return model


def random_target(config, directory: str | Path, seed: int = 0) -> Path:
    """A directory that load_model builds with random weights drawn on the device (loading.random_model): config.json
    and the seed, no weights, so a model of any size costs nothing on disk and nothing to read."""
    from .loading import RANDOM_WEIGHTS

    directory = Path(directory)
    config.save_pretrained(directory)
    (directory / RANDOM_WEIGHTS).write_text(json.dumps({"seed": seed}) + "\n")
    return directory


def random_target_at_shape(name: str, layers: int | None = None) -> Path:
    """`random:NAME[:LAYERS]`: a random-weight model of a real model's shapes (specdec.models.real_shapes), all its
    layers or the first LAYERS: its random_target directory under $SPECDEC_CACHE (default ~/.cache/specdec),
    written once (a few KB). The weights are drawn where the model is loaded, in the dtype it is loaded in."""
    import os

    from specdec.models.real_shapes import SHAPES

    if name not in SHAPES:
        raise ValueError(f"no real shapes named {name!r}; known: {', '.join(SHAPES)} (as random:NAME[:LAYERS])")
    make_config, all_layers = SHAPES[name]
    layers = all_layers if layers is None else layers
    if not 1 <= layers <= all_layers:
        raise ValueError(f"random:{name} has 1 to {all_layers} layers, got {layers}")
    root = Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec")) / "random"
    return random_target(make_config(layers), root / f"{name}-{layers}layers")


def transformers_random_model(directory: str | Path, device: str | torch.device, dtype: torch.dtype):
    """transformers' model for a random_target directory, built on `device` in `dtype` and randomised alike (its own
    draw: the outside reference of `specdec bench --hf-reference` times it, and its outputs are not compared)."""
    from transformers import AutoConfig

    from .loading import RANDOM_WEIGHTS

    config = AutoConfig.from_pretrained(directory)
    with torch.device(device):
        model = TRANSFORMERS_CLASSES[config.model_type]._from_config(config, dtype=dtype).eval()
    randomize(model, json.loads((Path(directory) / RANDOM_WEIGHTS).read_text())["seed"])
    return model


def save_word_tokenizer(directory: str | Path, vocab_size: int) -> None:
    """A word-level tokenizer over `vocab_size` two-letter words ("aa", "ae", ...; id 0 unknown, id 1 the end of
    sequence) with a chat template, saved as transformers saves any fast tokenizer: text in and out for random
    checkpoints."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["<unk>", "<eos>"] + [a + b for a in letters for b in letters][: vocab_size - 2]
    if len(words) < vocab_size:
        raise ValueError(f"the word tokenizer has at most {len(words)} tokens, asked for {vocab_size}")
    backend = Tokenizer(models.WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>")
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}assistant {% endif %}"
    )
    tokenizer.save_pretrained(directory)
