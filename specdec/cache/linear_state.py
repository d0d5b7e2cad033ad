"""How a linear-attention layer keeps its recurrent state across a step, the linear state: the KVBuffer, or the
intermediate states of today's engines that we measure against. One object per layer pool, chosen when the cache is
built (CacheConfig.linear_state); the mixers hand it their per-token inputs and never ask which one it is.

Both score the tree rows of a step (decode: one node per row; verify: a token tree per row) without changing a
committed state, and commit the accepted paths afterwards; or, for plain decoding, where the one node of every row
is accepted by construction, score and commit in one op (decode_commit):
- KVBufferState (docs/design.md section 2): reads the committed state and the buffer, writes nothing; the step's
  entries (key, value, cumulative decay per node) wait in the scratch; commit appends the accepted ones to the buffer
  and folds a full buffer into the state.
- IntermediateStates (section 2.6; verify_kernels/intermediate): walks each tree node by node from the committed
  state and writes the state after every node ([rows, T, *state] per layer, reserved once for the widest step);
  commit copies the last accepted node's state into the request's slot. Decode steps write the slot in place.
  It keeps no buffer (the cache runs with flush_length 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.backend import IntermediateOps, MixerOps


@dataclass
class MixerInputs:
    """A mixer's per-node inputs to its state ops, in the ops' argument order.

    tokens: tensors [B, T, ...] (GDN: q, k, v, g, beta; Mamba2: x, dt, B, C); constants: per-head tensors that come
    at `constant_positions` of the argument list (Mamba2: A at 2 and D at 5; GDN: none); entry_key: the index in
    tokens of what the buffer keeps as an entry's key (GDN: k; Mamba2: B); padding_masked: the indices in tokens
    that a chunked prefill zeroes at padding nodes so that they leave the state untouched (GDN: g and beta; Mamba2:
    dt)."""

    tokens: tuple[torch.Tensor, ...]
    entry_key: int
    padding_masked: tuple[int, ...]
    constants: tuple[torch.Tensor, ...] = ()
    constant_positions: tuple[int, ...] = ()

    def args(self, rows=slice(None), node: int | None = None) -> list[torch.Tensor]:
        """The ops' leading arguments for these rows: [b, T, ...] tensors, or [b, ...] at one node (decode)."""
        tokens = [t[rows] if node is None else t[rows, node] for t in self.tokens]
        for position, constant in zip(self.constant_positions, self.constants, strict=True):
            tokens.insert(position, constant)
        return tokens

    def masked(self, rows, valid: torch.Tensor) -> list[torch.Tensor]:
        """args(rows) with the padding-masked inputs zeroed where valid [b, T] is False."""
        tokens = [t[rows] * valid[..., None] if index in self.padding_masked else t[rows]
                  for index, t in enumerate(self.tokens)]
        for position, constant in zip(self.constant_positions, self.constants, strict=True):
            tokens.insert(position, constant)
        return tokens


@dataclass
class TreeScratch:
    """What a linear state keeps from a step's tree rows for its commit (tree rows only, in the step's row order).

    key / value / gcum [b, T, ...]: the nodes' buffer entries (KVBuffer). node_states [b, T, *state]: the state
    after every node (intermediate states; None after a decode step, which wrote its states into the slots)."""

    key: torch.Tensor | None = None
    value: torch.Tensor | None = None
    gcum: torch.Tensor | None = None
    node_states: torch.Tensor | None = None


class KVBufferState:
    name = "kvbuffer"
    keys_in_model_dtype = True  # (IntermediateStates' says why it is a choice)

    def __init__(self, pool, ops: MixerOps):
        self.pool = pool
        self.ops = ops

    def score(self, ctx, inputs: MixerInputs, buf_len: torch.Tensor) -> tuple[torch.Tensor, TreeScratch]:
        """The tree rows of the step -> (outputs [b, T, heads, head_dim] fp32, their entries)."""
        pool, rows = self.pool, ctx.tree_index
        pools = (pool.state, ctx.state_slots[rows], *pool.buffers(buf_len), ctx.req_slots[rows])
        if ctx.parents.shape[1] == 1:
            out, value, gcum = self.ops.decode(*inputs.args(rows, node=0), *pools)
            out, value, gcum = out[:, None], value[:, None], gcum[:, None]
        else:
            out, value, gcum = self.ops.verify(*inputs.args(rows), ctx.parents[rows], ctx.num_nodes[rows], *pools,
                                               ancestors=ctx.ancestors[rows])
        return out, TreeScratch(key=inputs.tokens[inputs.entry_key][rows], value=value, gcum=gcum)

    def decode_commit(self, ctx, inputs: MixerInputs, buf_len: torch.Tensor) -> torch.Tensor:
        """A plain decoding step, committed as it is scored (one fused op): each row's token appended to its
        buffer, or the buffer and the token folded into its state (whose slot the cache took beforehand); a step in
        which every row folds (ctx.every_row_folds) through the op's launch for that, where it has one.
        -> outputs [B, 1, heads, head_dim] fp32."""
        pool = self.pool
        pools = (pool.state, ctx.state_slots, *pool.buffers(buf_len), ctx.req_slots)
        folding = ctx.every_row_folds and self.ops.decode_commit_folding is not None
        op = self.ops.decode_commit_folding if folding else self.ops.decode_commit
        out, _ = op(*inputs.args(node=0), *pools, pool.flush_length)
        return out[:, None]

    def commit(self, scratch: TreeScratch, ctx, accepted: torch.Tensor, num_accepted: torch.Tensor,
               buf_len: torch.Tensor) -> None:
        """Append the accepted entries to the buffers; fold the buffers that fill into their states."""
        pool, rows = self.pool, ctx.tree_index
        self.ops.commit(scratch.key, scratch.value, scratch.gcum, accepted[rows], num_accepted[rows], pool.state,
                        ctx.state_slots[rows], *pool.buffers(buf_len), ctx.req_slots[rows], pool.flush_length)

    def flush(self, req_slots: torch.Tensor, state_slots: torch.Tensor, buf_len: torch.Tensor) -> None:
        """Fold these requests' buffers into their committed states (state_slots >= 0)."""
        self.ops.flush(self.pool.state, state_slots, *self.pool.buffers(buf_len), req_slots)

    def reserve(self, rows: int, width: int) -> None:
        """Nothing to reserve: a step's entries are small and live in its scratch."""

    def nbytes(self) -> int:
        return 0


