"""The engine loop: one background thread owns the engine and steps it while any request is queued or running.

The engine is synchronous and not thread-safe, so nothing else touches it. HTTP handlers (on the asyncio event
loop) hand jobs in through a thread-safe queue (`submit`, `cancel`); the thread adds them to the engine between
steps, so a request arriving mid-generation joins the running batch at the next step (continuous batching; the
engine's scheduler queues what does not fit, in arrival order, and never drops it). After each step it hands every
job its new text through the job's `deliver`, which the handler made thread-safe (loop.call_soon_threadsafe).

A cancelled job (its client went away) is aborted in the engine at once: its request slot, state slot and drafter
state are free for the next step.

Under tensor parallelism this loop runs on rank 0 and tells the other ranks' engines what to do alike before each
step (specdec/serve/ranks.py).
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from specdec.engine.request import Request
from specdec.parallel import TensorParallelError
from specdec.speculation import SamplingParams

from .drafts import PerRequestDrafts
from .metrics import Metrics
from .protocol import OpenAIError, usage
from .ranks import STEP, STOP, TICK, Commands
from .text import IncrementalText

logger = logging.getLogger("specdec.serve")


@dataclass
class Event:
    """What a job hears: admitted (queued on the engine), then text pieces, then a finish reason (stop | length)
    with the usage counts; or an error instead of all of it."""

    text: str = ""
    admitted: bool = False
    finish_reason: str | None = None
    usage: dict | None = None
    error: OpenAIError | None = None


@dataclass(eq=False)
class Job:
    """One HTTP request's generation. draft_cap: drafted tokens per step at most (0: no speculation; None: the
    server's shape). deliver: called from the engine thread, must be thread-safe."""

    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    stop: list[str]
    draft_cap: int | None
    endpoint: str
    deliver: Callable[[Event], None]
    arrived: float = field(default_factory=time.perf_counter)
    request: Request | None = None
    text: IncrementalText | None = None
    tokens_seen: int = 0
    steps_seen: int = 0
    shapes_seen: dict[str, int] = field(default_factory=dict)  # the adaptive shapes already in the metrics


