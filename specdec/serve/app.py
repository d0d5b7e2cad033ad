"""The ASGI app: OpenAI-compatible routes over one EngineLoop.

    POST /v1/completions, /v1/chat/completions   (stream: server-sent events, `data: {...}` ... `data: [DONE]`)
    GET  /v1/models, /health, /metrics

Every error a client can cause is a 4xx in OpenAI's shape, {"error": {"message", "type", "param", "code"}}; an
unexpected one is a 500 in the same shape, its traceback on the server's log only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from specdec.speculation import SamplingParams

from . import protocol
from .loop import EngineLoop, Event, Job
from .metrics import Metrics
from .protocol import ChatCompletionRequest, CompletionRequest, OpenAIError


class Server:
    """llm: a loaded specdec.LLM (the engine loop takes its engine over); model_name: what /v1/models lists and
    requests must name."""

    def __init__(self, llm, model_name: str):
        if llm.tokenizer is None:
            raise ValueError("specdec serve needs a checkpoint with a tokenizer")
        self.llm = llm
        self.model_name = model_name
        shape = llm.engine.config.shape
        self.draft_budget = llm.engine.scheduler.draft_budget  # drafted nodes per step; 0 without a drafter
        self.metrics = Metrics(max_depth=shape.steps if self.draft_budget else 0)
        self.loop = EngineLoop(llm, self.metrics)
        self.created = int(time.time())
        routes = [Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
                  Route("/v1/models", self.models, methods=["GET"]),
                  Route("/health", self.health, methods=["GET"]),
                  Route("/metrics", self.render_metrics, methods=["GET"])]
        handlers = {OpenAIError: self.openai_error, HTTPException: self.http_error, Exception: self.server_error}
        self.app = Starlette(routes=routes, exception_handlers=handlers, lifespan=self.lifespan)

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.loop.start()
        try:
            yield
        finally:
            await asyncio.to_thread(self.loop.stop)

    # ---- routes ----------------------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        body = protocol.parse(CompletionRequest, await read_json(request))
        self.check_model(body.model)
        prompt = body.prompt
        with self.loop.tokenizer_lock:
            tokens = self.llm.encode(prompt) if isinstance(prompt, str) else list(prompt)
        job = self.make_job(body, tokens, body.max_tokens, "completions", "prompt")
        rid = protocol.new_id("cmpl")
        if body.stream:
            def chunk(text, reason):
                return protocol.completion(rid, body.model, text, reason, chunk=True)

            return await self.stream(job, body, chunk, lambda: None, "text_completion", rid)
        text, final = await self.collect(request, job)
        return JSONResponse(protocol.completion(rid, body.model, text, final.finish_reason, final.usage))

    async def chat_completions(self, request: Request) -> Response:
        body = protocol.parse(ChatCompletionRequest, await read_json(request))
        self.check_model(body.model)
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        tokens = self.encode_chat(messages)
        job = self.make_job(body, tokens, body.token_limit, "chat", "messages")
        rid = protocol.new_id("chatcmpl")
        if body.stream:
            def chunk(text, reason):
                return protocol.chat_chunk(rid, body.model, {"content": text} if text or not reason else {}, reason)

            def first():
                return protocol.chat_chunk(rid, body.model, {"role": "assistant", "content": ""}, None)

            return await self.stream(job, body, chunk, first, "chat.completion.chunk", rid)
        text, final = await self.collect(request, job)
        return JSONResponse(protocol.chat_completion(rid, body.model, text, final.finish_reason, final.usage))

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "specdec"}]})

    async def health(self, request: Request) -> Response:
        alive = self.loop.thread.is_alive()
        return JSONResponse({"status": "ok" if alive else "engine stopped"}, status_code=200 if alive else 503)

    async def render_metrics(self, request: Request) -> Response:
        self.loop.observe_pools()
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # ---- requests -> jobs ------------------------------------------------------------------------------------
    def check_model(self, model: str) -> None:
        if model != self.model_name:
            raise OpenAIError(f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                              status=404, param="model", code="model_not_found")

    def encode_chat(self, messages: list[dict]) -> list[int]:
        tokenizer = self.llm.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise OpenAIError("this model's tokenizer has no chat template: use /v1/completions", param="messages")
        try:
            with self.loop.tokenizer_lock:
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                return tokenizer.encode(text, add_special_tokens=False)
        except Exception as error:  # a template that rejects the conversation (roles out of order, ...)
            raise OpenAIError(f"the chat template rejected these messages: {error}", param="messages") from None

    def make_job(self, body, tokens: list[int], max_tokens: int | None, endpoint: str, prompt_param: str) -> Job:
        """Everything checked before the engine sees it: the prompt fits, sampling and speculation are valid."""
        engine = self.llm.engine
        if max_tokens is None:  # as much as the cache and the context leave
            limits = [engine.config.cache.max_seq_len - self.draft_budget - 1, engine.context_length or 2**31]
            max_tokens = max(min(limits) - len(tokens), 1)
        vocab = engine.target.hf_config.vocab_size
        if not all(isinstance(t, int) and 0 <= t < vocab for t in tokens):
            raise OpenAIError(f"{prompt_param}: token ids must lie in [0, {vocab}) for this model", param=prompt_param)
        try:
            engine.check_request(tokens, max_tokens)
        except ValueError as error:
            raise OpenAIError(str(error), param=prompt_param, code="context_length_exceeded") from None
        params = SamplingParams(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, seed=body.seed)
        return Job(tokens, params, max_tokens, body.stop, self.draft_cap(body), endpoint, deliver=None)

    def draft_cap(self, body) -> int | None:
        if not body.speculation:
            return 0
        if body.num_draft_tokens is not None and body.num_draft_tokens > self.draft_budget:
            raise OpenAIError(f"num_draft_tokens: at most {self.draft_budget} on this server (its --num-steps, "
                              "--topk and --num-draft-tokens)", param="num_draft_tokens")
        return body.num_draft_tokens

    # ---- jobs -> responses -----------------------------------------------------------------------------------
    async def start(self, job: Job) -> asyncio.Queue:
        """Queue the job on the engine; returns its event queue once the engine took it (raises its error)."""
        events: asyncio.Queue[Event] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def deliver(event: Event) -> None:
            with contextlib.suppress(RuntimeError):  # the event loop closed: nobody is listening
                loop.call_soon_threadsafe(events.put_nowait, event)

        job.deliver = deliver
        self.loop.submit(job)
        first = await events.get()
        if first.error is not None:
            raise first.error
        return events

    async def collect(self, request: Request, job: Job) -> tuple[str, Event]:
        """The whole answer; a client that goes away before it is done cancels the job."""
        events = await self.start(job)
        gone = asyncio.ensure_future(wait_disconnect(request))
        pieces = []
        try:
            while True:
                getter = asyncio.ensure_future(events.get())
                await asyncio.wait([getter, gone], return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    self.loop.cancel(job)
                    raise OpenAIError("the client went away", status=499, kind="client_closed")
                event = getter.result()
                if event.error is not None:
                    raise event.error
                pieces.append(event.text)
                if event.finish_reason is not None:
                    return "".join(pieces), event
        finally:
            gone.cancel()

    async def stream(self, job: Job, body, chunk, first, obj: str, rid: str) -> Response:
        """Server-sent events: a chunk per piece of text, the finish reason, the usage if asked, [DONE]. When the
        client disconnects, Starlette cancels the generator: `finally` cancels the job."""
        events = await self.start(job)

        async def sse():
            try:
                opening = first()
                if opening is not None:
                    yield sse_line(opening)
                while True:
                    event = await events.get()
                    if event.error is not None:
                        yield sse_line(event.error.body())
                        break
                    if event.text or event.finish_reason is not None:
                        yield sse_line(chunk(event.text, event.finish_reason))
                    if event.finish_reason is not None:
                        if body.include_usage:
                            yield sse_line(protocol.usage_chunk(rid, body.model, obj, event.usage))
                        break
                yield "data: [DONE]\n\n"
            finally:
                self.loop.cancel(job)  # a no-op once the job finished

        # the background task also cancels a job whose client left before the generator first ran
        return StreamingResponse(sse(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                                 background=BackgroundTask(self.loop.cancel, job))

    # ---- errors ----------------------------------------------------------------------------------------------
    async def openai_error(self, request: Request, error: OpenAIError) -> Response:
        if 400 <= error.status < 499:  # 499: the client went away, no one to answer
            self.metrics.rejected.inc()
        return JSONResponse(error.body(), status_code=error.status)

    async def http_error(self, request: Request, error: HTTPException) -> Response:
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return JSONResponse(OpenAIError(str(error.detail), error.status_code, kind=kind).body(),
                            status_code=error.status_code)

    async def server_error(self, request: Request, error: Exception) -> Response:
        """A bug: the client gets a 500 in OpenAI's shape; Starlette re-raises, so uvicorn logs the traceback."""
        return JSONResponse(OpenAIError("internal server error; see the server log", 500, kind="server_error").body(),
                            status_code=500)


async def read_json(request: Request) -> object:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise OpenAIError(f"the request body is not valid JSON: {error}") from None


async def wait_disconnect(request: Request) -> None:
    """Returns when the client disconnects (the body has been read: the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def sse_line(payload: dict) -> str:
    return f"data: {json.dumps(payload)}\n\n"
