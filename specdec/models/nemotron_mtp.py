"""Nemotron-3's multi-token-prediction (MTP) layer as a model of its own over a KVBuffer cache (attention only),
built from a Nemotron-H target's `mtp.*` tensors and sharing its embedding and LM head (Nemotron 3 Super ships one;
specdec train writes one for the small Nemotron it ships). Blocks of mtp_layers_block_type (by default attention,
then MoE), plain RMSNorms, no rotary:

    x = mtp.layers.0.eh_proj([layers.0.enorm(embed(token)), layers.0.hnorm(h)]);  x = block(x) for each block
    y = mtp.layers.<last>.final_layernorm(x)

A row pairs the hidden state of position p - 1 with the token at p, as Qwen3.5's MTP does (specdec/models/mtp.py,
whose interface this shares for drafters/head.py)."""

from __future__ import annotations

import re

import torch
from torch import nn

from .base import HybridCausalLM
from .layers import RMSNorm
from .mtp import MissingMtpError
from .nemotron_h import NemotronHBlock, NemotronHForCausalLM

PER_EXPERT = re.compile(r"^(layers\.\d+\.mixer\.experts)\.(\d+)\.(up_proj|down_proj)\.weight$")
FP32 = ("gate.weight", "gate.e_score_correction_bias")  # the router runs in fp32, as the target's does


def stack_experts(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One tensor per expert and projection -> ours stacked (up_proj [E, I, D], down_proj [E, D, I])."""
    out, parts = {}, {}
    for name, tensor in weights.items():
        match = PER_EXPERT.match(name)
        if match is None:
            out[name] = tensor
        else:
            parts.setdefault(match.group(1), {})[int(match.group(2)), match.group(3)] = tensor
    for module, have in parts.items():
        count = max(expert for expert, _ in have) + 1
        missing = [f"mtp.{module}.{e}.{p}.weight" for e in range(count) for p in ("up_proj", "down_proj")
                   if (e, p) not in have]
        if missing:
            raise ValueError(f"the checkpoint's MTP experts are incomplete: {len(missing)} tensors missing, e.g. "
                             f"{missing[:3]}")
        for projection in ("up_proj", "down_proj"):
            out[f"{module}.{projection}"] = torch.stack([have[e, projection] for e in range(count)])
    return out


class NemotronHMtp(HybridCausalLM):
    """forward(tokens, hidden_in, ctx, cache) -> y [B, T, D]; compute_logits(y) through the target's LM head."""

    def __init__(self, target: NemotronHForCausalLM):
        config = target.hf_config
        super().__init__(config)
        if not target.mtp_weights:
            raise MissingMtpError("the target checkpoint has no mtp.* tensors (no multi-token-prediction layer): "
                                  "use --draft small or --draft ngram, or a checkpoint trained with its MTP layer")
        types = list(getattr(config, "mtp_layers_block_type", None) or ["full_attention", "moe"])
        if "linear_attention" in types:
            raise ValueError(f"MTP blocks {types}: Mamba2 blocks in an MTP layer are not supported")
        size, eps = config.hidden_size, config.layer_norm_epsilon
        attention = iter(range(len(types)))
        self.layers = nn.ModuleList([
            NemotronHBlock(config, kind, next(attention) if kind == "full_attention" else 0) for kind in types])
        self.layers[0].enorm = RMSNorm(size, eps)
        self.layers[0].hnorm = RMSNorm(size, eps)
        self.layers[0].eh_proj = nn.Linear(2 * size, size, bias=False)
        self.layers[-1].final_layernorm = RMSNorm(size, eps)
        self._load(target.mtp_weights)
        self.to(device=target.device, dtype=target.dtype)
        for name, param in self.named_parameters():
            if name.endswith(FP32):
                param.data = param.data.float()
        for name, buffer in self.named_buffers():
            if name.endswith(FP32):
                buffer.data = buffer.data.float()
        self._shared = (target.model.embeddings, target.lm_head)  # the target's, not parameters of this module

    def _load(self, weights: dict[str, torch.Tensor]) -> None:
        weights = stack_experts(weights)
        expected = self.state_dict()
        missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
        if missing or unexpected:
            raise ValueError(f"the checkpoint's mtp.* tensors do not form the Nemotron MTP layer config.json "
                             f"describes: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for name, tensor in weights.items():
            if tensor.shape != expected[name].shape:
                raise ValueError(f"mtp.{name} has shape {tuple(tensor.shape)}, expected {tuple(expected[name].shape)} "
                                 "for this target")
        self.load_state_dict(weights)

    @property
    def lm_head(self) -> nn.Linear:
        return self._shared[1]

    def project(self, features: torch.Tensor) -> torch.Tensor:
        return features

    def forward(self, tokens: torch.Tensor, hidden_in: torch.Tensor, ctx, cache) -> torch.Tensor:
        """tokens [B, T], hidden_in [B, T, D] (the target's hidden after its final norm, or a parent row's y)."""
        first = self.layers[0]
        embeds = self._shared[0](tokens)
        x = first.eh_proj(torch.cat([first.enorm(embeds), first.hnorm(hidden_in.to(embeds.dtype))], dim=-1))
        for block in self.layers:
            x = block(x, ctx, cache)
        return self.layers[-1].final_layernorm(x)

    def linear_layers(self) -> list[nn.Module]:
        return []

    def attention_layers(self) -> list[nn.Module]:
        return [block.mixer for block in self.layers if block.block_type == "full_attention"]
