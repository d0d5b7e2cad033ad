"""Training the shipped language models (`specdec train`): a preset from configs/shipped_models.json built with
transformers' own model classes, trained on the corpus with next-token cross-entropy (plus the MTP layer's loss
for presets that have one), saved in the Hugging Face layout in bf16 shards of at most MAX_SHARD_SIZE, with
the tokenizer and a generation_config beside the weights."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import AutoTokenizer, GenerationConfig, NemotronHConfig, PreTrainedTokenizerBase, Qwen3_5TextConfig

from configs import config_file
from specdec.models.random_checkpoint import TRANSFORMERS_CLASSES
from specdec.training.corpus import ENDOFTEXT, IM_END, CorpusFile, read_corpus, text_chunks
from specdec.training.mtp_checkpoint import write_mtp_tensors

PRESETS_FILE = config_file("shipped_models.json")
CONFIG_CLASSES = {"qwen3_5_text": Qwen3_5TextConfig, "nemotron_h": NemotronHConfig}
MAX_SHARD_SIZE = "12MB"  # every shipped file stays under 16 MiB


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 3000
    batch_size: int = 64
    seq_len: int = 512
    lr: float = 3e-3
    min_lr_ratio: float = 0.1        # cosine decay to lr * min_lr_ratio
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    mtp_weight: float = 0.3          # the MTP layer's loss next to the main one (DeepSeek-V3's first phase)
    eval_tokens: int = 2**17         # held-out tokens per corpus file for perplexity
    seed: int = 0
    max_minutes: float | None = None  # fewer steps if `steps` would take longer (timed over the first steps)

    def __post_init__(self):
        for name in ("steps", "batch_size", "seq_len", "eval_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.max_minutes is not None and not self.max_minutes > 0:
            raise ValueError(f"max-minutes must be > 0, got {self.max_minutes}")


def presets() -> dict[str, dict]:
    return json.loads(PRESETS_FILE.read_text())


def resolve_preset(preset: str | dict) -> dict:
    """A preset by name from configs/shipped_models.json, or given as a dict of the same form."""
    if isinstance(preset, dict):
        return preset
    table = presets()
    if preset not in table:
        raise ValueError(f"unknown preset {preset!r}; configs/shipped_models.json has {sorted(table)}")
    return table[preset]


def build_model(preset: dict, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    """transformers' model for a preset, its vocabulary and special ids taken from the tokenizer."""
    if preset["model_type"] not in CONFIG_CLASSES:
        raise ValueError(f"presets can build {sorted(CONFIG_CLASSES)}, got model_type {preset['model_type']!r}")
    ids = dict(eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
               pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
               bos_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT))
    config = CONFIG_CLASSES[preset["model_type"]](vocab_size=len(tokenizer), **ids, **preset["config"])
    if preset["model_type"] == "nemotron_h":
        # transformers' chunked Mamba2 scan, the one training runs, clamps dt at time_step_min whatever
        # time_step_limit says; writing that clamp into the config makes every runtime compute the trained function
        config.time_step_limit = (config.time_step_min, float("inf"))
    model = TRANSFORMERS_CLASSES[preset["model_type"]](config)
    use_torch_delta_rule(model)
    return model


def use_torch_delta_rule(model: torch.nn.Module) -> None:
    """Train Gated DeltaNet layers with transformers' torch implementation even where fla is installed: fla-core
    0.6's backward refuses to run on Hopper GPUs with Triton < 3.7.1, which gives wrong gradients there (fla #640).
    transformers binds fla at import when it can: recent releases through a wrapper around the module's function
    (unwrapped here, for this process), older ones as an attribute of each layer."""
    from transformers.models.qwen3_5 import modeling_qwen3_5

    function = modeling_qwen3_5.torch_chunk_gated_delta_rule
    torch_function = getattr(function, "__wrapped__", function)
    modeling_qwen3_5.torch_chunk_gated_delta_rule = torch_function
    for module in model.modules():
        if getattr(module, "chunk_gated_delta_rule", None) is not None:
            module.chunk_gated_delta_rule = torch_function


