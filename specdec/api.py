"""The Python API: `specdec.LLM` keeps a target (and a drafter) loaded across calls; `specdec.generate` is the
one-call form.

    llm = specdec.LLM("qwen3.5", draft="small")
    for out in llm.generate(["The capital of France is"], max_new_tokens=32):
        print(out.text, out.stats.mean_accepted_length)
"""

from __future__ import annotations

import copy
import inspect
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from numbers import Integral, Real

import torch

from drafters import DraftContext, Drafter, make_drafter, parse_draft
from specdec.cache.budget import cache_for_budget
from specdec.cache.spec import CacheConfig
from specdec.engine.engine import Engine, EngineConfig
from specdec.engine.request import Request, RequestStats
from specdec.models import load_model
from specdec.models.checkpoint import resolve_checkpoint
from specdec.models.tokenizer import load_tokenizer
from specdec.parallel import join, rank_device
from specdec.presets import eagle3_head_for, resolve, small_draft_for
from specdec.speculation import Acceptance, SamplingParams
from specdec.speculation.adaptive import StepCostPrior

Prompt = str | Sequence[int]


@dataclass
class Output:
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str | None
    finish_reason: str
    stats: RequestStats

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / max(self.stats.seconds, 1e-9)


class LLM:
    """A target model, its tokenizer and an optional drafter, loaded once for many calls.

    target: a family alias (configs/models.json; the default "qwen3.5" is the small trained Qwen3.5 shipped in
        specdec/checkpoints), a hub id or a directory.
    draft: None (plain decoding), a name drafters/registry.py knows ("ngram", "mtp", "eagle3", "eagle3:PATH",
        "small", or any alias / hub id / directory of a draft model of the target's family), or a Drafter.
    config: the target's cache (CacheConfig: request slots, lengths, flush length, state slots, linear state),
        the tree shape drafters propose (TreeShape) and CUDA graphs (on a GPU the target's and the draft model's
        decode / verify steps replay from graphs unless cuda_graphs=False). A draft model gets the same request
        slots and lengths, and the target's flush length (16 when the target keeps intermediate states).
    state_memory_gb: size the committed-state pool to this budget instead of config.cache.num_state_slots.
    acceptance: who decides which drafts are kept (default: the target, losslessly).
    tp: tensor-parallel ranks (specdec.parallel): the target sharded over `tp` GPUs of this host, the drafter
        replicated (drafters/base.py says why; adaptive speculation's ranks plan from rank 0's step times, so
        alike: specdec/parallel/__init__.py); the process must be one of `tp` ranks
        (`specdec ... --tp N` or torchrun), each running the same calls; device "cuda" (or None) means the rank's
        own GPU.
    step_cost: with config.speculation = "adaptive", the prior cost of a step, (batch, width, context) -> seconds
        (default flat: each shape is measured before it is trusted; `specdec run`, `serve` and `eval` give a GPU
        engine the roofline of its step at the peaks measured there, specdec/eval/step_cost.py with_device_prior).
    """

    def __init__(self, target: str | os.PathLike = "qwen3.5", draft: str | os.PathLike | Drafter | None = None, *,
                 device: str | None = None,
                 dtype: str | torch.dtype | None = None, config: EngineConfig = EngineConfig(),
                 state_memory_gb: float | None = None, acceptance: Acceptance | None = None,
                 step_cost: StepCostPrior | None = None, tp: int = 1):
        check_device(device)
        if state_memory_gb is not None and not state_memory_gb > 0:
            raise ValueError(f"state_memory_gb must be > 0 (the GiB of GPU memory for committed states), got "
                             f"{state_memory_gb}")
        target = os.fspath(target)  # (a checkpoint directory may come as a Path)
        if isinstance(draft, os.PathLike):
            draft = os.fspath(draft)
        target_path = resolve_checkpoint(resolve(target))
        if isinstance(draft, str):  # a misspelt drafter fails here, before any model loads
            check_draft_name(target, draft)
        self.tp = join(tp)
        if self.tp.size > 1 and device in (None, "cuda"):
            device = str(rank_device(self.tp))
        self.model = load_model(target_path, device=device, dtype=dtype, tp=self.tp)
        cache = config.cache
        if state_memory_gb is not None:  # pools sized by memory: as many committed states as fit
            intermediate = cache.linear_state == "intermediate"
            node_states = (config.shape.budget + 1 if draft is not None else 1) if intermediate else 0
            cache = cache_for_budget(self.model.cache_spec(), int(state_memory_gb * 2**30), cache.max_requests,
                                     cache.max_seq_len, cache.flush_length, self.model.dtype, node_states)
            config = replace(config, cache=cache)
        self.tokenizer = load_tokenizer(target_path)
        self._target, self._device, self._dtype = target, device, dtype  # (for beside's drafters)
        self._start_engine(draft, replace(config, cache=cache), acceptance, step_cost)

    def _start_engine(self, draft: str | Drafter | None, config: EngineConfig, acceptance: Acceptance | None,
                      step_cost: StepCostPrior | None) -> None:
        """This LLM's drafter (built from its name over the loaded target) and engine."""
        cache = config.cache
        if isinstance(draft, str):
            draft_flush = cache.flush_length if cache.linear_state == "kvbuffer" else CacheConfig().flush_length
            draft = make_drafter(draft, DraftContext(self.model, self._target, self.tokenizer, cache, config.shape,
                                                     draft_flush, self._device, self._dtype, config.cuda_graphs))
        self.drafter = draft
        self.engine = Engine(self.model, self.drafter, config, acceptance, step_cost)

    def beside(self, draft: str | os.PathLike | Drafter | None = None, *, config: EngineConfig = EngineConfig(),
               acceptance: Acceptance | None = None, step_cost: StepCostPrior | None = None) -> LLM:
        """Another LLM over this one's target, its weights and tokenizer shared (not loaded again): a drafter, an
        engine, pools and CUDA graphs of its own. For runs that compare speculation modes side by side (`specdec eval
        --speculation fixed adaptive --rounds N` keeps every mode's engine: the target loaded once, not once a mode,
        and every mode reading the same weights: on the 2-core CPU a second copy's linear layers ran 3.7% slower,
        benchmarks/results/adaptive_overhead_cpu_2026-12-07.md). Arguments as the constructor's."""
        if isinstance(draft, os.PathLike):
            draft = os.fspath(draft)
        if isinstance(draft, str):
            check_draft_name(self._target, draft)
        other = copy.copy(self)  # (the target, its tokenizer, tp group and device; last_stream not carried over)
        other.__dict__.pop("last_stream", None)
        other._start_engine(draft, config, acceptance, step_cost)
        return other

    # ---- generation ------------------------------------------------------------------------------------------
    def generate(self, prompts: Prompt | Sequence[Prompt], max_new_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None, chat: bool = False,
                 stop: str | Sequence[str] = ()) -> list[Output]:
        """Generate for every prompt (a text, or a list of token ids), decoded together (up to the cache's
        max_requests at once; the rest wait for a slot); one Output per prompt, in order. All inputs are checked
        before any work starts: wrong types raise TypeError, wrong values ValueError."""
        prompts = as_prompt_list(prompts)
        outputs: list[Output | None] = [None] * len(prompts)
        for index, output in self.generate_each(prompts, max_new_tokens, temperature, top_p, top_k, seed, chat,
                                                stop):
            outputs[index] = output
        return outputs

    def generate_each(self, prompts: Prompt | Sequence[Prompt], max_new_tokens: int = 128, temperature: float = 0.0,
                      top_p: float = 1.0, top_k: int = 0, seed: int | None = None, chat: bool = False,
                      stop: str | Sequence[str] = ()) -> Iterator[tuple[int, Output]]:
        """As generate(), but yields (the prompt's index, its Output) as each request finishes. Requests still
        running when the caller stops iterating (or on an interrupt) are aborted, so the engine stays usable."""
        stop = check_stop(stop)
        requests = self.submit(prompts, max_new_tokens, temperature, top_p, top_k, seed, chat)
        index_of = {request.request_id: index for index, request in enumerate(requests)}
        try:
            while not self.engine.scheduler.idle:
                finished = self.engine.step()
                self._apply_stop_strings(requests, stop)
                for request in finished:
                    if request.request_id in index_of:
                        yield index_of.pop(request.request_id), self._output(request, stop)
        finally:
            for request_id in index_of:
                self.engine.abort(request_id)

    def stream(self, prompt: Prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int | None = None, chat: bool = False,
               stop: str | Sequence[str] = ()) -> Iterator[str]:
        """Yield the text of one prompt's continuation piece by piece, as the engine emits it; afterwards the whole
        Output is in `last_stream`."""
        if self.tokenizer is None:
            raise ValueError("streaming text needs a tokenizer and this checkpoint ships none; use generate()")
        stop = check_stop(stop)
        (request,) = self.submit([prompt], max_new_tokens, temperature, top_p, top_k, seed, chat)
        shown = ""
        try:
            while True:
                if not request.finished:
                    self.engine.step()
                    self._apply_stop_strings([request], stop)
                text = self._text(request.output, stop)
                # a byte-level tokenizer may end mid-character: hold that back until the character is complete
                if len(text) > len(shown) and (request.finished or not text.endswith("\ufffd")):
                    yield text[len(shown):]
                    shown = text
                if request.finished:
                    break
        except BaseException:  # Ctrl-C, or the caller closed the stream early: free the request's slots
            if not request.finished:
                self.engine.abort(request.request_id)
            raise
        while not self.engine.scheduler.idle:  # let the engine retire it
            self.engine.step()
        self.last_stream = self._output(request, stop)

    def submit(self, prompts: Prompt | Sequence[Prompt], max_new_tokens: int = 128, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, seed: int | None = None, chat: bool = False) -> list[Request]:
        """Queue prompts on the engine without running it (callers drive `self.engine.step()`, which returns the
        requests that finished); all inputs are checked before any is queued."""
        check_sampling(max_new_tokens, temperature, top_p, top_k, seed, chat)
        params = SamplingParams(temperature=float(temperature), top_p=float(top_p), top_k=int(top_k),
                                seed=None if seed is None else int(seed))
        prompts = as_prompt_list(prompts)
        if not prompts:
            raise ValueError("no prompts given")
        encoded = [self.encode(prompt, chat) for prompt in prompts]
        for tokens in encoded:
            self.engine.check_request(tokens, int(max_new_tokens))
        eos = self.eos_token_ids()
        return [self.engine.add_request(tokens, params, int(max_new_tokens), eos) for tokens in encoded]

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))

    def encode(self, prompt: Prompt, chat: bool = False) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        if self.tokenizer is None:
            raise ValueError("this checkpoint ships no tokenizer: give prompts as lists of token ids")
        if chat:
            if not self.has_chat_template:
                raise ValueError("chat=True but the tokenizer has no chat template; pass chat=False")
            prompt = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                        add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(prompt, add_special_tokens=False) or []

    def eos_token_ids(self) -> set[int]:
        ids = set()
        for source in (getattr(self.model.hf_config, "eos_token_id", None),
                       getattr(self.tokenizer, "eos_token_id", None) if self.tokenizer is not None else None):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list | tuple):
                ids.update(source)
        return ids

    def _apply_stop_strings(self, requests: list[Request], stop: Sequence[str]) -> None:
        if not stop or self.tokenizer is None:
            return
        for request in requests:
            if not request.finished and any(s in self.tokenizer.decode(request.output) for s in stop):
                request.finish_reason = "stop"

    def _text(self, tokens: list[int], stop: Sequence[str]) -> str | None:
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        cut = min((text.find(s) for s in stop if s in text), default=-1)
        return text[:cut] if cut >= 0 else text

    def _output(self, request: Request, stop: Sequence[str]) -> Output:
        return Output(request.prompt, request.output, self._text(request.output, stop), request.finish_reason,
                      request.stats)


