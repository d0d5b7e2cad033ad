"""Per linear-attention layer pools: committed states, KVBuffer entries, conv windows; and the layer's ops."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.backend import backend_for, chunk_prefill, conv_ops, gdn_ops, intermediate_ops, mamba2_ops

from .linear_state import IntermediateStates, KVBufferState, MixerInputs, TreeScratch
from .spec import LinearLayerSpec

_MIXER_OPS = {"gdn": gdn_ops, "mamba2": mamba2_ops}


@dataclass
class LinearScratch:
    """What one linear layer computed in a step and commit needs.

    conv_input [B, T, conv_dim]: pre-conv inputs of every node (the conv windows of later tokens); None in a prefill
        step, whose windows the forward wrote.
    tree: what the linear state keeps from the tree rows (linear_state.TreeScratch), None without tree rows.
    final_state [B_chunk, *state]: the state after a chunked prefill (chunk rows only) where the commit writes it;
        None in a prefill step, whose forward wrote it.
    """

    conv_input: torch.Tensor | None
    tree: TreeScratch | None = None
    final_state: torch.Tensor | None = None


class LinearLayerPool:
    """Tensors of one linear layer, indexed by slot, and the ops that read and write them.

    state [S, *state_shape] fp32: committed states, one per state slot.
    buf_key [R, L, *key_shape], buf_value [R, L, *value_shape], buf_gcum [R, L, decay_heads] fp32: buffers (L = 0
        for intermediate states).
    conv [R, W-1, conv_dim] (model dtype): the last W-1 committed pre-conv inputs, newest last (columns first: each
    a contiguous vector of channels for the kernels, verify_kernels/conv/naive.py).
    linear_state: KVBufferState or IntermediateStates (specdec/cache/linear_state.py), by `linear_state`.
    conv_ops / chunk_prefill: the kernel backend's ops for this layer (specdec/backend.py), picked once here.
    """

    def __init__(self, spec: LinearLayerSpec, max_requests: int, state_slots: int, flush_length: int,
                 device: torch.device, dtype: torch.dtype, linear_state: str = "kvbuffer"):
        self.spec = spec
        self.flush_length = flush_length
        fp32 = dict(device=device, dtype=torch.float32)
        self.state = torch.zeros(state_slots, *spec.state_shape, **fp32)
        entries = flush_length if linear_state == "kvbuffer" else 0  # intermediate states buffer nothing
        self.buf_key = torch.zeros(max_requests, entries, *spec.key_shape, **fp32)
        self.buf_value = torch.zeros(max_requests, entries, *spec.value_shape, **fp32)
        self.buf_gcum = torch.zeros(max_requests, entries, spec.decay_heads, **fp32)
        self.conv = torch.zeros(max_requests, spec.conv_width - 1, spec.conv_dim, device=device, dtype=dtype)
        backend = backend_for(torch.device(device), spec.key_shape[-1], spec.value_shape[-1])
        ops = _MIXER_OPS[spec.mixer](backend)
        self.conv_ops = conv_ops(backend)
        self.chunk_prefill = chunk_prefill(spec.mixer, backend, dtype)
        if linear_state == "kvbuffer":
            self.linear_state = KVBufferState(self, ops)
        else:
            self.linear_state = IntermediateStates(self, intermediate_ops(spec.mixer, backend))

    def buffers(self, buf_len: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(buf_key, buf_value, buf_gcum, buf_len): the buffer arguments every KVBuffer op takes."""
        return self.buf_key, self.buf_value, self.buf_gcum, buf_len

    def reset_request(self, req_slot: int) -> None:
        """A fresh request: zero conv window (= causal zero padding). Its buffer is empty by buf_len = 0."""
        self.conv[req_slot].zero_()

    def flush(self, req_slots: torch.Tensor, state_slots: torch.Tensor, buf_len: torch.Tensor) -> None:
        """Fold the buffers of these requests into their committed states (state_slots >= 0)."""
        self.linear_state.flush(req_slots, state_slots, buf_len)

    def short_conv(self, ctx, conv_input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             activation: str | None) -> torch.Tensor:
        """The layer's short conv of the step's nodes, conv_input [B, T, conv_dim] -> [B, T, conv_dim]; a step that
        commits in its forward (plain decoding, one node per row) also appends its node to the conv window, in the
        same op (one kernel: the window read once)."""
        if ctx.commit_in_forward:
            return self.conv_ops.decode(conv_input, ctx.num_nodes, self.conv, ctx.req_slots, weight, bias, activation)
        sources = ctx.window_sources(self.conv.shape[1] + 1) if self.conv_ops.reads_sources else None
        return self.conv_ops.tree(conv_input, ctx.parents, ctx.num_nodes, self.conv, ctx.req_slots, weight, bias,
                                  activation, sources=sources)

    def short_conv_qkv(self, ctx, conv_input: torch.Tensor, weight: torch.Tensor, heads, q_scale: float,
                       qk_dtype: torch.dtype | None, qk_storage: torch.dtype | None, gates=None):
        """The Gated DeltaNet's short_conv (SiLU, no bias) and its q / k / v split in one op (conv.QKVHeads heads;
        glue gdn_qkv's q_scale, qk_dtype and qk_storage) -> (q [B, T, H, K], k, v [B, T, HV, V]), and with gates
        (conv.GateInputs) its gates (g, beta) [B, T, HV] after them, in the same op."""
        split = dict(heads=heads, q_scale=q_scale, qk_dtype=qk_dtype, qk_storage=qk_storage, gates=gates)
        if ctx.commit_in_forward:
            return self.conv_ops.decode_qkv(conv_input, ctx.num_nodes, self.conv, ctx.req_slots, weight, None, "silu",
                                            **split)
        sources = ctx.window_sources(self.conv.shape[1] + 1) if self.conv_ops.reads_sources else None
        return self.conv_ops.tree_qkv(conv_input, ctx.parents, ctx.num_nodes, self.conv, ctx.req_slots, weight, None,
                                      "silu", sources, **split)

    def score(self, ctx, inputs: MixerInputs, conv_input: torch.Tensor,
              buf_len: torch.Tensor) -> tuple[torch.Tensor, LinearScratch | None]:
        """Every row of the step -> (outputs [B, T, heads, head_dim] fp32, what commit needs; None when the step
        commits in the forward, ctx.commit_in_forward: plain decoding, the state here, the conv window in short_conv()).
        Tree rows go through the linear state; chunk rows (prompts longer than the buffer) through the chunked
        prefill, which starts from the committed state and ends with the row's new one. Right padding of chunk rows
        leaves the state untouched (zero decay and input), so the final state is the one at each row's end.
        A prefill step keeps every node (ctx.prefill: commit_all follows), so its forward writes the conv windows
        and the chunk rows' states here (this layer's conv ran before, and the chunk rows read their states just
        above), leaving the commit only the tree rows' entries: kept until the commit, a prefill of 16384 tokens
        held 12.9 GB of them by their sizes at Qwen3.5-9B's shapes (128 prompts of 128 tokens: every GDN layer's
        conv inputs and chunk rows' states; on an H100 its prefill phase reserved 16.3 GiB, now 4.4)."""
        if ctx.commit_in_forward:  # plain decoding: every row's one node is accepted, commit its state now
            return self.linear_state.decode_commit(ctx, inputs, buf_len), None
        scratch = LinearScratch(conv_input=None if ctx.prefill else conv_input)
        if ctx.prefill:
            self.conv_ops.commit(conv_input, *ctx.every_node(), self.conv, ctx.req_slots)
        tree_out = chunk_out = None
        if ctx.tree_rows.numel():
            tree_out, scratch.tree = self.linear_state.score(ctx, inputs, buf_len)
        if ctx.chunk_rows.numel():
            rows = ctx.chunk_rows
            chunk_out, final_state = self.chunk_prefill(
                *inputs.masked(rows, ctx.valid[rows]), initial_state=self.state[ctx.state_slots[rows]])
            if ctx.prefill:
                self.state[ctx.state_slots[rows]] = final_state
            else:
                scratch.final_state = final_state
        if chunk_out is None:
            return tree_out, scratch
        if tree_out is None:
            return chunk_out, scratch
        out = torch.empty(ctx.parents.shape + tree_out.shape[2:], device=tree_out.device)
        out[ctx.tree_rows], out[ctx.chunk_rows] = tree_out, chunk_out
        return out, scratch

    def commit(self, scratch: LinearScratch, ctx, accepted: torch.Tensor, num_accepted: torch.Tensor,
               buf_len: torch.Tensor) -> None:
        """Keep the accepted path of every row of the step `ctx` (a StepContext): conv windows first, then the
        tree rows through the linear state, or the final state (chunk rows)."""
        if scratch.conv_input is not None:
            self.conv_ops.commit(scratch.conv_input, accepted, num_accepted, self.conv, ctx.req_slots)
        if scratch.tree is not None:
            self.linear_state.commit(scratch.tree, ctx, accepted, num_accepted, buf_len)
        if scratch.final_state is not None:
            self.state[ctx.state_slots[ctx.chunk_rows]] = scratch.final_state

    def nbytes(self) -> int:
        tensors = (self.state, self.buf_key, self.buf_value, self.buf_gcum, self.conv)
        return sum(t.numel() * t.element_size() for t in tensors) + self.linear_state.nbytes()
