"""Qwen3.5's multi-token-prediction (MTP) layer, for training it with its target. transformers does not build it
(it drops `mtp.*` on load), so we do, from transformers' own Qwen3.5 parts, under the names Qwen3.5 checkpoints use:

    mtp.pre_fc_norm_embedding [H], mtp.pre_fc_norm_hidden [H]   zero-centred RMSNorms ((1 + w) scale)
    mtp.fc [H, 2H]                                               over [norm(embedding), norm(hidden)], in that order
    mtp.layers.0.*                                               one full-attention (gated) decoder layer, with
                                                                 the MoE block for MoE models
    mtp.norm [H]                                                 before the target's (shared) lm_head

Depth 1 at position t: the target's final hidden h_t (after its final norm) and the embedding of token t + 1,
at rotary position t, predict token t + 2. A further depth feeds back the output after mtp.norm.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
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


def mtp_hidden(mtp: MtpHead, model: nn.Module, hidden: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
    """Depth 1 over a sequence. hidden: [B, T, H] the target's final hidden (after its norm) at positions 0..T-1;
    next_tokens: [B, T] the token after each position -> [B, T, H] after mtp.norm; row t sees rows <= t only."""
    B, T = hidden.shape[:2]
    base = model.base_model
    positions = torch.arange(T, device=hidden.device).view(1, 1, T).expand(3, B, T)   # text: (t, t, t) M-RoPE
    next_embeds = base.embed_tokens(next_tokens)
    position_embeddings = base.rotary_emb(next_embeds, positions)
    causal = torch.ones(T, T, dtype=torch.bool, device=hidden.device).tril().expand(B, 1, T, T)  # True: attend
    return mtp(hidden, next_embeds, position_embeddings, causal)


def mtp_loss(mtp: MtpHead, model: nn.Module, hidden: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    """Depth-1 cross-entropy. hidden: [B, T, H] over window[:, :T]; window: [B, T + 2] tokens: row t predicts
    window[:, t + 2] from hidden t and the embedding of window[:, t + 1]."""
    T = hidden.shape[1]
    out = mtp_hidden(mtp, model, hidden, window[:, 1:T + 1])
    logits = model.lm_head(out).float()
    return F.cross_entropy(logits.flatten(0, 1), window[:, 2:T + 2].flatten())