def as_prompt_list(prompts) -> list[str | list[int]]:
    """One prompt or a sequence of them -> a list of prompts, each a text or a list of int token ids (a 1-D tensor or
    array counts as one prompt's ids); anything else is a TypeError that says what is accepted."""
    if isinstance(prompts, str) or _is_token_ids(prompts):
        return [_as_prompt(prompts, None)]
    if isinstance(prompts, bytes | bytearray) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a str, a list of int token ids, or a list of those; got "
                        f"{type(prompts).__name__}")
    return [_as_prompt(prompt, index) for index, prompt in enumerate(prompts)]


def _is_token_ids(value) -> bool:
    if hasattr(value, "ndim") and hasattr(value, "tolist"):  # a torch tensor or numpy array of ids
        return value.ndim == 1
    return isinstance(value, Sequence) and not isinstance(value, str | bytes | bytearray) and len(value) > 0 \
        and not isinstance(value[0], str) and not _is_sequence(value[0])


def _is_sequence(value) -> bool:
    return hasattr(value, "ndim") or (isinstance(value, Sequence) and not isinstance(value, str))


def _as_prompt(prompt, index: int | None) -> str | list[int]:
    where = "" if index is None else f"prompts[{index}]: "
    if isinstance(prompt, str):
        return prompt
    if hasattr(prompt, "ndim") and hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    if isinstance(prompt, bytes | bytearray) or not isinstance(prompt, Sequence):
        raise TypeError(f"{where}a prompt is a str or a list of int token ids, got {type(prompt).__name__}")
    for position, token in enumerate(prompt):
        if isinstance(token, bool) or not isinstance(token, Integral):
            raise TypeError(f"{where}token ids must be ints, got {token!r} ({type(token).__name__}) at position "
                            f"{position}")
    return [int(token) for token in prompt]


