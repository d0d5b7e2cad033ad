"""The KVBuffer cache of one model: request slots, lazily allocated committed states, step set-up and commit.

Per request and linear layer: a committed state (taken from the state pool only when the request first
flushes), a buffer of up to L-1 recent entries and the conv window; per full-attention layer: a KV row.
The buffer fill and the committed length are per request (all layers flush together).
"""

from __future__ import annotations

import torch

from verify_kernels.tree import ancestor_mask

from .attention_pool import AttentionLayerPool
from .host_buffer import DeviceMirror
from .linear_pool import LinearLayerPool
from .spec import CacheConfig, ModelCacheSpec
from .step import StepBatch, StepContext, positions_for


class CacheFullError(RuntimeError):
    """No free request or state slot; the caller should wait for a request to finish (or enlarge the pools)."""


class KVBufferCache:
    def __init__(self, spec: ModelCacheSpec, config: CacheConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32):
        self.spec = spec
        self.config = config
        self.device = torch.device(device)
        self.linear = [
            LinearLayerPool(layer, config.max_requests, config.state_slots, config.flush_length, self.device, dtype,
                            config.linear_state)
            for layer in spec.linear
        ]
        self.attention = [
            AttentionLayerPool(layer, config.max_requests, config.max_seq_len, self.device, dtype)
            for layer in spec.attention
        ]
        # Host-side bookkeeping is the truth; `buf_len_device` mirrors buf_len for the ops (sent without waiting for
        # the device: a copy from pageable memory would synchronise with it every step)
        self._buf_len = DeviceMirror(config.max_requests, 0, self.device)
        self.buf_len, self.buf_len_device = self._buf_len.values, self._buf_len.device_values
        self.seq_len = [0] * config.max_requests
        self.state_slot = [-1] * config.max_requests
        self._free_requests = list(range(config.max_requests - 1, -1, -1))
        self._free_states = list(range(config.state_slots - 1, -1, -1))
        self._active: set[int] = set()

    def reserve(self, width: int) -> None:
        """Whatever the linear state needs for steps of up to `width` nodes in every request slot, reserved once
        (intermediate states: one state per node; the KVBuffer: nothing)."""
        for layer in self.linear:
            layer.linear_state.reserve(self.config.max_requests, width)

    # ---- slots -------------------------------------------------------------------------------------------
    @property
    def free_request_slots(self) -> int:
        return len(self._free_requests)

    @property
    def free_state_slots(self) -> int:
        return len(self._free_states)

    def allocate_request(self) -> int:
        if not self._free_requests:
            raise CacheFullError(
                f"all {self.config.max_requests} request slots are in use; release a finished request first "
                "or build the cache with a larger CacheConfig.max_requests"
            )
        slot = self._free_requests.pop()
        self._active.add(slot)
        self.buf_len[slot] = 0
        self.seq_len[slot] = 0
        self.state_slot[slot] = -1
        for layer in self.linear:
            layer.reset_request(slot)
        self._sync_buf_len()
        return slot

    def release_request(self, slot: int) -> None:
        self._check_active(slot)
        if self.state_slot[slot] >= 0:
            self._free_states.append(self.state_slot[slot])
            self.state_slot[slot] = -1
        self._active.remove(slot)
        self._free_requests.append(slot)

    def committed_rows(self, slots: list[int]) -> tuple[list[int], list[int]]:
        """Host-side view of these request slots: (committed lengths, state slots, -1 for none)."""
        return list(map(self.seq_len.__getitem__, slots)), list(map(self.state_slot.__getitem__, slots))

    def committed_length(self, slot: int) -> int:
        self._check_active(slot)
        return self.seq_len[slot]

    def _check_active(self, slot: int) -> None:
        if slot not in self._active:
            raise ValueError(f"request slot {slot} is not allocated; call allocate_request() first")

    def _take_state_slots(self, req_slots: list[int]) -> None:
        """A zeroed committed-state slot for each of these requests (none of which holds one yet): all or none.
        Every layer's slot is zeroed in one multi-tensor launch (a zero_() per layer and request cost a launch each
        on the step's path: 24 per request at Qwen3.5-9B's GDN layers)."""
        if not req_slots:
            return
        if len(req_slots) > len(self._free_states):
            raise CacheFullError(
                f"all {self.config.state_slots} committed-state slots are in use; a request that flushes its "
                "buffer needs one. Release a request or raise CacheConfig.num_state_slots"
            )
        state_slots = [self._free_states.pop() for _ in req_slots]
        if self.linear:
            torch._foreach_zero_([layer.state[s] for layer in self.linear for s in state_slots])
        for req_slot, state_slot in zip(req_slots, state_slots, strict=True):
            self.state_slot[req_slot] = state_slot

    def _sync_buf_len(self) -> None:
        self._buf_len.sync()

    # ---- steps -------------------------------------------------------------------------------------------
    def check_step(self, batch: StepBatch) -> list[int]:
        """Every row's slot is allocated and its nodes fit the row (host-side only); -> num_nodes per row."""
        if not self._active.issuperset(batch.req_slots):
            for slot in batch.req_slots:
                self._check_active(slot)  # raises for the first one that is not
        num_nodes = batch.node_counts
        longest = self.config.max_seq_len - batch.width  # committed tokens a row may hold before this step
        if max(map(self.seq_len.__getitem__, batch.req_slots)) <= longest:
            return num_nodes
        for slot, count in zip(batch.req_slots, num_nodes, strict=True):
            if self.seq_len[slot] + batch.width > self.config.max_seq_len:
                raise ValueError(
                    f"request slot {slot} would reach {self.seq_len[slot] + count} tokens (+ padding to "
                    f"{batch.width}) but the cache holds {self.config.max_seq_len} per request; shorten the "
                    "prompt or max_new_tokens, or raise CacheConfig.max_seq_len"
                )
        return num_nodes

    def begin_step(self, batch: StepBatch, kv_len: int | None = None) -> StepContext:
        """Check the batch against the pools and build the per-step context for the forward. kv_len: key
        positions the attention layers read (default: just enough for the longest row; a captured step reads
        max_seq_len so that its shapes never change)."""
        num_nodes = self.check_step(batch)
        flush_length = self.config.flush_length
        chunk = [batch.prefill and self.buf_len[s] + n >= flush_length
                 for s, n in zip(batch.req_slots, num_nodes, strict=True)]
        chunk_slots = [s for s, c in zip(batch.req_slots, chunk, strict=True) if c]
        self._prepare_chunked_prefill(chunk_slots)

        device = self.device
        req_slots = torch.tensor(batch.req_slots, dtype=torch.long, device=device)
        parents = batch.parents.to(device)
        node_counts = batch.num_nodes.to(device)
        seq_lens = torch.tensor([self.seq_len[s] for s in batch.req_slots], dtype=torch.long, device=device)
        if kv_len is None:
            kv_len = int(seq_lens.max()) + batch.width
        rows = torch.arange(len(chunk), device=device)
        tree = ancestor_mask(parents, node_counts)  # [B, T, T], validates the trees
        chunk_mask = torch.tensor(chunk, dtype=torch.bool, device=device)
        return StepContext(
            batch=batch,
            req_slots=req_slots,
            state_slots=torch.tensor([self.state_slot[s] for s in batch.req_slots], dtype=torch.long, device=device),
            parents=parents,
            num_nodes=node_counts,
            positions=positions_for(seq_lens, tree),
            seq_lens=seq_lens,
            ancestors=tree,
            kv_len=kv_len,
            chunk_rows=rows[chunk_mask],
            tree_rows=rows[~chunk_mask],
        )

    def begin_decode(self, batch: StepBatch, kv_len: int | None = None) -> tuple[StepContext, list[bool]]:
        """A plain decoding step (one node per row, accepted by construction), which commits in its forward: the
        host half of its commit first (prepare_commit: the state slots of the rows whose buffer fills), then its
        context. -> (context, which rows fold: finish_decode takes them after the forward)."""
        if batch.prefill or batch.width != 1:
            raise ValueError("a decode step has one node per row and is no prefill")
        self.check_step(batch)
        folds = self.prepare_commit(batch.req_slots, [1] * len(batch.req_slots), [True] * len(batch.req_slots))
        ctx = self.begin_step(batch, kv_len)
        ctx.commit_in_forward = True
        ctx.every_row_folds = bool(folds) and all(folds)
        return ctx, folds

    @property
    def decode_folds_apart(self) -> bool:
        """Whether a decode step in which every row folds launches other ops than the others (a linear layer's
        MixerOps.decode_commit_folding): CUDA graphs then capture a decode step of each kind."""
        return any(getattr(layer.linear_state.ops, "decode_commit_folding", None) is not None
                   for layer in self.linear)

    def finish_decode(self, slots: list[int], folds: list[bool]) -> None:
        """After a decode step's forward: committed lengths and buffer fills (finish_commit of one node per row)."""
        self.finish_commit(slots, [1] * len(slots), folds)

    def _prepare_chunked_prefill(self, req_slots: list[int]) -> None:
        """Rows about to be prefilled chunkwise start from a committed state with an empty buffer: give them a
        state slot and fold what their buffer holds (this changes no result, only where the past is kept)."""
        if not req_slots:
            return
        self._take_state_slots([slot for slot in req_slots if self.state_slot[slot] < 0])
        with_entries = [s for s in req_slots if self.buf_len[s] > 0]
        if with_entries:
            slots = torch.tensor(with_entries, dtype=torch.long, device=self.device)
            states = torch.tensor([self.state_slot[s] for s in with_entries], dtype=torch.long, device=self.device)
            for layer in self.linear:
                layer.flush(slots, states, self.buf_len_device)
            for slot in with_entries:
                self.buf_len[slot] = 0
            self._sync_buf_len()

    def commit(self, ctx: StepContext, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """Keep, per row, the accepted root-to-leaf path: accepted [B, A] node indices root first (-1 padded),
        num_accepted [B]. Buffers that would reach L entries fold into the committed state."""
        slots = ctx.batch.req_slots
        counts = num_accepted.tolist()
        accepted = accepted.to(self.device)
        num_accepted = num_accepted.to(self.device)
        tree_rows = set(ctx.tree_rows.tolist())
        folds = self.prepare_commit(slots, counts, [row in tree_rows for row in range(len(slots))])
        ctx.state_slots = torch.tensor([self.state_slot[s] for s in slots], dtype=torch.long, device=self.device)

        self.commit_layers(ctx, accepted, num_accepted)
        self.finish_commit(slots, counts, folds)
        ctx.scratch.clear()

    def commit_layers(self, ctx: StepContext, accepted: torch.Tensor, num_accepted: torch.Tensor) -> None:
        """The device half of a commit, the same eagerly and inside a CUDA graph (no host work, no syncs): every
        layer keeps each row's accepted path. ctx.state_slots must already hold the slots prepare_commit took."""
        for index, layer in enumerate(self.linear):
            layer.commit(ctx.scratch[index], ctx, accepted, num_accepted, self.buf_len_device)
        for layer in self.attention:
            layer.commit(ctx, accepted, num_accepted)

    def prepare_commit(self, slots: list[int], counts: list[int], tree_rows: list[bool]) -> list[bool]:
        """Host side, before the commit ops: which rows' buffers fold (tree rows whose buffer would reach L
        entries; chunk rows always end with an empty buffer), with a state slot taken for each first fold."""
        folds = [not tree or fold for fold, tree in zip(self.folding(slots, counts), tree_rows, strict=True)]
        self._take_state_slots([slot for slot, fold, tree in zip(slots, folds, tree_rows, strict=True)
                                if tree and fold and self.state_slot[slot] < 0])
        return folds

    def folding(self, slots: list[int], counts: list[int]) -> list[bool]:
        """Whether each row's buffer folds when `counts` entries are committed to it (it would reach L)."""
        flush = self.config.flush_length
        return [self.buf_len[slot] + count >= flush for slot, count in zip(slots, counts, strict=True)]

    def return_states(self, req_slots: list[int]) -> None:
        """Give back the state slots these requests took for a fold that did not happen (still zeroed: a commit
        prepared for every node, of which fewer were accepted)."""
        for slot in req_slots:
            if self.state_slot[slot] < 0:
                raise ValueError(f"request slot {slot} holds no state slot to give back")
            self._free_states.append(self.state_slot[slot])
            self.state_slot[slot] = -1

    def finish_commit(self, slots: list[int], counts: list[int], folds: list[bool] | None = None) -> list[bool]:
        """Host side, after the commit ops: committed lengths and buffer fills, mirrored to the device. folds: which
        rows folded (None: those whose buffer reached the flush length, as folding says, worked out in the same pass:
        one loop over the rows fewer between a speculative step's acceptance read and the next launch). -> folds."""
        seq_len, buf_len = self.seq_len, self.buf_len
        if folds is None:
            flush, folds = self.config.flush_length, []
            for slot, count in zip(slots, counts, strict=True):
                seq_len[slot] += count
                filled = buf_len[slot] + count
                folds.append(filled >= flush)
                buf_len[slot] = 0 if filled >= flush else filled
        else:
            for slot, count, fold in zip(slots, counts, folds, strict=True):
                seq_len[slot] += count
                buf_len[slot] = 0 if fold else buf_len[slot] + count
        self._sync_buf_len()
        return folds

    def commit_all(self, ctx: StepContext) -> None:
        """Commit every node of every row (prefill, or plain decoding of one token per row)."""
        self.commit(ctx, *ctx.every_node())

    def nbytes(self) -> int:
        return sum(layer.nbytes() for layer in self.linear) + sum(layer.nbytes() for layer in self.attention)
