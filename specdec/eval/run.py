"""`specdec eval`: run a prompt set through plain decoding and speculative decoding on the same engine, at one or
more batch sizes, and write per-request JSONL, the summary (table + JSON) and plots into one folder.

Folder layout:
    eval.json                     the settings; a rerun must match them (it may add prompts or batch sizes)
    requests/<mode>-b<B>.jsonl    one record per finished request (specdec/eval/summary.py: request_record)
    segments.json                 per run, the timed stretches it ran in (tokens, seconds, peak memory)
    summary.json, summary.md      the figures per run, computed from the two above
    *.png                         specdec/eval/plots.py

Re-running on the same folder resumes: requests already recorded are not run again, so an interrupted eval
continues where it stopped and the summary covers every request in the folder.
"""

from __future__ import annotations

import gc
import json
import resource
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from tqdm.auto import tqdm

from specdec.eval.acceptance_prior import adaptive_config
from specdec.eval.datasets import EvalPrompt
from specdec.eval.plots import write_plots
from specdec.eval.step_cost import with_device_prior
from specdec.eval.summary import (
    RunSummary,
    Segment,
    against_plain,
    append_record,
    drop_broken_lines,
    markdown_table,
    read_records,
    request_record,
    summarize,
)
from specdec.parallel import broadcast_object, is_primary, join

MODES = ("plain", "speculative", "adaptive")  # speculative: every step drafts the shape; adaptive: chosen per step


@dataclass(frozen=True)
class EvalSettings:
    """What makes two evals comparable; a folder holds the results of one setting."""

    target: str
    draft: str | None
    dataset: str
    max_new_tokens: int = 128
    temperature: float = 0.0
    seed: int = 0
    num_steps: int = 4
    topk: int = 1
    num_draft_tokens: int | None = None
    dynamic_tree: bool = False
    flush_length: int = 16
    device: str | None = None
    dtype: str | None = None
    tp: int = 1  # tensor-parallel ranks: every rank runs the eval, rank 0 alone writes
    max_prefill_tokens: int = 16384  # padded prompt tokens a prefill forward (engine/prefill.py)
    acceptance_prior: tuple[str, ...] = ()  # adaptive runs: the evals their prior is read from (acceptance_prior.py)


