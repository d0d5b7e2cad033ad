"""An EAGLE-3 draft head in the SpecForge / EAGLE-3 checkpoint format (what SGLang's and vLLM's eagle3 load), over
a KVBuffer cache of its own (attention only):

    config.json: architectures ["LlamaForCausalLMEagle3"], hidden_size H (= the target's), num_hidden_layers 1,
                 draft_vocab_size Vd, vocab_size V (the target's), head_dim, heads, rope, rms_norm_eps
    fc [H, 3 * Ht]                         the target's low / mid / high layer outputs, concatenated, -> H
    midlayer.{input_layernorm, hidden_norm, post_attention_layernorm}   plain RMSNorms (x / rms(x) * w)
    midlayer.self_attn.{q,k,v}_proj [*, 2H], o_proj; midlayer.mlp.{gate,up,down}_proj
    norm, lm_head [Vd, H]; d2t [Vd] int64 (target id = i + d2t[i]); t2d [V] bool (unused here)

A row pairs an H-wide hidden g (fc of the target's features at position p - 1, or the previous draft row's output)
with the token at p, at rotary position p - 1:
    h = g + attn(cat[input_layernorm(embed(x)), hidden_norm(g)]);  h = h + mlp(post_attention_layernorm(h))
h (before `norm`) is the next row's g; lm_head(norm(h)) scores the draft vocabulary. The embedding is the target's.
Feature layers: the outputs (0-based) of eagle_config.eagle_aux_hidden_state_layer_ids, by default
[1, N // 2 - 1, N - 4] of the target's N decoder layers (SpecForge's; SGLang and vLLM take the same tensors).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig

from .base import HybridCausalLM
from .checkpoint import CheckpointError, iter_tensors, read_config, resolve_checkpoint, weight_files
from .layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rotary
from .merged import merge_linears, merged_outputs

ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")


def default_feature_layers(num_layers: int) -> tuple[int, int, int]:
    return (1, num_layers // 2 - 1, num_layers - 4)


class Eagle3Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // self.num_heads
        self.q_proj = nn.Linear(2 * hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * hidden, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)
        self.qkv: torch.Tensor | None = None  # q_proj's, k_proj's and v_proj's merged weight (merge_projections)

    def merge_projections(self) -> None:
        """q_proj, k_proj and v_proj as one GEMM from now on (specdec/models/merged.py)."""
        self.qkv = merge_linears([self.q_proj, self.k_proj, self.v_proj])

    def cache_spec(self):
        from specdec.cache.spec import AttentionLayerSpec

        return AttentionLayerSpec(self.num_kv_heads, self.head_dim)

    def forward(self, x: torch.Tensor, rotary, ctx, cache) -> torch.Tensor:
        """x [B, T, 2H] -> [B, T, H]."""
        q, k, v = merged_outputs(x, self.qkv, [self.q_proj, self.k_proj, self.v_proj])  # (strided rows)
        query = q.unflatten(-1, (self.num_heads, self.head_dim))
        key = k.unflatten(-1, (self.num_kv_heads, self.head_dim))
        value = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        cos, sin = rotary
        query, key = apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)
        out = cache.attention[0].attend(ctx, query, key, value, self.head_dim**-0.5)
        return self.o_proj(out.flatten(-2))


class Eagle3Layer(nn.Module):
    """The midlayer's parameters under the checkpoint's names; `attention` reads the KVBuffer cache here and the
    training-time-test caches in specdec/training/eagle3.py."""

    def __init__(self, config, attention: nn.Module):
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(size, eps)
        self.hidden_norm = RMSNorm(size, eps)
        self.self_attn = attention
        self.post_attention_layernorm = RMSNorm(size, eps)
        self.mlp = GatedMLP(size, config.intermediate_size, config.hidden_act)


class Eagle3Head(HybridCausalLM):
    """forward(tokens, hidden_in, ctx, cache) -> h [B, T, H] (pre-norm); project(features) = fc; compute_logits(h)
    -> fp32 [.., V] over the target's vocabulary, -inf outside the draft vocabulary."""

    def __init__(self, config: LlamaConfig, target: HybridCausalLM):
        super().__init__(config)
        self.draft_vocab = config.draft_vocab_size or config.vocab_size
        target_hidden = getattr(config, "target_hidden_size", None) or config.hidden_size
        self.fc = nn.Linear(3 * target_hidden, config.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(config, Eagle3Attention(config))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, self.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab, dtype=torch.long))
        head_dim = self.midlayer.self_attn.head_dim
        self.rotary_emb = RotaryEmbedding(config, head_dim)
        self.vocab_size = target.hf_config.vocab_size
        self._embed = (target.model.embed_tokens if hasattr(target.model, "embed_tokens")
                       else target.model.embeddings,)  # the target's, shared, not a parameter of the head

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return self.fc(features)

    def forward(self, tokens: torch.Tensor, hidden_in: torch.Tensor, ctx, cache) -> torch.Tensor:
        layer = self.midlayer
        embeds = self._embed[0](tokens)
        hidden_in = hidden_in.to(embeds.dtype)
        x = torch.cat([layer.input_layernorm(embeds), layer.hidden_norm(hidden_in)], dim=-1)
        h = hidden_in + layer.self_attn(x, self.rotary_emb(ctx.positions, x.dtype), ctx, cache)
        return h + layer.mlp(layer.post_attention_layernorm(h))

    @property
    def logits_dtype(self) -> torch.dtype:
        return torch.float32  # (compute_logits scatters the draft vocabulary's fp32 logits into the full one)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        draft = self.lm_head(self.norm(hidden)).float()
        full = draft.new_full((*draft.shape[:-1], self.vocab_size), float("-inf")) if out is None else out.fill_(
            float("-inf"))
        full[..., torch.arange(self.draft_vocab, device=draft.device) + self.d2t] = draft
        return full

    def linear_layers(self) -> list[nn.Module]:
        return []

    def attention_layers(self) -> list[nn.Module]:
        return [self.midlayer.self_attn]