def check_sampling(max_new_tokens, temperature, top_p, top_k, seed, chat) -> None:
    """Types of generate()'s settings (their ranges are checked by SamplingParams and the engine)."""
    for name, value in (("max_new_tokens", max_new_tokens), ("top_k", top_k)):
        if isinstance(value, bool) or not isinstance(value, Integral):
            raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, Integral)):
        raise TypeError(f"seed must be an int or None, got {seed!r} ({type(seed).__name__})")
    for name, value in (("temperature", temperature), ("top_p", top_p)):
        if isinstance(value, bool) or not isinstance(value, Real):
            raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if not isinstance(chat, bool):
        raise TypeError(f"chat must be True or False, got {chat!r}")


def check_stop(stop) -> tuple[str, ...]:
    """One stop string or a sequence of them -> a tuple of non-empty strings."""
    stops = (stop,) if isinstance(stop, str) else stop
    if isinstance(stops, bytes | bytearray) or not isinstance(stops, Sequence | set | frozenset):
        raise TypeError(f"stop must be a str or a list of str, got {type(stop).__name__}")
    for item in stops:
        if not isinstance(item, str):
            raise TypeError(f"stop strings must be str, got {item!r} ({type(item).__name__})")
        if not item:
            raise ValueError("a stop string is empty; give text that ends the answer when it appears")
    return tuple(stops)


