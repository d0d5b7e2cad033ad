"""One forward step over a batch of requests: which nodes each request scores, and the per-step context.

Every forward scores a token TREE per request (a chain is the tree whose node j has parent j-1; decoding is a
one-node tree) on top of the request's committed tokens. Nothing committed changes during the forward: the
linear layers read their committed state and buffer, the attention layers write the new nodes' keys/values
past the committed end. `KVBufferCache.commit` then keeps the accepted path.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import chain

import torch

from verify_kernels import conv


def host_longs(values: Sequence[int], *shape: int) -> torch.Tensor:
    """A host int64 tensor of a flat list of Python ints, [N] or `shape`: through an array, about five times cheaper
    than torch.tensor of a list (which converts int by int), as the engine needs for every step."""
    if not values:
        return torch.zeros(shape or (0,), dtype=torch.long)
    tensor = torch.frombuffer(array("q", values), dtype=torch.long)
    return tensor.view(shape) if shape else tensor


@dataclass
class StepBatch:
    """Nodes to score, padded to T per request.

    req_slots: B request slots. tokens, parents: [B, T] int64 (parents local, -1 = child of the last committed
    token, topologically ordered). num_nodes: [B] valid nodes per row; later columns are padding.
    prefill: every node of every row is committed right after the forward (prompts). Rows whose buffer would
    overflow take the chunked prefill path, which reads and writes the committed state directly.
    checked_trees: the parents are known to be valid trees (the constructors below that build or check them on the
    host set it), so a CUDA-graph step need not check them again (verify_kernels.tree.check_tree: six torch ops a
    step, ~0.05 ms of host work on a 2-core CPU, on the speculative step's critical path).
    node_counts: num_nodes as Python ints where the constructor has them (the constructors below; None: read from
    the tensor when asked): the checks here and the cache's step bookkeeping read them without a torch op (~1.3 us
    each on a 2-core CPU, on the path between a speculative step's acceptance read and the next launch).
    """

    req_slots: list[int]
    tokens: torch.Tensor
    parents: torch.Tensor
    num_nodes: torch.Tensor
    prefill: bool = False
    checked_trees: bool = field(default=False, compare=False)
    node_counts: list[int] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        batch, width = self.tokens.shape
        if len(self.req_slots) != batch or self.parents.shape != (batch, width) or self.num_nodes.shape != (batch,):
            raise ValueError(
                f"inconsistent step batch: {len(self.req_slots)} slots, tokens {tuple(self.tokens.shape)}, "
                f"parents {tuple(self.parents.shape)}, num_nodes {tuple(self.num_nodes.shape)}"
            )
        if batch == 0:
            raise ValueError("a step needs at least one request")
        counts = self.node_counts
        if counts is None or len(counts) != batch:
            counts = self.node_counts = self.num_nodes.tolist()
        if min(counts) < 1 or max(counts) > width:
            raise ValueError(f"num_nodes must lie in [1, {width}], got {counts}")
        if len(set(self.req_slots)) != batch:
            raise ValueError(f"a request slot appears twice in one step: {self.req_slots}")

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    def padded_to(self, width: int) -> StepBatch:
        """The same step with every row padded to `width` nodes (padding nodes are ignored by every op); this step
        itself when it is that wide already."""
        if width < self.width:
            raise ValueError(f"cannot pad a step of width {self.width} down to {width}")
        if width == self.width:
            return self
        extra = width - self.width
        tokens = torch.nn.functional.pad(self.tokens, (0, extra), value=0)
        parents = torch.nn.functional.pad(self.parents, (0, extra), value=-1)
        return StepBatch(list(self.req_slots), tokens, parents, self.num_nodes.clone(), prefill=self.prefill,
                         checked_trees=self.checked_trees,  # (padding nodes' parents are never read)
                         node_counts=self.node_counts)

    @classmethod
    def chains(cls, req_slots: Sequence[int], sequences: Sequence[Sequence[int]], prefill: bool) -> StepBatch:
        """One chain of tokens per request (prompts when prefill=True, accepted-by-construction otherwise)."""
        if any(len(seq) == 0 for seq in sequences):
            raise ValueError("every request needs at least one token in a step")
        width = max(len(seq) for seq in sequences)
        # padded on the host, one tensor (a tensor per row costs more than the rest of a decode step's set-up)
        tokens = host_longs([t for seq in sequences for t in (*seq, *[0] * (width - len(seq)))], len(sequences),
                            width)
        parents = torch.arange(-1, width - 1, dtype=torch.long).expand(len(sequences), width).clone()
        counts = [len(seq) for seq in sequences]
        return cls(list(req_slots), tokens, parents, host_longs(counts), prefill=prefill, checked_trees=True,
                   node_counts=counts)

    @classmethod
    def decode(cls, req_slots: Sequence[int], last_tokens: Sequence[int]) -> StepBatch:
        """One node per request: its newest token."""
        tokens = host_longs(list(last_tokens), len(last_tokens), 1)
        return cls(list(req_slots), tokens, torch.full_like(tokens, -1), torch.ones(len(tokens), dtype=torch.long),
                   checked_trees=True, node_counts=[1] * len(tokens))

    @classmethod
    def trees(cls, req_slots: Sequence[int], tokens: Sequence[Sequence[int]],
              parents: Sequence[Sequence[int]]) -> StepBatch:
        lengths = list(map(len, tokens))
        if lengths != list(map(len, parents)):
            row = next(i for i, (n, p) in enumerate(zip(lengths, parents, strict=True)) if n != len(p))
            raise ValueError(f"row {row}: {lengths[row]} tokens but {len(parents[row])} parents")
        rows, width = len(tokens), max(lengths)
        # padded on the host into flat lists, one tensor each (a per-row tensor, or torch.tensor of nested lists,
        # costs more than the rest of the step's set-up); rows of one length (chains of a fixed depth) need no padding
        if min(lengths) == width:
            token_tensor = host_longs(list(chain.from_iterable(tokens)), rows, width)
        else:
            token_tensor = host_longs([t for row in tokens for t in (*row, *[0] * (width - len(row)))], rows, width)
        first = parents[0]
        # one shape for every row (chains of a fixed depth, a static tree): its parents checked here once, on the
        # host, instead of the whole batch's by torch ops before a graph replay, and repeated as raw bytes
        one_shape = len(first) == width and parents.count(first) == rows  # (count: identity, then ==)
        if one_shape:
            parent_tensor = torch.frombuffer(array("q", first) * rows, dtype=torch.long).view(rows, width)
        else:
            parent_tensor = host_longs([p for row in parents for p in (*row, *[-1] * (width - len(row)))], rows, width)
        checked = one_shape and all(-1 <= p < j for j, p in enumerate(first))
        return cls(list(req_slots), token_tensor, parent_tensor, host_longs(lengths), prefill=False,
                   checked_trees=checked, node_counts=lengths)


@dataclass
class StepContext:
    """Device-side view of a step, shared by every layer of the forward.

    Shapes: B rows, T nodes; kv_len = committed tokens + T of the longest row (a bucket under CUDA graphs).
    chunk_rows / tree_rows: row indices taking the chunked-prefill path / the KVBuffer tree path.
    """

    batch: StepBatch
    req_slots: torch.Tensor  # [B] int64
    state_slots: torch.Tensor  # [B] int64, -1 = never flushed (no committed state is read)
    parents: torch.Tensor  # [B, T]
    num_nodes: torch.Tensor  # [B]
    positions: torch.Tensor  # [B, T] committed length + depth: rotary positions
    seq_lens: torch.Tensor  # [B] committed tokens per row
    ancestors: torch.Tensor  # [B, T, T] bool: verify_kernels.tree.ancestor_mask, shared by every layer
    kv_len: int  # key positions the attention reference gathers per row (the kernel reads each row's own)
    chunk_rows: torch.Tensor  # [B_chunk] int64
    tree_rows: torch.Tensor  # [B_tree] int64
    scratch: dict[int, object] = field(default_factory=dict)  # linear layer index -> what commit needs
    # plain decoding (one node per row, accepted by construction): the layers commit as they score, and no commit
    # follows; the cache took the state slots of the rows that fold before the step (KVBufferCache.begin_decode)
    commit_in_forward: bool = False
    # ... and every row's buffer fills in it (plain decoding's rows in lockstep: known on the host, from
    # prepare_commit), so the linear layers launch their ops' decode_commit_folding where they have one
    every_row_folds: bool = False
    # conv width -> conv_window_sources [B, T, width - 1]: computed by the step's first conv layer (a few small
    # ops, captured with the step), read by the others; the tree conv then loads each window column at once
    # instead of walking W - 1 parent pointers in every layer
    conv_sources: dict[int, torch.Tensor] = field(default_factory=dict)

    def window_sources(self, width: int) -> torch.Tensor:
        """[B, T, width - 1] int64: where each node's conv window lives (verify_kernels.conv.conv_window_sources),
        shared by every conv layer of the step."""
        if width not in self.conv_sources:
            self.conv_sources[width] = conv.conv_window_sources(self.parents, self.num_nodes, width)
        return self.conv_sources[width]

    @property
    def tree_index(self) -> torch.Tensor | slice:
        """Index of the tree rows: a plain slice when every row is one (decode and verify steps), so that the
        layers take views instead of gathering, and a captured step has no data-dependent shapes."""
        return slice(None) if self.chunk_rows.numel() == 0 else self.tree_rows

    @property
    def accepted(self) -> torch.Tensor:
        """[B, 1]: the accepted path of a plain decoding step, every row's node 0."""
        return torch.zeros_like(self.num_nodes)[:, None]

    @property
    def prefill(self) -> bool:
        """A prefill step (eager: a captured step has no batch): every node is kept (commit_all follows it), so the
        linear layers write what its commit would in the forward (LinearLayerPool.score)."""
        return self.batch is not None and self.batch.prefill

    def every_node(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every node of every row kept: (accepted [B, T] node indices root first, -1 past a row's nodes;
        num_accepted [B])."""
        width = self.parents.shape[1]
        nodes = torch.arange(width, device=self.parents.device).expand(self.parents.shape[0], width)
        return torch.where(self.valid, nodes, torch.full_like(nodes, -1)), self.num_nodes

    @property
    def valid(self) -> torch.Tensor:
        """[B, T] bool: real nodes (not padding)."""
        width = self.parents.shape[1]
        return torch.arange(width, device=self.parents.device)[None, :] < self.num_nodes[:, None]


def positions_for(seq_lens: torch.Tensor, tree: torch.Tensor) -> torch.Tensor:
    """[B, T] int64: committed length + depth of each node (depth = strict ancestors; padding nodes 0)."""
    return seq_lens[:, None] + (tree.sum(-1) - 1).clamp(min=0)