def load_eagle3(name_or_path: str | Path, target: HybridCausalLM) -> tuple[Eagle3Head, tuple[int, ...]]:
    """An EAGLE-3 head for `target` from a checkpoint directory or hub id; -> (head on the target's device and
    dtype, the target layers whose outputs it reads). Every mismatch with the target is a CheckpointError."""
    directory = resolve_checkpoint(name_or_path)
    raw = read_config(directory)
    if not set(raw.get("architectures") or []) & set(ARCHITECTURES):
        raise CheckpointError(f"{directory} is not an EAGLE-3 head: config.json architectures is "
                              f"{raw.get('architectures')}, expected one of {list(ARCHITECTURES)}")
    config = LlamaConfig.from_pretrained(directory)
    target_config = target.hf_config
    if config.hidden_size != target_config.hidden_size:
        raise CheckpointError(f"the EAGLE-3 head's hidden size ({config.hidden_size}) differs from the target's "
                              f"({target_config.hidden_size}): it was trained for another model")
    if config.vocab_size != target_config.vocab_size:
        raise CheckpointError(f"the EAGLE-3 head's vocabulary ({config.vocab_size}) differs from the target's "
                              f"({target_config.vocab_size}): it was trained for another model")
    layers = tuple((raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
                   or default_feature_layers(target_config.num_hidden_layers))
    if len(layers) != 3 or not all(0 <= i < target_config.num_hidden_layers for i in layers):
        raise CheckpointError(f"eagle_aux_hidden_state_layer_ids {list(layers)} must be 3 layers of the target's "
                              f"{target_config.num_hidden_layers}")
    head = Eagle3Head(config, target)
    tensors = dict(iter_tensors(weight_files(directory), torch.device("cpu")))
    tensors.pop("t2d", None)
    tensors.pop("embed_tokens.weight", None)  # the target's embedding is used (SGLang and vLLM do the same)
    expected = head.state_dict()
    if "d2t" not in tensors:
        if head.draft_vocab != config.vocab_size:
            raise CheckpointError(f"{directory} has a reduced draft vocabulary ({head.draft_vocab} of "
                                  f"{config.vocab_size}) but no d2t tensor mapping it to the target's token ids")
        tensors["d2t"] = expected["d2t"]
    missing, unexpected = sorted(set(expected) - set(tensors)), sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{directory} does not hold an EAGLE-3 head: missing {missing[:6]}, "
                              f"unexpected {unexpected[:6]}")
    for name, tensor in tensors.items():
        if tensor.shape != expected[name].shape:
            raise CheckpointError(f"{name} in {directory} has shape {tuple(tensor.shape)}, expected "
                                  f"{tuple(expected[name].shape)} (fc reads 3 target layer outputs of the "
                                  "target's hidden size)")
    hot = torch.arange(head.draft_vocab) + tensors["d2t"]
    if hot.min() < 0 or hot.max() >= config.vocab_size:
        raise CheckpointError(f"d2t in {directory} maps draft ids outside the target's vocabulary")
    head.load_state_dict({name: tensor.long() if name == "d2t" else tensor for name, tensor in tensors.items()})
    return head.to(device=target.device, dtype=target.dtype).merge_projections(), layers
