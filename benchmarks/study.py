"""The end-to-end study (BENCHMARKS.md, "End to end"): `specdec bench` on random-weight models at real shapes, all
their layers by default (Qwen3.5-9B 32, Qwen3.5-35B-A3B 40, Nemotron-3-Nano 52, built straight in GPU memory),
CUDA graphs on, batch 1 to 512:

- plain decoding, KVBuffer against the in-place recurrent backend of the same engine;
- speculative decoding with 4-token chains accepted at the mean length measured on the shipped models
  (`--draft synthetic:MEAN`; random weights accept no real draft), KVBuffer against intermediate states;
- adaptive speculation (issue 17: each step a chain of 1, 2 or 4 drafts, the TREE below, or none, each width its
  own CUDA graph; with `--only kvbuffer adaptive`: runs before 2026-12-05 22:00 UTC offered the chains alone) on
  the same drafts, to hold against plain and fixed at every batch size; `--accepted-length 1.2` runs the lot at a
  collapsed acceptance (a section of its own in the report);
- with `--only kvbuffer tree`, fixed static trees (TREE: --topk 2, 16 drafts) of synthetic drafts whose first-ranked
  children are kept as the chains' drafts are (specdec/eval/synthetic.py), rows of mode "tree": a fixed shape
  adaptive speculation is held against beside fixed chains;
- beside every measured step its roofline (specdec/eval/roofline.py, both peaks measured at the start of the run)
  and, per backend, the largest batch that fits the GPU's memory (specdec/eval/device_memory.py);
- transformers' generate() on the same shapes at the smaller batches, the outside reference.

A run writes one JSON; a model's batch sizes and engines can be spread over processes and device calls
(benchmarks/study_on_device.sh runs one process per batch size and engine), and the report joins the parts:
    python -m benchmarks.study --model qwen3.5-9b --batches 128 --out benchmarks/results/study_qwen3.5-9b_b128.json
    python -m benchmarks.study --model qwen3.5-9b --batches 1 16 64 --only kvbuffer adaptive --accepted-length 1.2
    python -m benchmarks.study --report      # BENCHMARKS.md's end-to-end section from benchmarks/results/study_*.json
`--tiny --device cpu` runs the same code on the shipped Qwen3.5 (a smoke run).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks import kernel_settings
from benchmarks.report import replace_section
from benchmarks.study_report import STUDY_END, STUDY_START, section_key, study_section
from specdec.eval.bench import BenchSettings, bench_peaks, markdown_table, run_bench
from specdec.eval.plots import save_figure
from specdec.models.real_shapes import SHAPES

RESULTS = Path("benchmarks/results")
# the device call a run belongs to: benchmarks/study_on_device.sh sets it once for all the processes of a call
SITTING = "STUDY_SITTING"
# mean accepted length (bonus included) of the shipped models' MTP layers, 4-token chains, held-out prompts
# (README); Qwen3.5-35B-A3B has no shipped counterpart: its dense sibling's figure
ACCEPTED_LENGTH = {"qwen3.5-9b": 2.72, "qwen3.5-35b-a3b": 2.72, "nemotron-3-nano": 2.58}
BATCHES = (1, 16, 64, 128, 256, 512)
TREE = {"topk": 2, "num_draft_tokens": 16}  # the tree rows' shape: 4 levels (the chains' depth), 16 drafts
HF_BATCHES = (1, 16)


def run(model: str, layers: int | None, batches: tuple[int, ...], new_tokens: int, device: str, tiny: bool,
        hf_reference: bool = True, only: tuple[str, str] | None = None, accepted_length: float | None = None,
        adaptive: bool = False, policy_trace: str | None = None) -> dict:
    """Every backend and mode (plain, speculative, and with `adaptive` adaptive) at `batches`, or the one engine
    `only` = (backend, mode); drafts accepted at `accepted_length` (default: the model's measured figure);
    transformers' reference at the small batches, in the run that has the KVBuffer's plain engine; the adaptive
    policy's decisions appended to the JSONL file `policy_trace`."""
    adaptive = adaptive or (only is not None and only[1] == "adaptive")
    tree = only is not None and only[1] == "tree"  # (run as the fixed speculative engine, its rows then relabelled)
    if tree:
        only = (only[0], "speculative")
    # (adaptive alone: configured with the tree, offered beside the chains up to its depth; where fixed rows run in
    # the same process, their 4-chains' shape)
    shape = TREE if tree or only == ("kvbuffer", "adaptive") else {}
    layers = layers or SHAPES[model][1]
    target = "qwen3.5" if tiny else f"random:{model}:{layers}"
    hf_reference = hf_reference and only in (None, ("kvbuffer", "plain"))
    hf_batches = tuple(b for b in HF_BATCHES if b in batches) if hf_reference else ()  # only where it is quick
    settings = BenchSettings(target=target, draft=f"synthetic:{accepted_length or ACCEPTED_LENGTH[model]}",
                             batch_sizes=batches, baseline=True, max_new_tokens=new_tokens, prompt_tokens=128,
                             device=device, hf_reference=bool(hf_batches), hf_batch_sizes=hf_batches or None,
                             only=only, speculation=("fixed", "adaptive") if adaptive else ("fixed",),
                             policy_trace=policy_trace, **shape)
    peaks = bench_peaks(settings)
    print(f"[study] roofline peaks: {peaks}", flush=True)
    rows = run_bench(settings, peaks)
    print(markdown_table(rows, settings.state_memory_gb), flush=True)
    rows = [{**asdict(r), **({"mode": "tree"} if tree else {})} for r in rows]
    return {"model": model, "layers": layers, "target": target, "date": datetime.date.today().isoformat(),
            "sitting": os.environ.get(SITTING, ""),
            "device": torch.cuda.get_device_name() if device == "cuda" else "CPU", "torch": torch.__version__,
            "settings": asdict(settings), "peaks": asdict(peaks), "kernel_settings": kernel_settings.applied(),
            "rows": [r for r in rows if r["backend"] != "transformers"],
            "transformers": [r for r in rows if r["backend"] == "transformers"]}


def run_date(result: dict) -> str:
    """A result's date, and its sitting where it has one ("2026-12-04, 10:12 UTC"): later sittings of a day sort after
    its earlier ones and after its runs with no sitting (before 2026-12-04e), so that a point re-run after a change
    the same day replaces the earlier code's runs (median_rows) instead of joining their median."""
    date, sitting = result.get("date", ""), result.get("sitting", "")
    return f"{date}, {sitting}" if sitting else date


def merge(results: list[dict], per_day: bool = False) -> list[dict]:
    """One result per model, layer count and acceptance: runs split over processes and device calls joined (the
    first part's settings and peaks head the section; each row keeps its own roofline). per_day: each point keeps
    its runs of its latest day, whatever their sittings (median_rows)."""
    merged: dict[tuple[str, int, str], dict] = {}
    for result in results:
        key = (result["model"], result["layers"], result.get("settings", {}).get("draft"))
        # (a row's run: its date and sitting, and the kernel settings it ran with where not the defaults)
        tuned = {"kernel_settings": result["kernel_settings"]} if result.get("kernel_settings") else {}
        rows = [{**row, "date": run_date(result), **tuned} for row in result["rows"]]
        reference = [{**row, "date": run_date(result)} for row in result["transformers"]]
        if key not in merged:
            merged[key] = {**result, "rows": rows, "transformers": reference}
        else:
            merged[key]["rows"] += rows
            merged[key]["transformers"] += reference
    # (transformers' reference too: a batch re-run keeps its latest run, not both beside each other)
    return [{**result, "rows": median_rows(result["rows"], per_day),
             "transformers": median_rows(result["transformers"], per_day)} for result in merged.values()]


def median_rows(rows: list[dict], per_day: bool = False) -> list[dict]:
    """One row per (backend, mode, batch): the runs of its latest date only (a point re-run after a change
    replaces the earlier code's runs; the section names the re-run points: report.rerun_note), and of an engine run
    in several processes that day (study_on_device.sh REPEATS), the run with the median tokens/s (the lower one of an
    even count), its `runs` the tokens/s of all. An engine's step time moves by up to 8% from one process to the next
    on the H200 (2026-12-03: the same adaptive engine's 4-chain steps 6.9-7.0 ms in one process, 7.5-7.6 in the
    next), more than the adaptive targets' margins. The latest date is the latest sitting (run_date), or with per_day
    the latest day: a folder of adaptive runs (adaptive_folders) gathers its runs of one code on purpose, some from
    calls of their own, and its README (benchmarks/adaptive_runs.py) takes every run's median."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row.get("backend"), row.get("mode"), row.get("batch_size")), []).append(row)
    day = (lambda row: row.get("date", "").split(",")[0]) if per_day else (lambda row: row.get("date", ""))
    out = []
    for group in groups.values():
        latest = max(day(row) for row in group)
        group = [row for row in group if day(row) == latest]
        if len(group) == 1:
            out.append(group[0])
            continue
        ranked = sorted(group, key=lambda r: r.get("tokens_per_second") or 0.0)
        out.append({**ranked[(len(ranked) - 1) // 2], "runs": [r.get("tokens_per_second") for r in ranked]})
    return out


def plot(result: dict, path: Path) -> Path:
    """Tokens/s against batch size: plain and speculative, KVBuffer and the baseline, measured (solid) and at the
    roofline (dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for backend, label, color in (("kvbuffer", "KVBuffer", "tab:blue"), ("recurrent", "baseline", "tab:orange")):
        for mode, marker in (("plain", "s"), ("speculative", "o")):
            rows = sorted((r for r in result["rows"] if (r["backend"], r["mode"]) == (backend, mode)
                           and not r.get("out_of_memory")), key=lambda r: r["batch_size"])
            if not rows:
                continue
            batches = [r["batch_size"] for r in rows]
            ax.plot(batches, [r["tokens_per_second"] for r in rows], "-", marker=marker, color=color,
                    label=f"{label}, {mode}")
            if all(r.get("x_roofline") for r in rows):  # roofline tok/s: the same tokens in the roofline's time
                ax.plot(batches, [r["tokens_per_second"] * r["x_roofline"] for r in rows], ":", marker=marker,
                        color=color, alpha=0.5, label=f"{label}, {mode}, roofline")
    ax.set(xlabel="batch size", ylabel="new tokens / s", xscale="log", yscale="log",
           title=f"{result['model']} shapes, {result['layers']} layers ({result['device']})")
    ax.legend(fontsize=7)
    return save_figure(fig, path)


def acceptance_suffix(result: dict) -> str:
    """"" at the model's measured acceptance, else "_accepted1.2" (file names of a collapsed-acceptance run)."""
    accepted = float(result["settings"]["draft"].removeprefix("synthetic:"))
    return "" if accepted == ACCEPTED_LENGTH.get(result["model"]) else f"_accepted{accepted:g}"


def with_plain_rows(results: list[dict]) -> list[dict]:
    """A run at another acceptance than the model's measured one (a collapsed 1.2) takes the plain rows of the
    run at the measured acceptance, where it has none of its own: plain decoding drafts nothing, so its rows do not
    depend on the acceptance, and the adaptive table holds adaptive against them."""
    shipped = {(r["model"], r["layers"]): r for r in results if not acceptance_suffix(r)}
    out = []
    for result in results:
        source = shipped.get((result["model"], result["layers"]))
        if acceptance_suffix(result) and source is not None and not any(r["mode"] == "plain" for r in result["rows"]):
            result = {**result, "rows": [r for r in source["rows"] if r["mode"] == "plain"] + result["rows"]}
        out.append(result)
    return out


def report(markdown: Path) -> None:
    results = with_plain_rows(merge([json.loads(p.read_text()) for p in sorted(RESULTS.glob("study_*.json"))]))
    # each model's run at its measured acceptance first, then its other acceptances (whatever the file names' order)
    results.sort(key=lambda r: (r["model"], r["layers"], acceptance_suffix(r) != "",
                                float(r["settings"]["draft"].removeprefix("synthetic:"))))
    plots = [plot(r, RESULTS / f"study_{r['model']}_{r['layers']}layers{acceptance_suffix(r)}.png") for r in results]
    shipped = [r for r in results if not acceptance_suffix(r)]
    replace_section(markdown, STUDY_START, STUDY_END, study_section(results, plots, shipped, adaptive_folders()))


def adaptive_folders(results: Path = RESULTS) -> dict[tuple, list[tuple[str, dict]]]:
    """The folders of adaptive runs (results/adaptive_*/study_*.json: benchmarks/adaptive_runs.py; plain, fixed and
    adaptive in one sitting, kept out of the joined study rows so that they replace no baseline's partner), joined
    per model, layers and acceptance (study_report.section_key) -> [(folder, joined result)]."""
    found: dict[tuple, list[tuple[str, dict]]] = {}
    for folder in sorted(p for p in results.glob("adaptive_*") if p.is_dir()):
        for joined in merge([json.loads(p.read_text()) for p in sorted(folder.glob("study_*.json"))], per_day=True):
            found.setdefault(section_key(joined), []).append((folder.as_posix(), joined))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(ACCEPTED_LENGTH), default="qwen3.5-9b")
    parser.add_argument("--layers", type=int, default=None, help="the first LAYERS of the model (default: all)")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--no-hf-reference", action="store_true", help="skip transformers' generate()")
    parser.add_argument("--only", nargs=2, metavar=("BACKEND", "MODE"), default=None,
                        help="one engine alone: kvbuffer|recurrent plain|speculative|adaptive|tree "
                        "(study_on_device.sh)")
    parser.add_argument("--adaptive", action="store_true", help="also the adaptive rows (implied by --only X adaptive)")
    parser.add_argument("--accepted-length", type=float, default=None,
                        help="the drafts' mean accepted length, bonus included (default: the model's measured "
                        "figure; 1.2: a collapsed acceptance)")
    parser.add_argument("--policy-trace", type=Path, default=None,
                        help="append the adaptive policy's step decisions to this JSONL file")
    parser.add_argument("--tiny", action="store_true", help="the shipped Qwen3.5 instead (smoke run)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report", action="store_true", help="write BENCHMARKS.md from the results and stop")
    parser.add_argument("--markdown", type=Path, default=Path("BENCHMARKS.md"))
    args = parser.parse_args()
    if args.report:
        report(args.markdown)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: pass --device cpu --tiny for a smoke run")
    result = run(args.model, args.layers, tuple(args.batches), args.new_tokens, args.device, args.tiny,
                 hf_reference=not args.no_hf_reference, only=tuple(args.only) if args.only else None,
                 accepted_length=args.accepted_length, adaptive=args.adaptive,
                 policy_trace=str(args.policy_trace) if args.policy_trace else None)
    out = args.out or RESULTS / f"study_{args.model}{acceptance_suffix(result)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
