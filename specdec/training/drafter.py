"""`specdec train-drafter`: train a draft head for a target checkpoint on the corpus, the target run on the fly.

- eagle3: an EAGLE-3 head (specdec/training/eagle3.py) saved in the SpecForge / EAGLE-3 format to `out`;
- mtp: the target's MTP layer (specdec/training/mtp.py) with the target frozen; `out` gets a copy of the target
  checkpoint with the trained `mtp.*` tensors (replacing any it had).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specdec.models.eagle3 import default_feature_layers
from specdec.training.corpus import CORPUS_DIR, read_corpus
from specdec.training.eagle3 import (
    TTT_STEPS,
    Eagle3Trainee,
    chain_length_estimate,
    draft_vocabulary,
    head_config,
    save_eagle3,
    ttt_loss,
)
from specdec.training.lm import TrainConfig, _autocast, random_windows, run_steps, token_stream
from specdec.training.mtp import mtp_head_for, mtp_loss
from specdec.training.mtp_checkpoint import read_mtp_tensors, write_mtp_tensors

METHODS = ("eagle3", "mtp")


def load_frozen_target(target: Path | str, device: str):
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def capture_layers(model, layers: tuple[int, ...]) -> dict[int, torch.Tensor]:
    """Forward hooks keeping the outputs of decoder layers `layers` (0-based) of the last forward."""
    captured: dict[int, torch.Tensor] = {}
    decoder_layers = model.base_model.layers
    for index in set(layers):
        def keep(_module, _inputs, output, index=index):
            captured[index] = output[0] if isinstance(output, tuple) else output
        decoder_layers[index].register_forward_hook(keep)
    return captured


def train_drafter(target: Path | str, method: str, out: Path | str, cfg: TrainConfig, data: Path | str | None = None,
                  device: str = "cuda", draft_vocab_size: int = 2048) -> dict:
    if method not in METHODS:
        raise ValueError(f"unknown drafter training method {method!r}; choose one of {list(METHODS)}")
    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(target)
    model = load_frozen_target(target, device)
    stream = token_stream(tokenizer, [f.train for f in read_corpus(data or CORPUS_DIR)])
    if method == "eagle3":
        return _train_eagle3(model, stream, Path(out), cfg, device, draft_vocab_size)
    return _train_mtp(model, Path(target), stream, Path(out), cfg, device)


def _optimizer(params, cfg: TrainConfig, device: str):
    return torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0, fused=device.startswith("cuda"))


def _train_eagle3(model, stream, out: Path, cfg: TrainConfig, device: str, draft_vocab_size: int) -> dict:
    config = model.config
    layers = default_feature_layers(config.num_hidden_layers)
    hot = draft_vocabulary(stream, config.vocab_size, draft_vocab_size).to(device)
    head = Eagle3Trainee(head_config(config, hot.numel()), hot, model.get_input_embeddings()).to(device)
    with torch.no_grad():  # start the draft head from the target's rows of the draft vocabulary
        head.lm_head.weight.copy_(model.get_output_embeddings().weight[hot].float())
    captured = capture_layers(model, layers)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = _optimizer(params, cfg, device)
    generator = torch.Generator().manual_seed(cfg.seed)

    def step_loss():
        window = random_windows(stream, cfg.batch_size, cfg.seq_len + TTT_STEPS, generator).to(device)
        with torch.no_grad(), _autocast(device):
            logits = model(input_ids=window).logits
        features = torch.cat([captured[i][:, :cfg.seq_len] for i in layers], dim=-1).float()
        with _autocast(device):
            loss, accuracy = ttt_loss(head, features, window, logits, TTT_STEPS)
        return loss, {"loss": loss.detach(), "accuracy": accuracy,
                      "chain_length_estimate": chain_length_estimate(accuracy[:4])}

    started = time.time()
    curve, cfg = run_steps(cfg, "train eagle3", optimizer, params, step_loss)
    record = {"method": "eagle3", "feature_layers": list(layers), "draft_vocab_size": hot.numel(),
              "config": asdict(cfg), "seconds": time.time() - started, "curve": curve}
    save_eagle3(head, out, config, record)
    return record


def _train_mtp(model, target: Path, stream, out: Path, cfg: TrainConfig, device: str) -> dict:
    head = mtp_head_for(model).to(device)
    existing = read_mtp_tensors(target)
    if existing:
        head.load_state_dict({name.removeprefix("mtp."): t for name, t in existing.items()})
    params = list(head.parameters())
    optimizer = _optimizer(params, cfg, device)
    generator = torch.Generator().manual_seed(cfg.seed)

    def step_loss():
        window = random_windows(stream, cfg.batch_size, cfg.seq_len + 2, generator).to(device)
        with torch.no_grad(), _autocast(device):
            hidden = model.base_model(input_ids=window[:, :cfg.seq_len]).last_hidden_state
        with _autocast(device):
            loss = mtp_loss(head, model, hidden, window)
        return loss, {"mtp_loss": loss.detach()}

    started = time.time()
    curve, cfg = run_steps(cfg, "train mtp", optimizer, params, step_loss)
    record = {"method": "mtp", "config": asdict(cfg), "seconds": time.time() - started, "curve": curve}
    _save_with_mtp(target, out, head, record)
    return record


def _save_with_mtp(target: Path, out: Path, head, record: dict) -> None:
    """A copy of the target checkpoint whose mtp.* tensors are the trained head's."""
    if out.resolve() != target.resolve():
        shutil.copytree(target, out, dirs_exist_ok=True)
    write_mtp_tensors(out, head.state_dict(), head.config_fields())
    (out / "mtp_training.json").write_text(json.dumps(record, indent=1))
