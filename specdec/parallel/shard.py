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
    ranks: each rank holds the KV head its query heads read, `index` = rank * pieces // ranks).

    length: the tensor's own size along dim where it is shorter than its one part, which pads it to a multiple of
    the pieces (a vocabulary the ranks cannot split evenly: parts = (V rounded up,), length = V); the last pieces
    then read fewer rows, and zeros after them."""

    dim: int
    parts: tuple[int, ...]
    pieces: int
    index: int
    length: int | None = None

    def __post_init__(self):
        if self.length is not None and (len(self.parts) != 1 or not 0 < self.length <= self.parts[0]):
            raise ValueError(f"a padded shard has one part of at least its length, got {self.parts} for "
                             f"{self.length}")
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
        """The tensor's size along dim (without the padding)."""
        return sum(self.parts) if self.length is None else self.length

    def ranges(self) -> list[tuple[int, int]]:
        """[(start, stop)] along dim of the full tensor, one per part (a padded shard's may be short, or empty)."""
        ranges, offset = [], 0
        for part in self.parts:
            piece = part // self.pieces
            start, stop = offset + self.index * piece, offset + (self.index + 1) * piece
            ranges.append((start, stop) if self.length is None else (min(start, self.length), min(stop, self.length)))
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
        out = pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=self.dim)
        if out.shape[self.dim] < self.size:  # a padded shard's last rows
            pad = list(out.shape)
            pad[self.dim] = self.size - out.shape[self.dim]
            out = torch.cat([out, out.new_zeros(pad)], dim=self.dim)
        return out
