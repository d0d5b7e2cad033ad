"""Continuous batching: requests wait in arrival order, join when the cache has room for them, and leave (giving
their slots back) as soon as they finish or are aborted.

Room means a request slot and, for a request that may ever fold its buffer, a committed-state slot it can count
on: the state pool is the memory budget and is usually smaller than the number of request slots, since short
requests (prompt + new tokens + one draft tree below the flush length) never hold a state. A request that does
not fit waits instead of failing mid-generation."""

from __future__ import annotations

import time
from collections import deque

from specdec.cache.model_cache import KVBufferCache

from .request import Request


class Scheduler:
    def __init__(self, cache: KVBufferCache, draft_budget: int = 0, max_batch: int | None = None):
        self.cache = cache
        self.draft_budget = draft_budget  # drafted nodes per step: a step may commit that many beyond the output
        self.max_batch = max_batch or cache.config.max_requests
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def admit(self) -> list[Request]:
        """Move waiting requests into the batch while request slots are free; they need their prefill."""
        admitted = []
        while self.waiting and len(self.running) < self.max_batch and self.cache.free_request_slots:
            if self.may_fold(self.waiting[0]) and self.state_reservations() >= self.cache.config.state_slots:
                break  # keeps arrival order: the head waits for a committed-state slot
            request = self.waiting.popleft()
            request.slot = self.cache.allocate_request()
            request.stats.admitted = time.perf_counter()
            self.running.append(request)
            admitted.append(request)
        return admitted

    def may_fold(self, request: Request) -> bool:
        """Whether the request can ever fill its buffer to the flush length (and so need a committed state)."""
        most = len(request.prompt) + request.max_new_tokens + self.draft_budget + 1
        return most >= self.cache.config.flush_length

    def state_reservations(self) -> int:
        return sum(self.may_fold(request) for request in self.running)

    def retire(self) -> list[Request]:
        """Take finished requests out of the batch and free their slots (once no step of theirs is in flight)."""
        # (finish_reason, not the finished property: a scan of every running request each step)
        done = [request for request in self.running if request.finish_reason is not None and not request.in_flight]
        if not done:  # most steps: nothing to rebuild
            return done
        for request in done:
            self._release(request)
        gone = set(done)
        self.running = [request for request in self.running if request not in gone]
        return done

    def abort(self, request_id: int) -> Request | None:
        for request in list(self.waiting):
            if request.request_id == request_id:
                self.waiting.remove(request)
                request.finish_reason = "abort"
                return request
        for request in self.running:
            if request.request_id == request_id:
                request.finish_reason = "abort"
                self._release(request)
                self.running.remove(request)
                return request
        return None

    def _release(self, request: Request) -> None:
        if request.slot is not None:
            self.cache.release_request(request.slot)
            request.slot = None

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running
