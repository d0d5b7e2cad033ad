"""Training an EAGLE-3 head for a target (`specdec train-drafter --method eagle3`), as SpecForge does: the target's
low / mid / high layer outputs and its logits generated on the fly, a training-time-test unroll of TTT_STEPS steps
(every step feeds the ground-truth next token and the head's own previous hidden), soft cross-entropy against the
target's distribution renormalised over the draft vocabulary, step k weighted STEP_DECAY ** k. The head is saved in
the SpecForge / EAGLE-3 checkpoint format that specdec/models/eagle3.py, SGLang and vLLM load.

Inside the unroll, row t of step k attends to the step-0 keys of rows <= t and to its own keys of steps 1..k
(what the rows see when drafting: the context, then their own draft ancestors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import LlamaConfig

from specdec.models.eagle3 import ARCHITECTURES, Eagle3Layer
from specdec.models.layers import RMSNorm, RotaryEmbedding, apply_rotary

TTT_STEPS = 7
STEP_DECAY = 0.8


class Eagle3Attention(nn.Module):
    """The midlayer's attention over the unroll's per-step keys (the inference one reads the KVBuffer cache)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = (config.num_attention_heads, config.num_key_value_heads,
                                                           config.head_dim)
        self.q_proj = nn.Linear(2 * hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, rotary, cache: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """x [B, T, 2H] of one unroll step; cache: the (key, value) [B, T, Hkv, D] of the earlier steps, to which
        this step's are appended. -> [B, T, H]."""
        B, T = x.shape[:2]
        cos, sin = rotary
        query = apply_rotary(self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim)), cos, sin)
        key = apply_rotary(self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim)), cos, sin)
        cache.append((key, self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))))
        groups = self.num_heads // self.num_kv_heads
        keys = [k.repeat_interleave(groups, dim=2) for k, _ in cache]     # [B, T, Hq, D] each
        values = [v.repeat_interleave(groups, dim=2) for _, v in cache]
        scale = self.head_dim**-0.5
        # step-0 keys: causal over rows; later steps: the row's own key only (the diagonal)
        first = torch.einsum("bthd,bshd->bhts", query, keys[0]) * scale
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        first = first.masked_fill(~causal, float("-inf"))
        diagonal = [(query * k).sum(-1).transpose(1, 2)[..., None] * scale for k in keys[1:]]  # [B, Hq, T, 1]
        weights = torch.softmax(torch.cat([first, *diagonal], dim=-1).float(), dim=-1).to(query.dtype)
        out = torch.einsum("bhts,bshd->bthd", weights[..., :T], values[0])
        for j, value in enumerate(values[1:]):
            out = out + weights[..., T + j].transpose(1, 2)[..., None] * value
        return self.o_proj(out.flatten(-2))


class Eagle3Trainee(nn.Module):
    """The head's parameters under the checkpoint's names; the embedding is the target's (frozen, not saved)."""

    def __init__(self, config: LlamaConfig, hot_ids: torch.Tensor, embed: nn.Embedding):
        super().__init__()
        self.config = config
        self.fc = nn.Linear(3 * config.hidden_size, config.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(config, Eagle3Attention(config))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, hot_ids.numel(), bias=False)
        self.register_buffer("hot_ids", hot_ids)
        self.rotary_emb = RotaryEmbedding(config, config.head_dim)
        self._embed = (embed,)

    def step(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        """One unroll step: tokens [B, T], hidden [B, T, H] (fc of the target features, or the previous step's
        output), positions [B, T] -> the new hidden [B, T, H] (before `norm`)."""
        layer = self.midlayer
        embeds = self._embed[0](tokens)
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden)], dim=-1)
        h = hidden + layer.self_attn(x, self.rotary_emb(positions, x.dtype), cache)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).float()


