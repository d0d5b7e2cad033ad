"""The end-to-end study (BENCHMARKS.md, "End to end"): `specdec bench` on random-weight Qwen3.5-9B and Nemotron 3
Nano shapes (the first --layers of their layers), CUDA graphs on, batch 1 to 512, all in one run per model:

- plain decoding, KVBuffer against the intermediate-state ("recurrent") backend of the same engine;
- speculative decoding with 4-token chains accepted at the mean length measured on the shipped models
  (`--draft synthetic:MEAN`; random weights accept no real draft), KVBuffer against intermediate states: tokens/s
  and how many requests' linear-attention state fits 40 GiB;
- transformers' generate() on the same checkpoint at the smaller batches, the outside reference.

One device call per model (each must fit the 10 minutes of one call, writing the random checkpoint included;
split the batch sizes over two calls with --batches and --out study_MODEL_PART.json if not), then the report on
any machine, which joins the parts of a model:
    python -m benchmarks.study --model qwen3.5-9b --out benchmarks/results/study_qwen3.5-9b.json
    python -m benchmarks.study --model nemotron-3-nano --out benchmarks/results/study_nemotron-3-nano.json
    python -m benchmarks.study --report      # BENCHMARKS.md from benchmarks/results/study_*.json
`--tiny --device cpu` runs the same code on the shipped Qwen3.5 (a smoke run).
"""

from __future__ import annotations

import argparse
import datetime
import json
from dataclasses import asdict
from pathlib import Path

import torch

from benchmarks.report import replace_section
from specdec.eval.bench import BACKENDS, BenchSettings, run_bench

START, END = "<!-- study:start -->", "<!-- study:end -->"
RESULTS = Path("benchmarks/results")
# mean accepted length (bonus included) of the shipped models' MTP layers, 4-token chains, held-out prompts (README)
ACCEPTED_LENGTH = {"qwen3.5-9b": 2.72, "nemotron-3-nano": 2.58}
BATCHES = (1, 16, 64, 128, 256, 512)
HF_BATCHES = (1, 16)


def run(model: str, layers: int, batches: tuple[int, ...], new_tokens: int, device: str, tiny: bool) -> dict:
    target = "qwen3.5" if tiny else f"random:{model}:{layers}"
    hf_batches = tuple(b for b in HF_BATCHES if b in batches)  # generate() only where it is quick enough
    settings = BenchSettings(target=target, draft=f"synthetic:{ACCEPTED_LENGTH[model]}", batch_sizes=batches,
                             baseline=True, max_new_tokens=new_tokens, prompt_tokens=128, device=device,
                             hf_reference=bool(hf_batches), hf_batch_sizes=hf_batches or None)
    rows = [asdict(r) for r in run_bench(settings)]
    return {"model": model, "layers": layers, "target": target, "date": datetime.date.today().isoformat(),
            "device": torch.cuda.get_device_name() if device == "cuda" else "CPU", "torch": torch.__version__,
            "settings": asdict(settings), "rows": [r for r in rows if r["backend"] != "transformers"],
            "transformers": [r for r in rows if r["backend"] == "transformers"]}


def table(result: dict) -> list[str]:
    """Per batch size: plain and speculative tokens/s on both backends, requests in the state budget, HF."""
    rows = {(r["backend"], r["mode"], r["batch_size"]): r for r in result["rows"]}
    hf = {r["batch_size"]: r["tokens_per_second"] for r in result["transformers"]}
    budget = result["settings"]["state_memory_gb"]
    lines = [f"| batch | plain KVBuffer tok/s | plain recurrent tok/s | x | speculative KVBuffer tok/s | "
             f"speculative intermediate-state tok/s | x | requests in {budget:g} GiB, KVBuffer / intermediate "
             "states | transformers generate() tok/s |",
             "|---|---|---|---|---|---|---|---|---|"]
    requests = requests_in_budget(result)
    fits = (f"{requests['kvbuffer']} / {requests['recurrent']} "
            f"({requests['kvbuffer'] / max(requests['recurrent'], 1):.1f}x)")
    for batch in sorted({key[2] for key in rows}):
        cells = []
        for mode in ("plain", "speculative"):
            ours, base = rows[("kvbuffer", mode, batch)], rows[("recurrent", mode, batch)]
            cells += [speed(ours), speed(base), ratio(ours, base)]
        reference = f"{hf[batch]:.0f}" if batch in hf else ""
        lines.append(f"| {batch} | " + " | ".join(cells) + f" | {fits} | {reference} |")
    return lines