def run_eval(settings: EvalSettings, prompts: list[EvalPrompt], batch_sizes: list[int], out: Path,
             baseline: bool = True, speculation: tuple[str, ...] = ("fixed",), rounds: int = 1) -> list[RunSummary]:
    """Run what the folder lacks, then summarise it all. baseline: also run plain decoding (for the speedup);
    speculation: the drafter's runs, "fixed" (mode speculative) and / or "adaptive" (a folder may gain either).
    rounds > 1 interleaves the modes: the prompts are cut into `rounds` consecutive parts and each part runs through
    every mode (the order turning from part to part) before the next, so a machine whose speed drifts over minutes
    (a shared CPU) slows every mode alike; every mode's engine then stays loaded for the whole eval."""
    if not batch_sizes or min(batch_sizes) < 1:
        raise ValueError(f"--batch-size needs values >= 1, got {batch_sizes}")
    if rounds < 1 or rounds > max(len(prompts), 1):
        raise ValueError(f"--rounds needs a value from 1 to the number of prompts ({len(prompts)}), got {rounds}")
    batch_sizes = sorted(set(batch_sizes))
    out = Path(out)
    (out / "requests").mkdir(parents=True, exist_ok=True)
    tp = join(settings.tp)  # under --tp, rank 0 alone reads and writes the folder and tells the others
    refused = None
    if is_primary():
        try:
            check_settings(out, settings)
        except ValueError as error:
            refused = str(error)
    refused = broadcast_object(refused, tp)
    if refused:
        raise ValueError(refused)
    modes = [mode for mode in MODES if (mode == "plain" and (baseline or settings.draft is None))
             or (settings.draft is not None and {"speculative": "fixed", "adaptive": "adaptive"}.get(mode)
                 in speculation)]
    segments = read_segments(out) if is_primary() else {}
    indexed = list(enumerate(prompts))  # seeds follow a prompt's place in the set, so reruns sample alike
    size = -(-len(indexed) // rounds)
    parts = [indexed[start:start + size] for start in range(0, len(indexed), max(size, 1))] or [[]]
    # one round: mode by mode, one engine loaded at a time; several: the whole schedule with every engine kept
    schedule = ([(mode, 0) for mode in modes] if rounds == 1 else
                [(mode, number) for number in range(len(parts))
                 for mode in modes[number % len(modes):] + modes[:number % len(modes)]])
    llms = {}
    for mode, number in schedule:
        part = parts[number]
        for batch_size in batch_sizes:
            key = run_key(mode, batch_size)
            path = out / "requests" / f"{key}.jsonl"
            done = broadcast_object({record["id"] for record in drop_broken_lines(path)} if is_primary() else None, tp)
            todo = [(index, prompt) for index, prompt in part if prompt.id not in done]
            if not todo:
                continue
            if mode not in llms:  # loaded once per mode, and only when a run has work left; under several rounds
                # every mode's engine over one target (LLM.beside: loaded once, every mode reading the same weights)
                llms[mode] = load_llm(settings, mode, max(batch_sizes), beside=next(iter(llms.values()), None))
            progress = tqdm(total=len(part), initial=len(part) - len(todo),
                            desc=key if rounds == 1 else f"{key} part {number + 1}/{len(parts)}",
                            unit="request", disable=not is_primary())
            try:
                run_requests(llms[mode], todo, batch_size, settings, path, progress, segments.setdefault(key, []),
                             part=number if rounds > 1 else None)
            finally:
                progress.close()
                write_segments(out, segments)
        if rounds == 1 and mode in llms:
            del llms[mode]
            gc.collect()
    llms.clear()
    gc.collect()
    return write_summary(out, settings, list(MODES))  # every run the folder holds: fixed beside adaptive


def run_requests(llm, todo: list[tuple[int, EvalPrompt]], batch_size: int, settings: EvalSettings, path: Path,
                 progress, segments: list[Segment], part: int | None = None) -> None:
    """Queue the prompts, step the engine until all are done, append each request's record as it finishes. The
    stretch is timed and appended to `segments` (tagged with its part of the prompts, under --rounds) even when
    interrupted (its finished requests stay recorded)."""
    engine = llm.engine
    engine.scheduler.max_batch = batch_size
    prompt_of = {}
    for index, prompt in todo:
        (request,) = llm.submit(prompt.text, settings.max_new_tokens, settings.temperature,
                                seed=settings.seed + index, chat=prompt.chat)
        prompt_of[request.request_id] = prompt.id
    device = llm.model.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start, new_tokens = time.perf_counter(), 0
    try:
        while not engine.scheduler.idle:
            for request in engine.step():
                if is_primary():
                    append_record(path, request_record(prompt_of[request.request_id], request))
                new_tokens += len(request.output)
                progress.update(1)
    finally:
        for request_id in list(prompt_of):  # interrupted: leave the engine empty
            engine.abort(request_id)
        segments.append(Segment(new_tokens, time.perf_counter() - start, peak_memory_gib(device), part))


def load_llm(settings: EvalSettings, mode: str, max_batch: int, beside=None):
    """The mode's LLM: its target loaded, or that of `beside` (an LLM of another mode) shared."""
    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig

    config = EngineConfig.from_flags(max_batch=max_batch, flush_length=settings.flush_length,
                                     num_steps=settings.num_steps, topk=settings.topk,
                                     num_draft_tokens=settings.num_draft_tokens, dynamic_tree=settings.dynamic_tree,
                                     speculation="adaptive" if mode == "adaptive" else "fixed",
                                     adaptive=adaptive_config(settings.acceptance_prior),
                                     max_prefill_tokens=settings.max_prefill_tokens)
    draft = settings.draft if mode != "plain" else None
    llm = (LLM(settings.target, draft, device=settings.device, dtype=settings.dtype, config=config, tp=settings.tp)
           if beside is None else beside.beside(draft, config=config))
    with_device_prior(llm)
    return llm


def peak_memory_gib(device: torch.device) -> float:
    """Peak GPU memory allocated since the run's start on CUDA; on a CPU the process's peak resident size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def run_key(mode: str, batch_size: int) -> str:
    return f"{mode}-b{batch_size}"


def check_settings(out: Path, settings: EvalSettings) -> None:
    """Write the settings into a new folder; in a used one, insist they are the same."""
    path = out / "eval.json"
    wanted = json.loads(json.dumps(asdict(settings)))  # (as the file holds it: a tuple comes back a list)
    if path.is_file():
        found = {field.name: field.default for field in fields(EvalSettings)} | json.loads(path.read_text())
        changed = {key: (found.get(key), value) for key, value in wanted.items() if found.get(key) != value}
        if changed:
            said = ", ".join(f"{key}: {old!r} there, {new!r} now" for key, (old, new) in changed.items())
            raise ValueError(f"{out} holds an eval with other settings ({said}); pass another --output, or delete "
                             "the folder to start over")
    else:
        path.write_text(json.dumps(wanted, indent=1))


def read_segments(out: Path) -> dict[str, list[Segment]]:
    path = out / "segments.json"
    if not path.is_file():
        return {}
    return {key: [Segment(**segment) for segment in value] for key, value in json.loads(path.read_text()).items()}


def write_segments(out: Path, segments: dict[str, list[Segment]]) -> None:
    if not is_primary():
        return
    (out / "segments.json").write_text(json.dumps({key: [asdict(s) for s in value]
                                                   for key, value in segments.items()}, indent=1))


def write_summary(out: Path, settings: EvalSettings, modes: list[str]) -> list[RunSummary]:
    """summary.json / summary.md / plots from every run the folder holds (rank 0's work alone under --tp)."""
    if not is_primary():
        return []
    segments = read_segments(out)
    rows, emitted, plain = [], [], {}
    for mode in modes:
        for path in sorted((out / "requests").glob(f"{mode}-b*.jsonl"), key=lambda p: int(p.stem.split("-b")[1])):
            records = read_records(path)
            if not records:
                continue
            batch_size = int(path.stem.split("-b")[1])
            row = summarize(mode, batch_size, records, segments.get(path.stem, []), settings.num_steps)
            if mode == "plain":
                plain[batch_size] = (row, records)
            else:
                base, base_records = plain.get(batch_size, (None, []))
                row = against_plain(row, base, records, base_records, greedy=settings.temperature == 0,
                                    segments=segments.get(path.stem, []),
                                    plain_segments=segments.get(run_key("plain", batch_size), []))
                if not emitted:  # the histogram: the smallest batch size's steps
                    emitted = [n for record in records for n in record["emitted_per_step"]]
            rows.append(row)
    title = f"{settings.target} + {settings.draft or 'plain'} on {settings.dataset}"
    (out / "summary.json").write_text(json.dumps({"settings": asdict(settings),
                                                  "runs": [row.as_dict() for row in rows]}, indent=1))
    (out / "summary.md").write_text(f"{title}\n\n{markdown_table(rows)}\n")
    write_plots(out, rows, emitted, title)
    return rows