class IntermediateStates:
    name = "intermediate"
    # The keys (GDN's q and k, Mamba2's B and C) in fp32, not the model's dtype: each backend takes them as its
    # kernels run fastest, from the same glue kernel at no cost. The KVBuffer's verify skips the remainders of bf16
    # keys in its products (Mamba2: 8% at batch 256), the intermediate-state kernels only load them (Mamba2's ran 7%
    # slower on bf16: H200, 2026-12-04, benchmarks/results/sweeps_h200/probe_mamba2_inputs_2026-12-04e.txt, 995-997
    # against 931-933 us at batch 256), and GDN's keep the fp32 q and k they ran on before.
    keys_in_model_dtype = False

    def __init__(self, pool, ops: IntermediateOps):
        self.pool = pool
        self.ops = ops
        # one state per node of the widest verify step, for every request slot, reserved once (as SGLang and vLLM
        # reserve theirs) rather than per step or per captured graph: [rows * width * state] fp32, flat, viewed
        # per step; empty until reserve() (plain decoding writes its states in place and needs none)
        self.node_states = torch.zeros(0, device=pool.state.device)

    def reserve(self, rows: int, width: int) -> None:
        if width > 1:
            self.node_states = torch.zeros(rows * width * math.prod(self.pool.spec.state_shape),
                                           device=self.pool.state.device)

    def score(self, ctx, inputs: MixerInputs, buf_len: torch.Tensor) -> tuple[torch.Tensor, TreeScratch]:
        """The tree rows of the step -> (outputs [b, T, heads, head_dim] fp32, the state after every node)."""
        pool, rows = self.pool, ctx.tree_index
        parents = ctx.parents[rows]
        out, node_states = self.ops.tree(*inputs.args(rows), parents, ctx.num_nodes[rows], pool.state,
                                         ctx.state_slots[rows], in_place=parents.shape[1] == 1,
                                         states_out=self._node_states_for(*parents.shape))
        return out, TreeScratch(node_states=node_states)

    def decode_commit(self, ctx, inputs: MixerInputs, buf_len: torch.Tensor) -> torch.Tensor:
        """A plain decoding step: the recurrence writes each row's state in place (today's engines' decode). Rows
        without a state slot (a graph's padding rows) decode nothing."""
        nodes = torch.where(ctx.state_slots >= 0, ctx.num_nodes, 0)
        out, _ = self.ops.tree(*inputs.args(), ctx.parents, nodes, self.pool.state, ctx.state_slots, in_place=True)
        return out

    def _node_states_for(self, rows: int, width: int) -> torch.Tensor | None:
        """[rows, width, *state] in the reserved node states, or None (the op allocates) when they do not fit."""
        size = rows * width * math.prod(self.pool.spec.state_shape)
        if width == 1 or size > self.node_states.numel():  # (decode steps write their states in place)
            return None
        return self.node_states[:size].view(rows, width, *self.pool.spec.state_shape)

    def commit(self, scratch: TreeScratch, ctx, accepted: torch.Tensor, num_accepted: torch.Tensor,
               buf_len: torch.Tensor) -> None:
        """Copy each row's last accepted node state into its slot (decode steps already wrote theirs)."""
        if scratch.node_states is not None:
            rows = ctx.tree_index
            self.ops.commit(scratch.node_states, accepted[rows], num_accepted[rows], self.pool.state,
                            ctx.state_slots[rows])

    def flush(self, req_slots: torch.Tensor, state_slots: torch.Tensor, buf_len: torch.Tensor) -> None:
        """Nothing is ever buffered."""

    def nbytes(self) -> int:
        return self.node_states.numel() * self.node_states.element_size()
