"""Qwen3.5's multi-token-prediction (MTP) layer, for training it with its target. transformers does not build it
(it drops `mtp.*` on load), so we do, from transformers' own Qwen3.5 parts, under the names Qwen3.5 checkpoints use:

    mtp.pre_fc_norm_embedding [H], mtp.pre_fc_norm_hidden [H]   zero-centred RMSNorms ((1 + w) scale)
    mtp.fc [H, 2H]                                               over [norm(embedding), norm(hidden)], in that order
    mtp.layers.0.*                                               one full-attention (gated) decoder layer, with
                                                                 the MoE block for MoE models
    mtp.norm [H]                                                 before the target's (shared) lm_head

Depth 1 at position t: the target's final hidden h_t (after its final norm) and the embedding of token t + 1,
at rotary position t, predict token t + 2. A further depth feeds back the output after mtp.norm.

Nemotron-3's (NemotronMtpHead; Nemotron 3 Super ships one) is the same idea over a block pattern
(mtp_layers_block_type, by default attention then MoE) in plain RMSNorms and without rotary:

    mtp.layers.0.{enorm, hnorm} [H], mtp.layers.0.eh_proj [H, 2H]   over [enorm(embedding), hnorm(hidden)]
    mtp.layers.i.{norm, mixer.*}                                    the blocks, pre-normed with a residual
    mtp.layers.<last>.final_layernorm [H]                           before the target's lm_head
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHBlock, NemotronHRMSNorm
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm
from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer


class MtpHead(nn.Module):
    def __init__(self, model: nn.Module):
        """`model`: transformers' Qwen3_5ForCausalLM the head belongs to (its config, init, embedding, lm_head)."""
        super().__init__()
        config = model.config
        if config.model_type not in ("qwen3_5_text", "qwen3_5_moe_text"):
            raise ValueError(f"the MTP layer is Qwen3.5's; got a {config.model_type!r} model")
        layer_config = copy.deepcopy(config)
        layer_config.layer_types = ["full_attention"]
        layer_config.num_hidden_layers = 1
        layer_config._attn_implementation = "sdpa"   # takes the boolean causal mask mtp_loss builds
        size, eps = config.hidden_size, config.rms_norm_eps
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(size, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(size, eps=eps)
        self.fc = nn.Linear(2 * size, size, bias=False)
        layer_class = Qwen3_5MoeDecoderLayer if config.model_type == "qwen3_5_moe_text" else Qwen3_5DecoderLayer
        self.layers = nn.ModuleList([layer_class(layer_config, 0)])
        self.norm = Qwen3_5RMSNorm(size, eps=eps)
        self.config = layer_config
        self.apply(model._init_weights)

    def forward(self, hidden: torch.Tensor, next_embeds: torch.Tensor, position_embeddings,
                attention_mask) -> torch.Tensor:
        """hidden, next_embeds: [B, T, H] -> [B, T, H], normed (what the lm_head reads and the next depth takes)."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(next_embeds), self.pre_fc_norm_hidden(hidden)], dim=-1))
        x = self.layers[0](x, position_embeddings=position_embeddings, attention_mask=attention_mask)
        return self.norm(x)

    def run(self, model: nn.Module, hidden: torch.Tensor, next_embeds: torch.Tensor, causal) -> torch.Tensor:
        B, T = hidden.shape[:2]
        positions = torch.arange(T, device=hidden.device).view(1, 1, T).expand(3, B, T)  # text: (t, t, t) M-RoPE
        return self(hidden, next_embeds, model.base_model.rotary_emb(next_embeds, positions), causal)

    def config_fields(self) -> dict:
        return {"mtp_num_hidden_layers": len(self.layers), "mtp_use_dedicated_embeddings": False}


class NemotronMtpHead(nn.Module):
    def __init__(self, model: nn.Module):
        """`model`: transformers' NemotronHForCausalLM the head belongs to."""
        super().__init__()
        config = model.config
        types = list(getattr(config, "mtp_layers_block_type", None) or ["full_attention", "moe"])
        if "linear_attention" in types:
            raise ValueError(f"MTP blocks {types}: Mamba2 blocks in an MTP layer are not supported")
        layer_config = copy.deepcopy(config)
        layer_config.layers_block_type = types
        layer_config._attn_implementation = "sdpa"   # takes the boolean causal mask
        size, eps = config.hidden_size, config.layer_norm_epsilon
        self.layers = nn.ModuleList([NemotronHBlock(layer_config, index) for index in range(len(types))])
        self.layers[0].enorm = NemotronHRMSNorm(size, eps=eps)
        self.layers[0].hnorm = NemotronHRMSNorm(size, eps=eps)
        self.layers[0].eh_proj = nn.Linear(2 * size, size, bias=False)
        self.layers[-1].final_layernorm = NemotronHRMSNorm(size, eps=eps)
        self.types = types
        self.apply(model._init_weights)

    def run(self, model: nn.Module, hidden: torch.Tensor, next_embeds: torch.Tensor, causal) -> torch.Tensor:
        """hidden, next_embeds: [B, T, H] -> [B, T, H] after final_layernorm (no rotary: Nemotron's attention has
        no positional encoding)."""
        first = self.layers[0]
        x = first.eh_proj(torch.cat([first.enorm(next_embeds), first.hnorm(hidden)], dim=-1))
        for layer in self.layers:
            x = layer(x, attention_mask=causal)
        return self.layers[-1].final_layernorm(x)

    def config_fields(self) -> dict:
        return {"num_nextn_predict_layers": 1, "mtp_layers_block_type": self.types}


def mtp_head_for(model: nn.Module) -> nn.Module:
    """The MTP layer of transformers' model: Qwen3.5's or Nemotron-3's."""
    return NemotronMtpHead(model) if model.config.model_type == "nemotron_h" else MtpHead(model)


def mtp_hidden(mtp: nn.Module, model: nn.Module, hidden: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
    """Depth 1 over a sequence. hidden: [B, T, H] the target's final hidden (after its norm) at positions 0..T-1;
    next_tokens: [B, T] the token after each position -> [B, T, H] after the MTP's final norm; row t sees rows
    <= t only."""
    B, T = hidden.shape[:2]
    next_embeds = model.get_input_embeddings()(next_tokens)
    causal = torch.ones(T, T, dtype=torch.bool, device=hidden.device).tril().expand(B, 1, T, T)  # True: attend
    return mtp.run(model, hidden, next_embeds, causal)


def mtp_loss(mtp: nn.Module, model: nn.Module, hidden: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Depth-1 cross-entropy. hidden: [B, T, H] over window[:, :T]; window: [B, T + 2] tokens: row t predicts
    window[:, t + 2] from hidden t and the embedding of window[:, t + 1]."""
    T = hidden.shape[1]
    out = mtp_hidden(mtp, model, hidden, window[:, 1:T + 1])
    logits = model.lm_head(out).float()
    return F.cross_entropy(logits.flatten(0, 1), window[:, 2:T + 2].flatten())
