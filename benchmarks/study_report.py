"""The end-to-end tables of BENCHMARKS.md ("End to end": KVBuffer against intermediate states, at the roofline), from
the runs of benchmarks/study.py, which writes them (`python -m benchmarks.study --report`)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import kernel_settings
from benchmarks.report import _fmt, _table

STUDY_START, STUDY_END = "<!-- study:start -->", "<!-- study:end -->"
BASELINE = {"plain": "recurrent", "speculative": "intermediate states"}  # what the baseline does in each mode
TARGET_POINTS = (("plain", 256), ("speculative", 128))  # issue 14's targets: the step at its roofline there


def study_rows(result: dict) -> dict[tuple[str, str, int], dict]:
    return {(r["backend"], r["mode"], r["batch_size"]): r for r in result["rows"]}


def backend_cells(row: dict | None) -> list[str]:
    """tok/s, ms/step, roofline ms/step, x roofline of one backend's row."""
    if row is None:
        return ["", "", "", ""]
    if row.get("out_of_memory"):
        return ["out of memory", "", "", ""]
    return [f"{row['tokens_per_second']:.0f}", f"{row['ms_per_step']:.2f}", _fmt(row.get("roofline_ms_per_step"), 2),
            _times(row.get("x_roofline"))]


def _times(value, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}x"


def measured_ratio(ours: dict | None, base: dict | None) -> str:
    for row, name in ((ours, "KVBuffer"), (base, "baseline")):
        if row is None or row.get("out_of_memory"):
            return f"{name} out of memory" if row else "—"
    return _times(ours["tokens_per_second"] / base["tokens_per_second"])


def mode_table(result: dict, mode: str) -> list[str]:
    """Per batch size: each backend's tokens/s and step time against its roofline, and KVBuffer over the baseline
    measured beside the same ratio at the roofline (the baseline's roofline over ours on the same steps)."""
    rows = study_rows(result)
    base = BASELINE[mode]
    header = ["batch", "KVBuffer tok/s", "ms/step", "roofline ms/step", "x roofline", f"{base} tok/s", "ms/step",
              "roofline ms/step", "x roofline", "KVBuffer / baseline", "at the roofline"]
    body = []
    for batch in sorted({b for (_, m, b) in rows if m == mode}):
        ours, theirs = rows.get(("kvbuffer", mode, batch)), rows.get(("recurrent", mode, batch))
        roofline_ratio = None if ours is None else ours.get("roofline_speedup_over_recurrent")
        body.append([str(batch), *backend_cells(ours), *backend_cells(theirs), measured_ratio(ours, theirs),
                     _times(roofline_ratio)])
    return _table(header, body)


def adaptive_table(result: dict, adaptive_runs: list[tuple[str, dict]] = ()) -> list[str]:
    """Issue 17's comparison, KVBuffer rows per batch size: adaptive speculation's tokens/s against plain, fixed
    4-token chains and, where measured, fixed trees (its targets: >= 0.95x the best of them, >= plain), and the
    shapes it chose. `adaptive_runs`: runs
    of the same model and acceptance kept in folders of their own, (folder, joined result), each with plain, fixed
    and adaptive measured in one sitting (benchmarks/adaptive_runs.py); each batch takes the newest adaptive run of
    `result` and those folders, a folder's on a tie, and a note names the folder it came from."""
    from specdec.eval.summary import shape_shares

    sources = {"": _kept_rows(result), **{folder: _kept_rows(joined) for folder, joined in adaptive_runs}}
    chosen: dict[int, str] = {}
    for source, kept in sources.items():
        for (mode, batch), row in kept.items():
            if mode != "adaptive":
                continue
            rank = (row.get("date", ""), source != "")
            current = chosen.get(batch)
            if current is None or rank > (sources[current]["adaptive", batch].get("date", ""), current != ""):
                chosen[batch] = source
    # fixed trees (benchmarks/study.py TREE) get a column where some batch's source has them
    trees = any(("tree", batch) in sources[source] for batch, source in chosen.items())
    modes = ("plain", "speculative", "tree", "adaptive") if trees else ("plain", "speculative", "adaptive")
    header = ["batch", "plain tok/s", "fixed tok/s", *(["fixed tree tok/s"] if trees else []), "adaptive tok/s",
              "adaptive / best of plain, fixed", "adaptive / plain", "shapes chosen (share of steps)"]
    body, across, folders, mixed = [], set(), {}, set()
    for batch in sorted(chosen):
        kept = sources[chosen[batch]]
        speed = {key: r["tokens_per_second"] for key, r in kept.items() if not r.get("out_of_memory")}
        plain, adaptive = speed.get(("plain", batch)), speed.get(("adaptive", batch))
        best = max((speed[m, batch] for m in modes[:-1] if (m, batch) in speed), default=None)
        cells = [speed_cell(kept.get((m, batch))) for m in modes]
        # a ratio of rows measured on different days (a point re-run without the others: study.median_rows)
        dates = {m: kept[m, batch].get("date", "") for m in modes if (m, batch) in kept}
        mark = " *" if len(set(dates.values())) > 1 else ""
        if mark:
            across.add((dates["adaptive"], tuple(sorted({d for m, d in dates.items() if m != "adaptive"}))))
        if chosen[batch]:
            folders.setdefault(chosen[batch], []).append(batch)
            if mark:
                mixed.add(chosen[batch])
        body.append([str(batch), *cells,
                     _times(adaptive / best if best and adaptive else None) + mark,
                     _times(adaptive / plain if plain and adaptive else None) + mark,
                     shape_shares(kept["adaptive", batch].get("shapes") or {})])
    notes = [f"* adaptive measured on {ours}, plain / fixed on {' and '.join(theirs)}: a ratio across sittings, not "
             "a same-run comparison." for ours, theirs in sorted(across)]
    notes += [f"Batch {', '.join(map(str, batches))}: `{folder}` (its README), "
              f"{_folder_text(dict(adaptive_runs)[folder], batches, folder in mixed, result.get('device'))}."
              for folder, batches in folders.items()]
    return _table(header, body) + ([""] + notes if notes else [])