def target_lines(results: list[dict]) -> list[str]:
    """The issue's targets against the runs: tokens/s ratios at batch >= 128 and requests in the state budget."""
    def ratios(result, mode):
        rows = {(r["backend"], r["mode"], r["batch_size"]): r for r in result["rows"]}
        batches = sorted(b for (backend, m, b) in rows if backend == "kvbuffer" and m == mode and b >= 128)
        return ", ".join(f"{ratio(rows['kvbuffer', mode, b], rows['recurrent', mode, b])} ({b})" for b in batches)

    def requests(result):
        fits = requests_in_budget(result)
        return fits["kvbuffer"] / max(fits["recurrent"], 1)

    by_model = {r["model"]: r for r in results}
    lines = ["| target | reached (batch) |", "|---|---|"]
    if "qwen3.5-9b" in by_model:
        lines.append("| plain decoding, Qwen3.5-9B shapes, batch >= 128: >= 1.4x the recurrent backend | "
                     f"{ratios(by_model['qwen3.5-9b'], 'plain')} |")
    for model, result in by_model.items():
        lines.append(f"| speculative 4-chains, {model}, batch >= 128: >= 1.5x intermediate states | "
                     f"{ratios(result, 'speculative')} |")
        lines.append(f"| speculative requests in the same state budget, {model}: >= 4.5x | "
                     f"{requests(result):.1f}x |")
    return lines


def speed(row: dict) -> str:
    return "out of memory" if row.get("out_of_memory") else f"{row['tokens_per_second']:.0f}"


def ratio(ours: dict, base: dict) -> str:
    for row, name in ((ours, "KVBuffer"), (base, "intermediate states")):
        if row.get("out_of_memory"):
            return f"{name} out of memory"
    return f"{ours['tokens_per_second'] / base['tokens_per_second']:.2f}x"


def requests_in_budget(result: dict) -> dict[str, int]:
    """Speculative requests whose linear-attention state fits the budget, per backend: the same at every batch
    size (an engine that did not fit the device reports none at its batch)."""
    return {backend: max(r["max_concurrent_requests"] for r in result["rows"]
                         if (r["backend"], r["mode"]) == (backend, "speculative")) for backend in BACKENDS}


def merge(results: list[dict]) -> list[dict]:
    """One result per model: runs split over device calls (--batches, --out study_MODEL_PART.json) joined."""
    merged: dict[str, dict] = {}
    for result in results:
        if result["model"] not in merged:
            merged[result["model"]] = {**result, "rows": list(result["rows"]),
                                       "transformers": list(result["transformers"])}
        else:
            merged[result["model"]]["rows"] += result["rows"]
            merged[result["model"]]["transformers"] += result["transformers"]
    return list(merged.values())


def plot(result: dict, path: Path) -> Path:
    """Tokens/s against batch size: plain and speculative, KVBuffer and intermediate states."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for backend, label in (("kvbuffer", "KVBuffer"), ("recurrent", "intermediate states")):
        for mode, style in (("plain", "--"), ("speculative", "-")):
            points = sorted((r["batch_size"], r["tokens_per_second"]) for r in result["rows"]
                            if (r["backend"], r["mode"]) == (backend, mode) and not r.get("out_of_memory"))
            if not points:
                continue
            ax.plot(*zip(*points, strict=True), style, marker="o", label=f"{label}, {mode}")
    ax.set(xlabel="batch size", ylabel="new tokens / s", xscale="log", yscale="log",
           title=f"{result['model']} shapes, {result['layers']} layers ({result['device']})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def markdown_section(results: list[dict], plots: dict[str, Path] | None = None) -> str:
    parts = [START, "## End to end: KVBuffer against intermediate states", "", "The issue's targets:", "",
             *target_lines(results), ""]
    for result in results:
        s = result["settings"]
        parts += [f"### {result['model']} ({result['target']})", "",
                  f"Generated by `python -m benchmarks.study --model {result['model']} --layers {result['layers']}` "
                  f"on {result['date']} ({result['device']}; torch {result['torch']}): random weights at the real "
                  f"shapes, {result['layers']} layers, bf16, CUDA graphs, {s['prompt_tokens']}-token prompts, "
                  f"{s['max_new_tokens']} new tokens per request. Speculative rows: 4-token chains accepted at a mean "
                  f"length of {s['draft'].removeprefix('synthetic:')} (the shipped model's MTP layer on held-out "
                  "text). \"Recurrent\" is the same engine running linear layers as SGLang and vLLM do (no buffer; "
                  "one state written per draft token). Requests that fit count linear-attention state alone.", "",
                  *table(result), ""]
        if plots and result["model"] in plots:
            parts += [f"![tokens/s against batch size]({plots[result['model']].as_posix()})", ""]
    parts.append(END)
    return "\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(ACCEPTED_LENGTH), default="qwen3.5-9b")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="the shipped Qwen3.5 instead (smoke run)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--report", action="store_true", help="write BENCHMARKS.md from the results and stop")
    parser.add_argument("--markdown", type=Path, default=Path("BENCHMARKS.md"))
    args = parser.parse_args()
    if args.report:
        results = merge([json.loads(p.read_text()) for p in sorted(RESULTS.glob("study_*.json"))])
        plots = {r["model"]: plot(r, RESULTS / f"study_{r['model']}.png") for r in results}
        replace_section(args.markdown, START, END, markdown_section(results, plots))
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: pass --device cpu --tiny for a smoke run")
    result = run(args.model, args.layers, tuple(args.batches), args.new_tokens, args.device, args.tiny)
    out = args.out or RESULTS / f"study_{args.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print("\n".join(table(result)))


if __name__ == "__main__":
    main()