def token_stream(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> torch.Tensor:
    """[N] int64: the texts tokenized, each followed by <|endoftext|>. Encoded in pieces of lines, as one batch
    (the fast tokenizer spreads a batch over the cores)."""
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    ids: list[int] = []
    for text in texts:
        pieces = list(text_chunks([text], lines_per_chunk=200))
        for encoding in tokenizer.backend_tokenizer.encode_batch(pieces, add_special_tokens=False):
            ids.extend(encoding.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


def random_windows(stream: torch.Tensor, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    """[batch, length] windows of the stream at random offsets."""
    if stream.numel() <= length:
        raise ValueError(f"the corpus has {stream.numel()} tokens, fewer than one window of {length + 1}: "
                         "pass a smaller --seq-len or more text")
    starts = torch.randint(0, stream.numel() - length, (batch,), generator=generator)
    return torch.stack([stream[s:s + length] for s in starts.tolist()])


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to lr * min_lr_ratio."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def held_out_perplexity(model, streams: dict[str, torch.Tensor], seq_len: int, device: str) -> dict[str, float]:
    """Perplexity of each held-out stream in consecutive windows of seq_len (all of it once), and overall."""
    model.eval()
    totals = {}
    for name, stream in streams.items():
        usable = (stream.numel() - 1) // seq_len * seq_len
        inputs = stream[:usable].view(-1, seq_len)
        labels = stream[1:usable + 1].view(-1, seq_len)
        loss_sum = 0.0
        for start in range(0, inputs.shape[0], 16):
            with _autocast(device):
                logits = model(input_ids=inputs[start:start + 16].to(device)).logits.float()
            loss_sum += F.cross_entropy(logits.flatten(0, 1), labels[start:start + 16].flatten().to(device),
                                        reduction="sum").item()
        totals[name] = (loss_sum, usable)
    model.train()
    out = {name: math.exp(loss / count) for name, (loss, count) in totals.items()}
    out["all"] = math.exp(sum(loss for loss, _ in totals.values()) / sum(count for _, count in totals.values()))
    return out


PROBE_STEPS = 6  # steps 1..PROBE_STEPS time a step (step 0 compiles) when TrainConfig.max_minutes is set
REFIT_EVERY = 100  # ... and every REFIT_EVERY steps the remaining steps are fitted again (they can only shrink)


def run_steps(cfg: TrainConfig, desc: str, optimizer, params: list, step_loss) -> tuple[list[dict], TrainConfig]:
    """The optimisation loop shared by the trainers: `step_loss()` -> (loss to minimise, {name: value} to log
    every 50 steps). With cfg.max_minutes, the number of steps (and the learning-rate schedule with it) shrinks
    to what fits. -> (logged points, the config with the steps actually run)."""
    progress = tqdm(total=cfg.steps, desc=desc, unit="step")
    curve, started, step = [], time.time(), 0
    while step < cfg.steps:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, cfg)
        loss, metrics = step_loss()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
        optimizer.step()
        if step == 0:
            timer = time.time()
        elif cfg.max_minutes is not None and (step == PROBE_STEPS or step % REFIT_EVERY == 0):
            # re-timed as it goes: other jobs on the same GPU can slow the steps down after the probe
            per_step = (time.time() - timer) / step
            # (at least the steps run so far, this one included: a budget already spent stops here)
            fits = step + 1 + max(0, int((cfg.max_minutes * 60 - (time.time() - started)) / per_step))
            if fits < cfg.steps:
                cfg = replace(cfg, steps=fits)
                progress.total = fits
        if step % 50 == 0 or step == cfg.steps - 1:
            point = {"step": step, **{k: v.item() if torch.is_tensor(v) else v for k, v in metrics.items()}}
            curve.append(point)
            progress.set_postfix({k: f"{v:.3f}" for k, v in point.items() if isinstance(v, float)})
        progress.update()
        step += 1
    progress.close()
    return curve, cfg


def _autocast(device: str):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.startswith("cuda") else torch.autocast(
        "cpu", enabled=False)


def train_lm(preset_name: str | dict, tokenizer_dir: Path | str, out: Path | str, cfg: TrainConfig,
             data: Path | str | None = None, device: str = "cuda") -> dict:
    """`specdec train`: train a preset on the corpus, save it to `out`, return the run's record (also written to
    out/training.json): loss curve, final training loss, held-out perplexity per corpus file."""
    from specdec.training.corpus import CORPUS_DIR
    from specdec.training.mtp import mtp_head_for, mtp_loss

    torch.manual_seed(cfg.seed)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    files: list[CorpusFile] = read_corpus(data or CORPUS_DIR)
    train = token_stream(tokenizer, [f.train for f in files])
    held_out = {f.name: token_stream(tokenizer, [f.held_out])[:cfg.eval_tokens] for f in files}
    preset = resolve_preset(preset_name)
    model = build_model(preset, tokenizer).to(device).train()
    mtp = mtp_head_for(model).to(device).train() if preset.get("mtp_layers") else None
    params = list(model.parameters()) + (list(mtp.parameters()) if mtp else [])
    decay = [p for p in params if p.ndim >= 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                   {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}],
                                  lr=cfg.lr, betas=(0.9, 0.95), fused=device.startswith("cuda"))
    generator = torch.Generator().manual_seed(cfg.seed)
    name = preset_name if isinstance(preset_name, str) else preset["model_type"]

    def step_loss():
        # one extra token per window for the MTP target (token t + 2 at position t)
        window = random_windows(train, cfg.batch_size, cfg.seq_len + 2, generator).to(device)
        inputs, labels = window[:, :cfg.seq_len], window[:, 1:cfg.seq_len + 1]
        with _autocast(device):
            hidden = model.base_model(input_ids=inputs).last_hidden_state     # [B, S, H], after the final norm
            loss = F.cross_entropy(model.lm_head(hidden).float().flatten(0, 1), labels.flatten())
            if mtp is None:
                return loss, {"loss": loss.detach()}
            extra = mtp_loss(mtp, model, hidden, window)
            return loss + cfg.mtp_weight * extra, {"loss": loss.detach(), "mtp_loss": extra.detach()}

    started = time.time()
    curve, cfg = run_steps(cfg, f"train {name}", optimizer, params, step_loss)
    record = {"preset": name, "parameters": sum(p.numel() for p in params), "train_tokens": train.numel(),
              "config": asdict(cfg), "seconds": time.time() - started, "final_loss": curve[-1]["loss"],
              "curve": curve, "held_out_perplexity": held_out_perplexity(model, held_out, cfg.seq_len, device)}
    save_trained(model, mtp, tokenizer, out, record)
    return record


def save_trained(model, mtp, tokenizer, out: Path | str, record: dict) -> None:
    """The Hugging Face layout in bf16: config.json, shards (the `mtp.*` tensors in one of their own), tokenizer
    files, generation_config.json, and training.json (the run's record)."""
    out = Path(out)
    model = model.to(torch.bfloat16).cpu().eval()
    model.save_pretrained(out, max_shard_size=MAX_SHARD_SIZE)
    if mtp is not None:
        write_mtp_tensors(out, mtp.state_dict(), mtp.config_fields())
    tokenizer.save_pretrained(out)
    eos = [tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
    GenerationConfig(eos_token_id=eos, pad_token_id=eos[1], do_sample=False).save_pretrained(out)
    (out / "training.json").write_text(json.dumps(record, indent=1))
