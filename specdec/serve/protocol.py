"""The OpenAI request and response shapes `specdec serve` speaks, and their checks.

Requests are pydantic models that ignore fields they do not know (clients send `user`, `stream_options`, ... and
expect no complaint) but refuse, with a 400 naming the field, every value they cannot honour: n != 1, logprobs,
echo, non-zero penalties. Two extra body fields carry per-request speculation:

    "speculation": false      # plain decoding for this request (the server's drafter skips it)
    "num_draft_tokens": 2     # at most this many drafted tokens per step, up to the server's own budget
"""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class OpenAIError(Exception):
    """An error the client caused (4xx) or the server hit (5xx), sent as {"error": {message, type, param, code}}."""

    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.kind = message, status, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    include_usage: bool = False


class SamplingFields(BaseModel):
    """What both endpoints share: sampling, stop strings, streaming and the speculation extras."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)  # OpenAI's default and range; 0 = greedy
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)  # an extra, as in vLLM and SGLang; 0 = off
    seed: int | None = None
    stop: str | list[str] | None = Field(default=None, validate_default=True)  # -> a list
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    logprobs: bool | int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    speculation: bool = True
    num_draft_tokens: int | None = Field(default=None, ge=0)

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported: send one request per completion you want")
        return n

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, value):
        if value not in (None, False, 0):
            raise ValueError("logprobs are not supported")
        return value

    @field_validator("presence_penalty", "frequency_penalty")
    @classmethod
    def _no_penalties(cls, value: float) -> float:
        if value != 0:
            raise ValueError("presence and frequency penalties are not supported; leave them at 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value):
        if value:
            raise ValueError("logit_bias is not supported")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > 16 or any(not s for s in stops):
            raise ValueError("stop takes up to 16 non-empty strings")
        return stops

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)  # OpenAI's default for completions
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
            if len(prompt) != 1:
                raise ValueError("give one prompt per request (a string or a list of token ids)")
            prompt = prompt[0]
        if not prompt:
            raise ValueError("the prompt is empty")
        return prompt

    @field_validator("echo", "best_of", "suffix")
    @classmethod
    def _unsupported(cls, value, info):
        if value not in (None, False, 1):
            raise ValueError(f"{info.field_name} is not supported")
        return value


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict] | None = None

    def text(self) -> str:
        """The message's text: a string, or the text parts of a list of content parts."""
        if isinstance(self.content, list):
            if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in self.content):
                raise OpenAIError("only text content parts are supported", param="messages")
            return "".join(part["text"] for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def parse(model: type[BaseModel], body: object) -> BaseModel:
    """A JSON body -> the request model, or an OpenAIError naming the first bad field."""
    if not isinstance(body, dict):
        raise OpenAIError("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        message = first["msg"].removeprefix("Value error, ")
        raise OpenAIError(f"{param}: {message}" if param else message, param=param) from None


# ---- responses ----------------------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(rid: str, model: str, text: str, finish_reason: str | None, usage_: dict | None = None,
               chunk: bool = False) -> dict:
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}
    if usage_ is not None or not chunk:
        body["usage"] = usage_
    return body


def chat_completion(rid: str, model: str, text: str, finish_reason: str, usage_: dict) -> dict:
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                         "finish_reason": finish_reason}],
            "usage": usage_}


def chat_chunk(rid: str, model: str, delta: dict, finish_reason: str | None) -> dict:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}


def usage_chunk(rid: str, model: str, obj: str, usage_: dict) -> dict:
    """The last chunk of a stream asked for with stream_options.include_usage: no choices, the usage."""
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [], "usage": usage_}