def ttt_loss(head: Eagle3Trainee, features: torch.Tensor, tokens: torch.Tensor, target_logits: torch.Tensor,
             steps: int = TTT_STEPS) -> tuple[torch.Tensor, list[float]]:
    """features [B, T, 3H] of positions 0..T-1; tokens [B, T + steps] and target_logits [B, T + steps, V] of
    positions 0..T+steps-1. Row t at step k reads token t + 1 + k and learns the target's distribution at
    position t + 1 + k. -> (weighted loss, per-step accuracy of the draft's top token against the target's)."""
    B, T = features.shape[:2]
    hidden = head.fc(features)
    positions = torch.arange(T, device=features.device).expand(B, T)
    cache, total, accuracy = [], 0.0, []
    for k in range(steps):
        hidden = head.step(tokens[:, 1 + k:T + 1 + k], hidden, positions + k, cache)
        logits = head.draft_logits(hidden)                                       # [B, T, Vd]
        target = target_logits[:, 1 + k:T + 1 + k].float()                       # [B, T, V]
        in_vocab = torch.zeros(target.shape[-1], dtype=torch.bool, device=target.device)
        in_vocab[head.hot_ids] = True
        top = target.argmax(-1)
        mask = in_vocab[top].float()                                             # target's top token draftable
        target_p = torch.softmax(target[..., head.hot_ids], dim=-1)
        loss = -(target_p * torch.log_softmax(logits, dim=-1)).sum(-1)
        total = total + STEP_DECAY**k * (loss * mask).mean()
        accuracy.append(((head.hot_ids[logits.argmax(-1)] == top).float() * mask).sum().item()
                        / max(mask.sum().item(), 1))
    return total, accuracy


def draft_vocabulary(stream: torch.Tensor, vocab_size: int, draft_vocab_size: int) -> torch.Tensor:
    """The draft_vocab_size most frequent token ids of the training stream, ascending (ids never seen fill up
    from 0) -> [Vd] int64."""
    counts = torch.bincount(stream, minlength=vocab_size).float()
    counts += torch.linspace(1e-3, 0, vocab_size)  # ties (and unseen ids) by ascending id
    return counts.topk(min(draft_vocab_size, vocab_size)).indices.sort().values


def head_config(target_config, draft_vocab_size: int) -> LlamaConfig:
    """One decoder layer at the target's hidden size, with the target's attention head layout."""
    heads = target_config.num_attention_heads
    return LlamaConfig(
        hidden_size=target_config.hidden_size, intermediate_size=target_config.intermediate_size,
        num_attention_heads=heads, num_key_value_heads=target_config.num_key_value_heads,
        head_dim=getattr(target_config, "head_dim", None) or target_config.hidden_size // heads,
        num_hidden_layers=1, vocab_size=target_config.vocab_size, rms_norm_eps=1e-6, hidden_act="silu",
        max_position_embeddings=target_config.max_position_embeddings, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )


def save_eagle3(head: Eagle3Trainee, out: Path | str, target_config, record: dict | None = None) -> None:
    """config.json and model.safetensors in the SpecForge / EAGLE-3 layout (bf16 weights, d2t int64, t2d bool)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    config = head.config.to_dict()
    vocab, hot = target_config.vocab_size, head.hot_ids.cpu()
    config.update(architectures=[ARCHITECTURES[0]], draft_vocab_size=hot.numel(), torch_dtype="bfloat16")
    (out / "config.json").write_text(json.dumps(config, indent=1))
    tensors = {name: tensor.detach().to(torch.bfloat16).cpu().contiguous()
               for name, tensor in head.state_dict().items() if name != "hot_ids"}
    tensors["d2t"] = hot - torch.arange(hot.numel())
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[hot] = True
    tensors["t2d"] = t2d
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    if record is not None:
        (out / "training.json").write_text(json.dumps(record, indent=1))


def chain_length_estimate(accuracy: list[float]) -> float:
    """1 + a1 + a1 a2 + ...: the accepted length (incl. bonus) a chain of len(accuracy) drafts would reach if each
    step's agreement with the target's top token held independently; a quick read of training, not a measurement."""
    length, product = 1.0, 1.0
    for value in accuracy:
        product *= value
        length += product
    return length
