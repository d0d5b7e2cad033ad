"""The outside reference of `specdec bench --hf-reference`: transformers' generate() on the same checkpoint (for a
random:NAME target, transformers' model drawn on the device alike), dtype, prompt and batch sizes."""

from __future__ import annotations

import time

import torch
from tqdm.auto import tqdm

from specdec.eval.bench import WARMUP_TOKENS, BenchRow, BenchSettings, synchronize


def time_transformers(settings: BenchSettings, prompts: list[list[int]], device: torch.device,
                      dtype: torch.dtype) -> list[BenchRow]:
    """transformers' generate() on the same checkpoint, dtype, prompts and batch sizes: greedy, exactly
    max_new_tokens per request, a warm-up call first. Decode throughput as for our rows: the time of a call that
    makes one new token (the prefill) is taken off, and so is that token."""
    from transformers import AutoModelForCausalLM

    from specdec.models.checkpoint import resolve_checkpoint
    from specdec.models.loading import RANDOM_WEIGHTS
    from specdec.models.random_checkpoint import transformers_random_model
    from specdec.presets import resolve

    directory = resolve_checkpoint(resolve(settings.target))
    if (directory / RANDOM_WEIGHTS).is_file():  # a random:NAME target: transformers' model drawn on the device too
        model = transformers_random_model(directory, device, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype).to(device).eval()
    rows = []
    batch_sizes = settings.hf_batch_sizes or settings.batch_sizes
    for batch_size in tqdm(sorted(set(batch_sizes)), desc="transformers plain", unit="batch"):
        inputs = torch.tensor(prompts[:batch_size], device=device)
        options = dict(do_sample=False, pad_token_id=0, eos_token_id=None)
        with torch.no_grad():
            model.generate(inputs, max_new_tokens=WARMUP_TOKENS, min_new_tokens=WARMUP_TOKENS, **options)
            prefill, _ = _timed_generate(model, inputs, 1, options)
            seconds, output = _timed_generate(model, inputs, settings.max_new_tokens, options)
        seconds = max(seconds - prefill, 1e-9)
        new_tokens = (output.shape[1] - inputs.shape[1] - 1) * batch_size
        rows.append(BenchRow(backend="transformers", mode="plain", batch_size=batch_size, new_tokens=new_tokens,
                             seconds=seconds, tokens_per_second=new_tokens / seconds,
                             ms_per_step=1e3 * seconds / settings.max_new_tokens, mean_accepted_length=1.0,
                             state_mib_per_request=0.0, max_concurrent_requests=0))
    return rows


def _timed_generate(model, inputs: torch.Tensor, new_tokens: int, options: dict) -> tuple[float, torch.Tensor]:
    synchronize(inputs.device)
    start = time.perf_counter()
    output = model.generate(inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **options)
    synchronize(inputs.device)
    return time.perf_counter() - start, output
