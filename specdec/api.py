"""The Python API: `specdec.LLM` keeps a target (and a drafter) loaded across calls; `specdec.generate` is the
one-call form.

    llm = specdec.LLM("qwen3.5", draft="small")
    for out in llm.generate(["The capital of France is"], max_new_tokens=32):
        print(out.text, out.stats.mean_accepted_length)
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import torch

from drafters import DraftContext, Drafter, make_drafter
from specdec.cache.budget import cache_for_budget
from specdec.cache.spec import CacheConfig
from specdec.engine.engine import Engine, EngineConfig
from specdec.engine.request import Request, RequestStats
from specdec.models import load_model
from specdec.models.checkpoint import resolve_checkpoint
from specdec.models.tokenizer import load_tokenizer
from specdec.presets import resolve
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
    step_cost: with config.speculation = "adaptive", the prior cost of a step, (batch, width, context) -> seconds
        (specdec/eval/step_cost.py: roofline_step_cost; default flat: each shape is measured before it is trusted).
    """

    def __init__(self, target: str = "qwen3.5", draft: str | Drafter | None = None, *, device: str | None = None,
                 dtype: str | torch.dtype | None = None, config: EngineConfig = EngineConfig(),
                 state_memory_gb: float | None = None, acceptance: Acceptance | None = None,
                 step_cost: StepCostPrior | None = None):
        target_path = resolve_checkpoint(resolve(target))
        self.model = load_model(target_path, device=device, dtype=dtype)
        cache = config.cache
        if state_memory_gb is not None:  # pools sized by memory: as many committed states as fit
            intermediate = cache.linear_state == "intermediate"
            node_states = (config.shape.budget + 1 if draft is not None else 1) if intermediate else 0
            cache = cache_for_budget(self.model.cache_spec(), int(state_memory_gb * 2**30), cache.max_requests,
                                     cache.max_seq_len, cache.flush_length, self.model.dtype, node_states)
            config = replace(config, cache=cache)
        self.tokenizer = load_tokenizer(target_path)
        if isinstance(draft, str):
            draft_flush = cache.flush_length if cache.linear_state == "kvbuffer" else CacheConfig().flush_length
            draft = make_drafter(draft, DraftContext(self.model, target, self.tokenizer, cache, config.shape,
                                                     draft_flush, device, dtype, config.cuda_graphs))
        self.drafter = draft
        self.engine = Engine(self.model, self.drafter, config, acceptance, step_cost)

    # ---- generation ------------------------------------------------------------------------------------------
    def generate(self, prompts: Prompt | Sequence[Prompt], max_new_tokens: int = 128, temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, seed: int | None = None, chat: bool = False,
                 stop: Sequence[str] = ()) -> list[Output]:
        """Generate for every prompt (text or token ids); all inputs are checked before any work starts."""
        requests = self.submit(prompts, max_new_tokens, temperature, top_p, top_k, seed, chat)
        while not self.engine.scheduler.idle:
            self.engine.step()
            self._apply_stop_strings(requests, stop)
        return [self._output(request, stop) for request in requests]

    def stream(self, prompt: Prompt, max_new_tokens: int = 128, temperature: float = 0.0, top_p: float = 1.0,
               top_k: int = 0, seed: int | None = None, chat: bool = False, stop: Sequence[str] = ()) -> Iterator[str]:
        """Yield the text of one prompt's continuation piece by piece, as the engine emits it; afterwards the whole
        Output is in `last_stream`."""
        if self.tokenizer is None:
            raise ValueError("streaming text needs a tokenizer and this checkpoint ships none; use generate()")
        (request,) = self.submit([prompt], max_new_tokens, temperature, top_p, top_k, seed, chat)
        shown = ""
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
        while not self.engine.scheduler.idle:  # let the engine retire it
            self.engine.step()
        self.last_stream = self._output(request, stop)

    def submit(self, prompts: Prompt | Sequence[Prompt], max_new_tokens: int = 128, temperature: float = 0.0,
               top_p: float = 1.0, top_k: int = 0, seed: int | None = None, chat: bool = False) -> list[Request]:
        """Queue prompts on the engine without running it (callers drive `self.engine.step()`, which returns the
        requests that finished); all inputs are checked before any is queued."""
        params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        if not prompts:
            raise ValueError("no prompts given")
        encoded = [self.encode(prompt, chat) for prompt in prompts]
        for tokens in encoded:
            self.engine.check_request(tokens, max_new_tokens)
        eos = self.eos_token_ids()
        return [self.engine.add_request(tokens, params, max_new_tokens, eos) for tokens in encoded]

    def encode(self, prompt: Prompt, chat: bool = False) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        if self.tokenizer is None:
            raise ValueError("this checkpoint ships no tokenizer: give prompts as lists of token ids")
        if chat:
            if not getattr(self.tokenizer, "chat_template", None):
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


def generate(prompts: Prompt | Sequence[Prompt], target: str = "qwen3.5", draft: str | None = None,
             **kwargs) -> list[Output]:
    """One call: load `target` (and `draft`), generate, return one Output per prompt. Keyword arguments are those
    of LLM (device, dtype, config, ...) and of LLM.generate (max_new_tokens, temperature, ...)."""
    init_keys = set(inspect.signature(LLM.__init__).parameters) - {"self", "target", "draft"}
    init = {key: kwargs.pop(key) for key in list(kwargs) if key in init_keys}
    return LLM(target, draft, **init).generate(prompts, **kwargs)
