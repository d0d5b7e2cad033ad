"""The Python API: `specdec.LLM` keeps a target (and a drafter) loaded across calls; `specdec.generate` is the
one-call form.

    llm = specdec.LLM("qwen3.5", draft="small")
    for out in llm.generate(["The capital of France is"], max_new_tokens=32):
        print(out.text, out.stats.mean_accepted_length)
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from drafters import (
    Drafter,
    DraftModelDrafter,
    Eagle3Drafter,
    MtpDrafter,
    NgramDrafter,
    SyntheticDrafter,
    TreeShape,
)
from specdec.cache.budget import cache_for_budget
from specdec.cache.spec import CacheConfig
from specdec.engine.engine import Engine, EngineConfig
from specdec.engine.request import Request, RequestStats
from specdec.engine.sampling import SamplingParams
from specdec.models import load_model
from specdec.models.checkpoint import resolve_checkpoint
from specdec.presets import eagle3_head_for, resolve, small_draft_for

Prompt = str | Sequence[int]
# how the target's linear layers decode and verify: the KVBuffer, or the intermediate-state baseline
# (verify_kernels/intermediate_states.py) that SGLang and vLLM use, to measure against in the same engine
LINEAR_BACKENDS = ("kvbuffer", "recurrent")


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
    """A target model, its tokenizer and an optional drafter: None (plain decoding), "ngram", "mtp" (the target's
    multi-token-prediction layer), "eagle3:PATH" (an EAGLE-3 head), "eagle3" (the head configs/models.json lists
    for the target), "small" (the draft paired with the target in configs/models.json, else the smallest model of
    its family) or any alias / hub id / directory of a draft model. The default target, "qwen3.5", is the small
    trained Qwen3.5 shipped in specdec/checkpoints. On a GPU the decode / verify steps (the target's and the draft
    model's) replay from CUDA graphs unless cuda_graphs=False. linear_backend="recurrent" runs the target's linear
    layers the way SGLang and vLLM do (no buffer, one state per draft node), as a baseline."""

    def __init__(self, target: str = "qwen3.5", draft: str | None = None, *, device: str | None = None,
                 dtype: str | torch.dtype | None = None, flush_length: int = 16, max_batch: int = 8,
                 max_seq_len: int = 4096, num_state_slots: int | None = None, state_memory_gb: float | None = None,
                 num_steps: int = 4, topk: int = 1, num_draft_tokens: int | None = None, dynamic_tree: bool = False,
                 cuda_graphs: bool = True, linear_backend: str = "kvbuffer"):
        shape = TreeShape(steps=num_steps, topk=topk, max_tokens=num_draft_tokens, dynamic=dynamic_tree)
        if linear_backend not in LINEAR_BACKENDS:
            raise ValueError(f"linear_backend must be one of {LINEAR_BACKENDS}, got {linear_backend!r}")
        recurrent = linear_backend == "recurrent"
        # the baseline keeps no buffer: every token writes the target's state, as in SGLang and vLLM
        target_flush = 1 if recurrent else flush_length
        target_path = resolve_checkpoint(resolve(target))
        self.model = load_model(target_path, device=device, dtype=dtype)
        if state_memory_gb is not None:  # pools sized by memory: as many committed states as fit
            node_states = (shape.budget + 1 if draft is not None else 1) if recurrent else 0
            cache = cache_for_budget(self.model.cache_spec(), int(state_memory_gb * 2**30), max_batch, max_seq_len,
                                     target_flush, self.model.dtype, node_states)
        else:
            cache = CacheConfig(max_requests=max_batch, max_seq_len=max_seq_len, flush_length=target_flush,
                                num_state_slots=num_state_slots, intermediate_states=recurrent)
        self.tokenizer = load_tokenizer(target_path)
        self.drafter = self._make_drafter(draft, target, device, dtype, cache, cuda_graphs, flush_length)
        self.engine = Engine(self.model, self.drafter, EngineConfig(cache=cache, shape=shape, cuda_graphs=cuda_graphs))

    def _make_drafter(self, draft: str | None, target: str, device, dtype, cache: CacheConfig,
                      cuda_graphs: bool, flush_length: int) -> Drafter | None:
        if draft is None:
            return None
        if draft == "ngram":
            return NgramDrafter()
        if draft.startswith("synthetic:"):  # benchmarks on random weights: random chains, accepted at a set mean
            mean = draft.removeprefix("synthetic:")
            try:
                return SyntheticDrafter(float(mean), self.model.hf_config.vocab_size)
            except ValueError as error:
                raise ValueError(f"--draft synthetic:MEAN takes a mean accepted length, e.g. synthetic:2.9; "
                                 f"{mean!r}: {error}") from None
        head_cache = CacheConfig(max_requests=cache.max_requests, max_seq_len=cache.max_seq_len)
        if draft == "mtp":  # the target's own multi-token-prediction layer
            return MtpDrafter(self.model, head_cache)
        if draft == "eagle3":  # the EAGLE-3 head configs/models.json lists for the target
            return Eagle3Drafter(self.model, resolve_checkpoint(eagle3_head_for(target)), head_cache)
        if draft.startswith("eagle3:"):  # an EAGLE-3 head (SpecForge format): a directory or hub id
            return Eagle3Drafter(self.model, resolve_checkpoint(draft.removeprefix("eagle3:")), head_cache)
        draft_path = resolve_checkpoint(small_draft_for(target) if draft == "small" else resolve(draft))
        draft_model = load_model(draft_path, device=device, dtype=dtype)
        check_same_vocabulary(self.model, self.tokenizer, draft_model, load_tokenizer(draft_path))
        return DraftModelDrafter(draft_model, CacheConfig(max_requests=cache.max_requests,
                                                          max_seq_len=cache.max_seq_len,
                                                          flush_length=flush_length), cuda_graphs)

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
    of LLM (device, dtype, flush_length, num_steps, ...) and of LLM.generate (max_new_tokens, temperature, ...)."""
    init_keys = set(inspect.signature(LLM.__init__).parameters) - {"self", "target", "draft"}
    init = {key: kwargs.pop(key) for key in list(kwargs) if key in init_keys}
    return LLM(target, draft, **init).generate(prompts, **kwargs)


def load_tokenizer(directory: Path):
    """The checkpoint's tokenizer through transformers, or None when it ships none."""
    directory = Path(directory)
    if not any((directory / name).exists() for name in ("tokenizer.json", "tokenizer_config.json",
                                                         "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)


def check_same_vocabulary(target, target_tokenizer, draft, draft_tokenizer) -> None:
    """A draft must speak the target's tokens: same vocabulary size, and the same tokenizer when both ship one."""
    if draft.hf_config.vocab_size != target.hf_config.vocab_size:
        raise ValueError(
            f"the draft model's vocabulary ({draft.hf_config.vocab_size} tokens) differs from the target's "
            f"({target.hf_config.vocab_size}); use a draft of the same family (e.g. draft='small') or 'ngram'"
        )
    if target_tokenizer is not None and draft_tokenizer is not None and \
            target_tokenizer.get_vocab() != draft_tokenizer.get_vocab():
        raise ValueError("the draft model's tokenizer differs from the target's; use a draft of the same family")