def _kept_rows(result: dict) -> dict[tuple[str, int], dict]:
    """(mode, batch) -> the KVBuffer's row (out-of-memory rows too: the table says which engines did not fit)."""
    return {(m, b): r for (backend, m, b), r in study_rows(result).items() if backend == "kvbuffer"}


def _folder_text(joined: dict, batches: list[int], mixed: bool, device: str | None = None) -> str:
    """A folder's rows of these batches: whether every engine of each row ran in one sitting (mixed: some row's
    engines did not), their sittings, new tokens a request, and the folder's device where it is not the section's
    (`device`). (A folder's rows may come from several sittings, each row from one of them: the 2026-12-05
    twenty-seventh session's batch 64 ran a call before batches 1 and 16.)"""
    dates = sorted({row.get("date", "") for row in joined["rows"] if row.get("batch_size") in batches} - {""})
    new_tokens = joined.get("settings", {}).get("max_new_tokens")
    elsewhere = joined.get("device") if joined.get("device") not in (None, device) else None
    when = "; ".join(dates) + (f"; {new_tokens} new tokens a request" if new_tokens else "")
    sittings = "its engines in more than one sitting" if mixed else "every engine of a row in one sitting"
    return sittings + f" ({when}{f'; on {elsewhere}' if elsewhere else ''})"


def speed_cell(row: dict | None) -> str:
    """A row's tokens/s; of an engine run in several processes, the median and the range of the runs."""
    if row is None:
        return ""
    if row.get("out_of_memory"):
        return "out of memory"
    runs = row.get("runs") or []
    spread = f" ({min(runs):.0f}-{max(runs):.0f}, {len(runs)} runs)" if len(runs) > 1 else ""
    return f"{row['tokens_per_second']:.0f}{spread}"


def memory_table(result: dict) -> list[str]:
    """Per backend and mode: linear-attention state per request, requests in the state budget, and the largest
    batch the engine would fit in the GPU's memory (specdec/eval/device_memory.py), read off its largest batch."""
    budget = result["settings"]["state_memory_gb"]
    columns = [(backend, mode) for mode in ("plain", "speculative") for backend in ("kvbuffer", "recurrent")]
    header = [""] + [f"{'KVBuffer' if b == 'kvbuffer' else BASELINE[m]}, {m}" for b, m in columns]
    state, fits, largest = ["state MiB / request"], [f"requests in {budget:g} GiB of state"], \
        ["largest batch in GPU memory (from batch)"]
    for backend, mode in columns:
        mine = [r for r in result["rows"] if (r["backend"], r["mode"]) == (backend, mode)]
        loaded = [r for r in mine if r["max_concurrent_requests"]]  # an engine that did not load reports none
        state.append(f"{loaded[0]['state_mib_per_request']:.1f}" if loaded else "—")
        fits.append(str(max(r["max_concurrent_requests"] for r in loaded)) if loaded else "—")
        ran = [r for r in mine if not r.get("out_of_memory") and r.get("largest_batch_in_memory") is not None]
        biggest = max(ran, key=lambda r: r["batch_size"], default=None)
        largest.append(f"{biggest['largest_batch_in_memory']} ({biggest['batch_size']})" if biggest else "—")
    return _table(header, [state, fits, largest])


