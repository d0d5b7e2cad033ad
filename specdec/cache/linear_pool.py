"""Per linear-attention layer pools: committed states, KVBuffer entries, conv windows."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.backend import backend_for, conv_ops, gdn_ops, intermediate_ops, mamba2_ops

from .spec import LinearLayerSpec

_MIXER_OPS = {"gdn": gdn_ops, "mamba2": mamba2_ops}


@dataclass
class LinearScratch:
    """What one linear layer computed in a step and commit needs.

    conv_input [B, T, conv_dim]: pre-conv inputs of every node (the conv windows of later tokens).
    key / value / gcum [B, T, ...]: the nodes' buffer entries (tree rows; zeros on chunk rows).
    final_state [B_chunk, *state]: the state after a chunked prefill (chunk rows only).
    node_states [B_tree, T, *state]: the intermediate-state baseline's state after every node (tree rows only;
        None after a decode step, which wrote its states into the slots).
    """

    conv_input: torch.Tensor
    key: torch.Tensor | None = None
    value: torch.Tensor | None = None
    gcum: torch.Tensor | None = None
    final_state: torch.Tensor | None = None
    node_states: torch.Tensor | None = None


class LinearLayerPool:
    """Tensors of one linear layer, indexed by slot.

    state [S, *state_shape] fp32: committed states, one per state slot.
    buf_key [R, L, *key_shape], buf_value [R, L, *value_shape], buf_gcum [R, L, decay_heads] fp32: buffers.
    conv [R, conv_dim, W-1] (model dtype): the last W-1 committed pre-conv inputs, newest last.
    node_states (the intermediate-state baseline only): one state per node of a verify step, see
        reserve_node_states.
    """

    def __init__(self, spec: LinearLayerSpec, max_requests: int, state_slots: int, flush_length: int,
                 device: torch.device, dtype: torch.dtype, intermediate_states: bool = False):
        self.spec = spec
        self.flush_length = flush_length
        fp32 = dict(device=device, dtype=torch.float32)
        self.state = torch.zeros(state_slots, *spec.state_shape, **fp32)
        self.buf_key = torch.zeros(max_requests, flush_length, *spec.key_shape, **fp32)
        self.buf_value = torch.zeros(max_requests, flush_length, *spec.value_shape, **fp32)
        self.buf_gcum = torch.zeros(max_requests, flush_length, spec.decay_heads, **fp32)
        self.conv = torch.zeros(max_requests, spec.conv_dim, spec.conv_width - 1, device=device, dtype=dtype)
        backend = backend_for(torch.device(device), spec.key_shape[-1], spec.value_shape[-1])
        self._entry_ops = _MIXER_OPS[spec.mixer](backend)  # commit / flush take the same pool arguments
        self._conv_ops = conv_ops(backend)
        # the baseline's ops when the cache runs linear layers with intermediate states (CacheConfig), else None
        self.intermediate = intermediate_ops(spec.mixer, backend) if intermediate_states else None
        # the baseline's node states, reserved once for the widest step (reserve_node_states) as SGLang and vLLM
        # reserve theirs: [max_requests * width * state] fp32, flat, viewed per step; empty until reserved
        self.node_states = torch.zeros(0, **fp32)

    def reserve_node_states(self, rows: int, width: int) -> None:
        """Room for `width` node states of `rows` requests (the intermediate-state baseline's verify steps)."""
        self.node_states = torch.zeros(rows * width * math.prod(self.spec.state_shape), device=self.state.device)

    def node_states_for(self, rows: int, width: int) -> torch.Tensor | None:
        """[rows, width, *state] in the reserved node states, or None (the op allocates) when they do not fit."""
        size = rows * width * math.prod(self.spec.state_shape)
        if width == 1 or size > self.node_states.numel():  # (decode steps write their states in place)
            return None
        return self.node_states[:size].view(rows, width, *self.spec.state_shape)

    def buffers(self, buf_len: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(buf_key, buf_value, buf_gcum, buf_len): the buffer arguments every reference op takes."""
        return self.buf_key, self.buf_value, self.buf_gcum, buf_len

    def reset_request(self, req_slot: int) -> None:
        """A fresh request: zero conv window (= causal zero padding). Its buffer is empty by buf_len = 0."""
        self.conv[req_slot].zero_()

    def zero_state(self, state_slot: int) -> None:
        self.state[state_slot].zero_()

    def flush(self, req_slots: torch.Tensor, state_slots: torch.Tensor, buf_len: torch.Tensor) -> None:
        """Fold the buffers of these requests into their committed states (state_slots >= 0)."""
        self._entry_ops.flush(self.state, state_slots, *self.buffers(buf_len), req_slots)

    def commit(self, scratch: LinearScratch, ctx, accepted: torch.Tensor, num_accepted: torch.Tensor,
               buf_len: torch.Tensor) -> None:
        """Keep the accepted path of every row of the step `ctx` (a StepContext): conv windows first, then the
        entries (tree rows; folded into the state when the buffer fills) or the final state (chunk rows)."""
        self._conv_ops.commit(scratch.conv_input, accepted, num_accepted, self.conv, ctx.req_slots)
        rows = ctx.tree_index
        if ctx.tree_rows.numel() and self.intermediate is not None:
            if scratch.node_states is not None:  # (None: a decode step wrote its states in place)
                self.intermediate.commit(scratch.node_states, accepted[rows], num_accepted[rows], self.state,
                                         ctx.state_slots[rows])
        elif ctx.tree_rows.numel():
            self._entry_ops.commit(
                scratch.key[rows], scratch.value[rows], scratch.gcum[rows], accepted[rows], num_accepted[rows],
                self.state, ctx.state_slots[rows], *self.buffers(buf_len), ctx.req_slots[rows], self.flush_length,
            )
        if ctx.chunk_rows.numel():
            self.state[ctx.state_slots[ctx.chunk_rows]] = scratch.final_state

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.state, self.buf_key, self.buf_value, self.buf_gcum,
                                                            self.conv, self.node_states))
