"""What every specdec causal LM provides to the runtime."""

from __future__ import annotations

import torch
from torch import nn

from specdec.cache.model_cache import KVBufferCache
from specdec.cache.spec import CacheConfig, ModelCacheSpec
from specdec.parallel import SINGLE, TensorParallel


class HybridCausalLM(nn.Module):
    """A hybrid linear-attention / full-attention causal LM over a KVBuffer cache.

    Subclasses build `self.model` (embeddings, layers, final norm) and `self.lm_head`, and implement `forward`.
    `hf_config` is the transformers config the model was built from; `mtp_weights` holds the checkpoint's
    multi-token-prediction tensors (names without the `mtp.` prefix) for the MTP drafter, empty if it has none.
    `tp` is the process's rank of a tensor-parallel group (specdec.parallel): a sharded model's layers hold the
    rank's heads, its cache_spec() is the rank's, and compute_logits gives full logits on every rank.
    """

    def __init__(self, hf_config, tp: TensorParallel = SINGLE):
        super().__init__()
        self.hf_config = hf_config
        self.tp = tp
        self.mtp_weights: dict[str, torch.Tensor] = {}

    def forward(self, tokens: torch.Tensor, ctx, cache: KVBufferCache) -> torch.Tensor:
        """tokens [B, T] -> final hidden states [B, T, D] (after the last norm)."""
        return self.forward_features(tokens, ctx, cache)[0]

    def forward_features(self, tokens: torch.Tensor, ctx, cache: KVBufferCache,
                         layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """tokens [B, T] -> (final hidden states [B, T, D], the outputs of decoder layers `layers` (0-based, the
        residual stream before the final norm) concatenated [B, T, len(layers) * D], None without layers)."""
        raise NotImplementedError

    def merge_projections(self) -> nn.Module:
        """Every layer's projections of one input as one GEMM (specdec/models/merged.py), once its weights are in
        place (the loader calls it) -> self."""
        for module in self.modules():
            if module is not self and hasattr(module, "merge_projections"):
                module.merge_projections()
        return self

    @property
    def logits_dtype(self) -> torch.dtype:
        """The dtype compute_logits writes into a given `out` with no cast: the LM head's weights' for a bias-free
        nn.Linear head (the GEMM writes there itself), else fp32."""
        head = self.lm_head
        return head.weight.dtype if type(head) is nn.Linear and head.bias is None else torch.float32

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """hidden [..., D] -> logits [..., vocab]: fp32 (the LM head's cast), or into `out` (that shape, contiguous)
        when given: in logits_dtype the LM head's GEMM writes there directly, the same values the cast would give
        exactly (the CUDA graphs' shared logits buffer: no cast kernel, which read bf16 and wrote fp32 logits for
        0.2-0.36 ms of a batch-128 speculative step on the H200, and half the buffer); else cast into it. Their
        readers cast to fp32 where they compute with them (sampling.target_distribution, sampler)."""
        if out is not None and out.dtype == self.logits_dtype != torch.float32:
            return torch.mm(hidden.reshape(-1, hidden.shape[-1]), self.lm_head.weight.t(),
                            out=out.view(-1, out.shape[-1])).view(out.shape)
        logits = self.lm_head(hidden)
        return logits.float() if out is None else out.copy_(logits)

    def linear_layers(self) -> list[nn.Module]:
        raise NotImplementedError

    def attention_layers(self) -> list[nn.Module]:
        raise NotImplementedError

    def cache_spec(self) -> ModelCacheSpec:
        return ModelCacheSpec(
            linear=tuple(layer.cache_spec() for layer in self.linear_layers()),
            attention=tuple(layer.cache_spec() for layer in self.attention_layers()),
        )

    def make_cache(self, config: CacheConfig) -> KVBufferCache:
        """A cache on the model's device; entries and states in fp32, conv windows and KV in the model dtype."""
        weight = self.lm_head.weight
        return KVBufferCache(self.cache_spec(), config, device=weight.device, dtype=weight.dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device