def roofline_parts_table(result: dict) -> list[str]:
    """The roofline by part (ms/step) at the target points, each backend: what a profile is held against."""
    rows = study_rows(result)
    points = [(backend, mode, batch) for mode, batch in TARGET_POINTS for backend in ("kvbuffer", "recurrent")
              if rows.get((backend, mode, batch), {}).get("roofline_ms_by_part")]
    if not points:
        return []
    parts = list(dict.fromkeys(part for point in points for part in rows[point]["roofline_ms_by_part"]))
    header = ["roofline ms/step"] + [f"{'KVBuffer' if b == 'kvbuffer' else BASELINE[m]}, {m} {n}"
                                     for b, m, n in points]
    body = [[part] + [_fmt(rows[p]["roofline_ms_by_part"].get(part), 2) for p in points] for part in parts]
    body.append(["total"] + [_fmt(rows[p]["roofline_ms_per_step"], 2) for p in points])
    body.append(["measured"] + [_fmt(rows[p]["ms_per_step"], 2) for p in points])
    return _table(header, body)


def study_target_lines(results: list[dict]) -> list[str]:
    """Issue 14's targets, read off the runs: the KVBuffer step within 1.3x its roofline and KVBuffer / baseline
    tok/s at >= 0.9x the roofline ratio (plain B=256, speculative B=128); speculative >= plain tok/s at B <= 64."""
    body = []
    for result in results:
        rows, model = study_rows(result), f"{result['model']} ({result['layers']} layers)"
        for mode, batch in TARGET_POINTS:
            ours, theirs = rows.get(("kvbuffer", mode, batch)), rows.get(("recurrent", mode, batch))
            if ours is None or ours.get("out_of_memory"):
                continue
            body.append([f"{model}, {mode} B={batch}: KVBuffer step <= 1.3x its roofline",
                         _times(ours.get("x_roofline"))])
            if theirs is not None and not theirs.get("out_of_memory") and ours.get("roofline_speedup_over_recurrent"):
                measured = ours["tokens_per_second"] / theirs["tokens_per_second"]
                body.append([f"{model}, {mode} B={batch}: KVBuffer / {BASELINE[mode]} >= 0.9x the roofline ratio "
                             f"({ours['roofline_speedup_over_recurrent']:.2f}x)",
                             f"{measured:.2f}x = {measured / ours['roofline_speedup_over_recurrent']:.2f} of it"])
        ran = {key for key, row in rows.items() if not row.get("out_of_memory")}
        small = sorted(b for (backend, m, b) in ran if backend == "kvbuffer" and m == "plain" and b <= 64
                       and ("kvbuffer", "speculative", b) in ran)
        if small:
            speed = {key: row["tokens_per_second"] for key, row in rows.items()}
            gains = [speed["kvbuffer", "speculative", b] / speed["kvbuffer", "plain", b] for b in small]
            body.append([f"{model}: KVBuffer speculative >= plain tok/s at every B <= 64",
                         ", ".join(f"{gain:.2f}x ({b})" for gain, b in zip(gains, small, strict=True))])
    return _table(["target", "reached"], body)


def study_section(results: list[dict], plots: list[Path] | None = None,
                  target_results: list[dict] | None = None,
                  adaptive_runs: dict[tuple, list[tuple[str, dict]]] | None = None) -> str:
    """The section from the joined runs (benchmarks.study.merge), with each result's plot; the targets read off
    target_results (default: all; the study passes those at each model's measured acceptance)."""
    parts = [STUDY_START, "## End to end: KVBuffer against intermediate states, at the roofline", "",
             "The issue's targets, read off the runs below at each model's measured acceptance:", "",
             *study_target_lines(results if target_results is None else target_results), ""]
    for result, plot in zip(results, plots or [None] * len(results), strict=True):
        parts += study_model_lines(result, plot, (adaptive_runs or {}).get(section_key(result), []))
    parts.append(STUDY_END)
    return "\n".join(parts)


def section_key(result: dict) -> tuple:
    """What a folder of adaptive runs and a study section share: model, layers and the drafts' acceptance."""
    return result["model"], result["layers"], result.get("settings", {}).get("draft")