def check_device(device) -> None:
    """A CUDA device asked for on a machine whose torch sees no GPU fails here, not deep in the loading."""
    if device is None:
        return
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown device {device!r}; use 'cpu', 'cuda' or 'cuda:N'") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {str(device)!r}: specdec runs on the CPU or a CUDA GPU; use 'cpu', 'cuda' or "
                         "'cuda:N'")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} asked for, but torch sees no CUDA GPU on this machine "
                             "(torch.cuda.is_available() is False); use the CPU (device 'cpu')")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {str(device)!r} asked for, but torch sees {torch.cuda.device_count()} GPU(s)")


def check_draft_name(target: str, draft: str) -> None:
    """Resolve a drafter's name as its factory will (drafters/registry.py), so that an unknown name fails before
    any model loads."""
    kind, argument = parse_draft(draft)
    if kind == "model":
        resolve_checkpoint(small_draft_for(target) if argument == "small" else resolve(argument))
    elif kind == "eagle3":
        resolve_checkpoint(argument or eagle3_head_for(target))


def generate(prompts: Prompt | Sequence[Prompt], target: str | os.PathLike = "qwen3.5",
             draft: str | os.PathLike | None = None, **kwargs) -> list[Output]:
    """One call: load `target` (and `draft`), generate, return one Output per prompt. Keyword arguments are those
    of LLM (device, dtype, config, ...) and of LLM.generate (max_new_tokens, temperature, ...)."""
    init_keys = set(inspect.signature(LLM.__init__).parameters) - {"self", "target", "draft"}
    init = {key: kwargs.pop(key) for key in list(kwargs) if key in init_keys}
    return LLM(target, draft, **init).generate(prompts, **kwargs)
