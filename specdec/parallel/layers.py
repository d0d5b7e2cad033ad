"""Sharded layers. Each is an nn.Linear / nn.Embedding holding the rank's slice, under the parameter names of the
unsharded layer, with `tp_shards` (parameter name -> Shard) telling the loader which slice of the checkpoint
tensor to read. For one rank the builders return the plain layers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .comm import all_gather_last, all_reduce
from .group import TensorParallel
from .shard import Shard


def shard_parameters(module: nn.Module, tp: TensorParallel, **shards: Shard) -> nn.Module:
    """Record which slice of the checkpoint each named parameter of `module` holds (nothing for one rank)."""
    if tp.size > 1:
        module.tp_shards = {**getattr(module, "tp_shards", {}), **shards}
    return module


def column_linear(in_features: int, out_features: int, tp: TensorParallel, bias: bool = False,
                  shard: Shard | None = None) -> nn.Linear:
    """x [..., in] -> the rank's output channels [..., shard.size]; no communication. shard defaults to an even
    split of the outputs; fused projections pass their parts (tp.split(0, q, k, v))."""
    if tp.size == 1:
        return nn.Linear(in_features, out_features, bias=bias)
    shard = shard or tp.split(0, out_features)
    if shard.full_size != out_features or shard.dim != 0:
        raise ValueError(f"a column shard cuts the {out_features} outputs along dim 0, got {shard}")
    layer = nn.Linear(in_features, shard.size, bias=bias)
    return shard_parameters(layer, tp, weight=shard, **({"bias": Shard(0, shard.parts, shard.pieces, shard.index)}
                                                       if bias else {}))


class RowParallelLinear(nn.Linear):
    """The rank's input channels [..., in / size] -> [..., out], summed over ranks (one all-reduce); the bias,
    replicated, is added once after the sum."""

    def __init__(self, in_features: int, out_features: int, tp: TensorParallel, bias: bool, shard: Shard):
        super().__init__(shard.size, out_features, bias=bias)
        self.tp = tp
        shard_parameters(self, tp, weight=shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = all_reduce(F.linear(x, self.weight), self.tp)
        return out if self.bias is None else out + self.bias


def row_linear(in_features: int, out_features: int, tp: TensorParallel, bias: bool = False) -> nn.Linear:
    """The rank's input channels (an even split, matching a column shard before it) -> full outputs, all-reduced."""
    if tp.size == 1:
        return nn.Linear(in_features, out_features, bias=bias)
    return RowParallelLinear(in_features, out_features, tp, bias, tp.split(1, in_features))


def vocab_shard(vocab_size: int, tp: TensorParallel) -> Shard:
    """The rank's vocabulary rows: ceil(V / size) each, the last rank's padded with zero rows where size does not
    divide V (the padding's logits are dropped after the gather; no token embeds through it)."""
    rows = -(-vocab_size // tp.size)
    return Shard(0, (rows * tp.size,), tp.size, tp.rank, None if rows * tp.size == vocab_size else vocab_size)


class VocabParallelEmbedding(nn.Embedding):
    """The rank holds vocabulary rows [rank * R, (rank + 1) * R), R = ceil(V / size) (vocab_shard); tokens
    elsewhere embed to zero and one all-reduce sums the ranks' rows: tokens [...] -> [..., D] on every rank."""

    def __init__(self, vocab_size: int, dim: int, tp: TensorParallel):
        shard = vocab_shard(vocab_size, tp)
        super().__init__(shard.size, dim)
        self.tp = tp
        self.start = tp.rank * self.num_embeddings
        shard_parameters(self, tp, weight=shard)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        local = tokens - self.start
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return all_reduce(out.masked_fill_(outside[..., None], 0), self.tp)


class VocabParallelLMHead(nn.Linear):
    """hidden [..., D] -> logits [..., V] on every rank: each rank scores its vocabulary rows (the embedding's rows,
    so tying holds), then one all-gather, less the padding rows' logits; acceptance (greedy and sampled) reads full
    logits as on one device."""

    def __init__(self, dim: int, vocab_size: int, tp: TensorParallel):
        shard = vocab_shard(vocab_size, tp)
        super().__init__(dim, shard.size, bias=False)
        self.tp = tp
        self.vocab_size = vocab_size
        shard_parameters(self, tp, weight=shard)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = all_gather_last(super().forward(hidden), self.tp)  # [..., size * R]
        return logits if logits.shape[-1] == self.vocab_size else logits[..., :self.vocab_size].contiguous()


def vocab_embedding(vocab_size: int, dim: int, tp: TensorParallel) -> nn.Embedding:
    return nn.Embedding(vocab_size, dim) if tp.size == 1 else VocabParallelEmbedding(vocab_size, dim, tp)


def vocab_lm_head(dim: int, vocab_size: int, tp: TensorParallel) -> nn.Linear:
    return nn.Linear(dim, vocab_size, bias=False) if tp.size == 1 else VocabParallelLMHead(dim, vocab_size, tp)