def study_model_lines(result: dict, plot: Path | None, adaptive_runs: list[tuple[str, dict]] = ()) -> list[str]:
    s, peaks = result["settings"], result.get("peaks")
    accepted = s["draft"].removeprefix("synthetic:")
    lines = [f"### {result['model']} ({result['target']})", "",
             f"Generated by `python -m benchmarks.study --model {result['model']} --layers {result['layers']}` on "
             f"{min(dates_of(result))} ({result['device']}; torch {result['torch']}): random weights at the real "
             f"shapes, {result['layers']} layers, bf16, CUDA graphs, {s['prompt_tokens']}-token prompts, "
             f"{s['max_new_tokens']} new tokens per request, flush length {s['flush_length']}. Speculative rows: "
             f"4-token chains accepted at a mean length of {accepted}. The baseline is the same engine running "
             "linear layers as SGLang and vLLM do: in place for plain decoding (\"recurrent\"), one state written "
             "per draft node for speculative decoding (\"intermediate states\"). Roofline: the same steps' bytes at "
             "the copy bandwidth and GEMM FLOPs at the GEMM peak (specdec/eval/roofline.py)"
             + (f", both measured in the run: {_peaks_text(peaks)}." if peaks else ".") + rerun_note(result)
             + tuned_note(result), "",
             "Plain decoding:", "", *mode_table(result, "plain"), "",
             f"Speculative decoding (4-token chains, accepted at {accepted}):", "",
             *mode_table(result, "speculative"), ""]
    adaptive = adaptive_table(result, adaptive_runs)
    if len(adaptive) > 2:
        lines += [f"Adaptive speculation (chains of 1, 2 or 4 drafts or none per step, and in runs of main bd5de2a "
                  f"onwards the fixed tree rows' static tree too, accepted at {accepted}), KVBuffer:", "",
                  *adaptive, ""]
    lines += ["Memory:", "", *memory_table(result), ""]
    parts = roofline_parts_table(result)
    if parts:
        lines += ["The roofline by part at the targets' batch sizes (ms/step):", "", *parts, ""]
    traffic = experts_line(result)
    if traffic:
        lines += [traffic, ""]
    if result.get("transformers"):
        reference = ", ".join(f"{r['tokens_per_second']:.0f} tok/s at batch {r['batch_size']}"
                              for r in sorted(result["transformers"], key=lambda r: r["batch_size"]))
        lines += [f"transformers' generate() on the same weights' shapes, plain: {reference}.", ""]
    if plot is not None:
        lines += [f"![tokens/s against batch size]({plot.as_posix()})", ""]
    return lines


def dates_of(result: dict) -> list[str]:
    """The dates of a joined result's rows (benchmarks.study.merge dates each row by its run), else its own."""
    return sorted({row["date"] for row in result["rows"] if row.get("date")}) or [result["date"]]


def tuned_note(result: dict) -> str:
    """" Kernel settings other than the defaults ...: points" for the rows run with a sweep's winners applied
    (benchmarks/kernel_settings.py), per set of settings; "" when every row ran at the defaults."""
    by_settings: dict[str, list[str]] = {}
    for row in result["rows"]:
        if row.get("kernel_settings"):
            text = kernel_settings.sentence(row["kernel_settings"]).rstrip(".")
            by_settings.setdefault(text, []).append(f"{row['backend']} {row['mode']} batch {row['batch_size']}")
    return "".join(f"{text}, in {', '.join(points)}." for text, points in by_settings.items())


def rerun_note(result: dict) -> str:
    """" Re-run on D: ..." for the points measured after the first date (a point re-run replaces its earlier runs:
    study.median_rows), naming each backend's modes and batches; "" when every row is of one date."""
    later = dates_of(result)[1:]
    notes = []
    for date in later:
        points = sorted({(r["mode"], r["batch_size"], r["backend"]) for r in result["rows"] if r.get("date") == date})
        by_point: dict[tuple[str, int], list[str]] = {}
        for mode, batch, backend in points:
            by_point.setdefault((mode, batch), []).append(backend)
        cells = ", ".join(f"{mode} batch {batch} ({' and '.join(backends)})"
                          for (mode, batch), backends in by_point.items())
        notes.append(f" Re-run on {date}, after changes to the engine step: {cells}; the same-run ratios of those "
                     "rows compare backends measured together.")
    return "".join(notes)


def experts_line(result: dict) -> str:
    """MoE rows: the distinct experts a layer call read, measured, against uniform routing's (the roofline's expert
    reads scale by it); "" for a dense model or runs from before the count (2026-12-02)."""
    measured = sorted((r["backend"], r["mode"], r["batch_size"], r["experts_vs_uniform"]) for r in result["rows"]
                      if r.get("experts_vs_uniform") is not None)
    if not measured:
        return ""
    cells = "; ".join(f"{backend} {mode} {batch}: {factor:.2f}" for backend, mode, batch, factor in measured)
    return ("Distinct MoE experts read per layer call, measured, over those uniform routing of the same tokens would "
            f"touch (the rooflines' expert reads are scaled by it): {cells}.")


def _peaks_text(peaks: dict) -> str:
    return (f"copy {peaks['copy_bytes_per_second'] / 1e12:.2f} TB/s, GEMM {peaks['gemm_flops_per_second'] / 1e12:.0f} "
            "TFLOP/s")
