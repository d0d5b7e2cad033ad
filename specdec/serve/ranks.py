"""`specdec serve --tp N`: requests arrive at rank 0 alone, and every rank's engine must hold the same requests.

Rank 0's engine loop records what it changes in its engine (a request added, with everything that decides its tokens;
a request aborted) and, before each step, sends the other ranks the word to step and those changes, if any
(`Commands.send`: one broadcast of an integer, and one of a few hundred bytes when requests came or went). The other
ranks run `follow`: apply the changes to their own engine in the same order, then step. Request ids are given in
order of addition, so they agree across ranks, and every rank steps the same batch in lockstep: the sharded target's
collectives pair up, and the replicated drafter (drafters/base.py) drafts alike everywhere. Rank 0 alone decodes
text, checks stop strings and answers clients; a request it stops early reaches the others as an abort before the
next step.

While no request is running rank 0 sends an empty tick every half second (the engine loop's idle wait), so the
others never sit in a collective past its timeout; on shutdown it sends STOP and they return.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass

from specdec.parallel import TensorParallel, TensorParallelError, broadcast_int, broadcast_object
from specdec.speculation import SamplingParams

from .drafts import PerRequestDrafts

logger = logging.getLogger("specdec.serve")


@dataclass(frozen=True)
class Add:
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    eos: tuple[int, ...]
    draft_cap: int | None
    request_id: int | None  # rank 0's id for it; None: rank 0's engine refused it (and used up an id or not alike)


@dataclass(frozen=True)
class Abort:
    request_id: int


STEP, TICK, STOP = 0, 1, 2  # what the others do after applying a message's changes
CHANGES = 4  # added to the word when changes follow it


class Commands:
    """Rank 0's record of its engine changes since the last send (nothing is recorded on one rank)."""

    def __init__(self, tp: TensorParallel):
        self.tp = tp
        self.pending: list[Add | Abort] = []

    def add(self, prompt: list[int], params: SamplingParams, max_tokens: int, eos, draft_cap: int | None,
            request_id: int | None) -> None:
        """A request rank 0's engine took (request_id) or refused (None): the others' engines must do the same."""
        if self.tp.size > 1:
            self.pending.append(Add(list(prompt), params, max_tokens, tuple(eos), draft_cap, request_id))

    def abort(self, request_id: int) -> None:
        if self.tp.size > 1:
            self.pending.append(Abort(request_id))

    def send(self, then: int) -> None:
        """`then` (STEP, TICK or STOP) to the other ranks, one integer, and the changes, if any, after it."""
        if self.tp.size > 1:
            broadcast_int(then + (CHANGES if self.pending else 0), self.tp)
            if self.pending:
                broadcast_object(self.pending, self.tp)
                self.pending = []


def follow(llm) -> None:
    """A rank other than 0: mirror rank 0's engine until it sends STOP. A step that fails here is logged; rank 0's
    own step fails alike (the same work) and its aborts of the batch follow."""
    for stop in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C / torchrun stop every rank: this one waits for rank 0's STOP
        signal.signal(stop, signal.SIG_IGN)
    engine = llm.engine
    drafts = None
    if engine.drafter is not None:  # the same per-request caps as rank 0's engine loop puts on its drafter
        drafts = engine.drafter = PerRequestDrafts(engine.drafter)
    while True:
        word = broadcast_int(0, llm.tp)
        then, changes = word % CHANGES, broadcast_object(None, llm.tp) if word >= CHANGES else []
        for change in changes:
            if isinstance(change, Abort):
                engine.abort(change.request_id)
                continue
            try:
                request_id = engine.add_request(change.prompt, change.params, change.max_tokens, change.eos).request_id
            except ValueError:
                request_id = None
            if request_id != change.request_id:
                raise RuntimeError(f"rank {llm.tp.rank}'s engine gave a request id {request_id} where rank 0's gave "
                                   f"{change.request_id}: the ranks' engines no longer hold the same requests")
            if drafts is not None and change.draft_cap is not None and request_id is not None:
                drafts.limit(request_id, change.draft_cap)
        if then == STOP:
            return
        if then == STEP:
            try:
                engine.step()
            except TensorParallelError:
                raise
            except Exception:
                logger.exception("engine step failed on rank %d", llm.tp.rank)
