"""Which slice of a checkpoint tensor a rank holds (Shard), and reading only that slice."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Shard:
    """A rank's slice of a tensor along `dim`: the tensor is `parts` (their full sizes, consecutive along dim, e.g.
    the q, k and v channels of a fused projection), each part is cut into `pieces` equal pieces, and the rank holds
    piece `index` of every part, concatenated in order.

    pieces is the rank count for a split, or fewer where ranks share a piece (attention KV heads fewer than the
    ranks: each rank holds the KV head its query heads read, `index` = rank * pieces // ranks)."""

    dim: int
    parts: tuple[int, ...]
    pieces: int
    index: int

    def __post_init__(self):
        uneven = [part for part in self.parts if part % self.pieces]
        if uneven:
            raise ValueError(f"cannot cut sizes {uneven} of {self.parts} into {self.pieces} equal pieces")
        if not 0 <= self.index < self.pieces:
            raise ValueError(f"piece {self.index} of {self.pieces} does not exist")

    @property
    def size(self) -> int:
        """The rank's size along dim."""
        return sum(self.parts) // self.pieces

    @property
    def full_size(self) -> int:
        return sum(self.parts)

    def ranges(self) -> list[tuple[int, int]]:
        """[(start, stop)] along dim of the full tensor, one per part."""
        ranges, offset = [], 0
        for part in self.parts:
            piece = part // self.pieces
            ranges.append((offset + self.index * piece, offset + (self.index + 1) * piece))
            offset += part
        return ranges

    def full_shape(self, local_shape: tuple[int, ...]) -> tuple[int, ...]:
        shape = list(local_shape)
        shape[self.dim] = self.full_size
        return tuple(shape)

    def read(self, source) -> torch.Tensor:
        """The rank's slice of `source`: a full tensor, or a safetensors slice (safe_open(...).get_slice(name)), of
        which only the rows asked for are read from the file."""
        lead = (slice(None),) * self.dim
        pieces = [source[(*lead, slice(start, stop))] for start, stop in self.ranges()]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=self.dim)
