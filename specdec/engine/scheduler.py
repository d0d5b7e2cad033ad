"""Continuous batching: requests wait in arrival order, join when the cache has a slot for them, and leave (giving
their slots back) as soon as they finish or are aborted."""

from __future__ import annotations

from collections import deque

from specdec.cache.model_cache import KVBufferCache

from .request import Request


class Scheduler:
    def __init__(self, cache: KVBufferCache, max_batch: int | None = None):
        self.cache = cache
        self.max_batch = max_batch or cache.config.max_requests
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def admit(self) -> list[Request]:
        """Move waiting requests into the batch while request slots are free; they need their prefill."""
        admitted = []
        while self.waiting and len(self.running) < self.max_batch and self.cache.free_request_slots:
            request = self.waiting.popleft()
            request.slot = self.cache.allocate_request()
            self.running.append(request)
            admitted.append(request)
        return admitted

    def retire(self) -> list[Request]:
        """Take finished requests out of the batch and free their slots."""
        done = [request for request in self.running if request.finished]
        for request in done:
            self._release(request)
        self.running = [request for request in self.running if not request.finished]
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