class EngineLoop:
    def __init__(self, llm, metrics: Metrics):
        self.llm = llm
        self.engine = llm.engine
        self.metrics = metrics
        self.tokenizer_lock = threading.Lock()  # the handlers encode, this thread decodes: one at a time
        self.drafts = None
        if self.engine.drafter is not None:  # per-request caps on the one shape the engine drafts
            self.drafts = PerRequestDrafts(self.engine.drafter, metrics.observe_tree)
            self.engine.drafter = self.drafts
        self.eos = llm.eos_token_ids()
        self.commands = Commands(llm.tp)  # what the other ranks' engines must do alike (specdec/serve/ranks.py)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.jobs: dict[int, Job] = {}  # engine request id -> job
        self._stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="specdec-engine", daemon=True)

    # ---- called from the event loop --------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self.inbox.put(None)
        self.thread.join()

    def submit(self, job: Job) -> None:
        self.inbox.put(("add", job))

    def cancel(self, job: Job) -> None:
        self.inbox.put(("abort", job))

    def decode(self, tokens: list[int]) -> str:
        with self.tokenizer_lock:
            return self.llm.tokenizer.decode(tokens, skip_special_tokens=True)

    def observe_pools(self) -> None:
        """Queue, batch and pool gauges, read as they stand (ints read without the engine: at most a step old)."""
        scheduler, cache = self.engine.scheduler, self.engine.runner.cache
        self.metrics.waiting.set(len(scheduler.waiting) + self.inbox.qsize())
        self.metrics.running.set(len(scheduler.running))
        self.metrics.prefilling.set(len(self.engine.prefills.waiting))
        self.metrics.request_slots.set(cache.config.max_requests)
        self.metrics.request_slots_used.set(cache.config.max_requests - cache.free_request_slots)
        self.metrics.state_slots.set(cache.config.state_slots)
        self.metrics.state_slots_used.set(cache.config.state_slots - cache.free_state_slots)

    # ---- the engine thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            self._take_commands(wait=self.engine.scheduler.idle)
            if self.engine.scheduler.idle or self._stopping.is_set():
                self.commands.send(TICK)
                continue
            start = time.perf_counter()
            try:
                self.commands.send(STEP)
                self.engine.step()
                self.metrics.step_seconds.observe(time.perf_counter() - start)
                self._publish()
            except TensorParallelError:  # another rank is gone: no step can run again
                logger.exception("the tensor-parallel group failed; stopping the server")
                self._fail_all(OpenAIError("a tensor-parallel rank failed; see the server log", 500,
                                           kind="server_error"))
                os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful shutdown
                return
            except Exception:  # a bug, not bad input: say so on the console, fail the batch, keep serving
                logger.exception("engine step failed; failing the requests in flight")
                self._fail_all(OpenAIError("the engine failed on this batch; see the server log", 500,
                                           kind="server_error"))
        self._fail_all(OpenAIError("the server is shutting down", 503, kind="server_error"))
        try:
            self.commands.send(STOP)
        except TensorParallelError:
            logger.warning("the other tensor-parallel ranks were gone before the shutdown")

    def _take_commands(self, wait: bool) -> None:
        try:
            command = self.inbox.get(timeout=0.5) if wait else self.inbox.get_nowait()
            while True:
                if command is not None:
                    (self._add if command[0] == "add" else self._abort)(command[1])
                command = self.inbox.get_nowait()
        except queue.Empty:
            pass

    def _add(self, job: Job) -> None:
        try:
            job.request = self.engine.add_request(job.prompt, job.params, job.max_tokens, self.eos)
        except ValueError as error:
            self.commands.add(job.prompt, job.params, job.max_tokens, self.eos, job.draft_cap, None)
            job.deliver(Event(error=OpenAIError(str(error), param="prompt")))
            return
        self.commands.add(job.prompt, job.params, job.max_tokens, self.eos, job.draft_cap, job.request.request_id)
        if self.drafts is not None and job.draft_cap is not None:
            self.drafts.limit(job.request.request_id, job.draft_cap)
        job.text = IncrementalText(self.decode, job.stop)
        self.jobs[job.request.request_id] = job
        self.metrics.prompt_tokens.inc(len(job.prompt))
        job.deliver(Event(admitted=True))

    def _abort(self, job: Job) -> None:
        if job.request is not None and self.jobs.pop(job.request.request_id, None) is not None:
            self.engine.abort(job.request.request_id)
            self.commands.abort(job.request.request_id)
            self.metrics.requests.labels(job.endpoint, "abort").inc()

    def _publish(self) -> None:
        """Hand each job its new text; finish the jobs whose request ended or hit a stop string."""
        for request_id, job in list(self.jobs.items()):
            request = job.request
            new = request.output[job.tokens_seen:]
            if new:
                if job.tokens_seen == 0:
                    self.metrics.first_token_seconds.observe(time.perf_counter() - job.arrived)
                job.tokens_seen += len(new)
                job.text.add(new, final=request.finished)
                self.metrics.generation_tokens.inc(len(new))
            stats = request.stats
            self.metrics.observe_steps(stats.emitted_per_step[job.steps_seen:], stats.drafted_per_step[job.steps_seen:])
            job.steps_seen = len(stats.emitted_per_step)
            self.metrics.observe_shapes(stats.shapes, job.shapes_seen)
            if job.text.stopped and not request.finished:
                self.engine.abort(request_id)  # its slot is free for the next step
                self.commands.abort(request_id)
            if job.text.stopped or request.finished:
                self._finish(job, "stop" if job.text.stopped or request.finish_reason == "eos" else "length")
            else:
                piece = job.text.pending()
                if piece:
                    job.deliver(Event(text=piece))

    def _finish(self, job: Job, reason: str) -> None:
        job.text.add([], final=True)
        self.jobs.pop(job.request.request_id, None)
        self.metrics.requests.labels(job.endpoint, reason).inc()
        self.metrics.request_seconds.observe(time.perf_counter() - job.arrived)
        job.deliver(Event(text=job.text.pending(final=True), finish_reason=reason,
                          usage=usage(len(job.prompt), len(job.request.output))))

    def _fail_all(self, error: OpenAIError) -> None:
        for request_id, job in list(self.jobs.items()):
            self.jobs.pop(request_id)
            self.engine.abort(request_id)
            self.commands.abort(request_id)
            job.deliver(Event(error=error))
