"""Tables from a kernel benchmark's JSON: printed after a run, and the kernels section of BENCHMARKS.md.

    python -m benchmarks.report benchmarks/results/kernels_h200.json [--markdown BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from benchmarks import kernel_settings

START, END = "<!-- kernels:start -->", "<!-- kernels:end -->"
DEFAULT_RESULTS = "benchmarks/results/kernels_h200.json"


def _fmt(value, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _bytes(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.0f} KiB"


def bound_us(nbytes: float, copy_tbps: float) -> float:
    """The time to move nbytes at the run's copy bandwidth (read + write counted alike), in microseconds."""
    return nbytes / (copy_tbps * 1e12) * 1e6


def of_bound(row: dict, copy_tbps: float, measured: str, nbytes: str) -> float | None:
    """bound / measured in [0, 1] (1: at the copy bandwidth), None when the row lacks either figure."""
    if row.get(nbytes) is None or not row.get(measured):
        return None
    return bound_us(row[nbytes], copy_tbps) / row[measured]


def _percent(fraction: float | None) -> str:
    return "—" if fraction is None else f"{100 * fraction:.0f}%"


BOUND_HEADER = ["bytes moved", "bound us", "% of bound"]


def bound_cells(row: dict, copy_tbps: float, measured: str = "ours_us") -> list[str]:
    """The bound columns of a kernel row that carries "bytes_moved" (dashes for one that does not, e.g. older runs)."""
    if row.get("bytes_moved") is None:
        return ["—"] * len(BOUND_HEADER)
    return [_bytes(row["bytes_moved"]), _fmt(bound_us(row["bytes_moved"], copy_tbps)),
            _percent(of_bound(row, copy_tbps, measured, "bytes_moved"))]


def kernel_table(rows: list[dict], section: str, columns: list[tuple[str, Callable[[dict], str]]],
                 copy_tbps: float, measured: str = "ours_us", baseline: tuple[str, str] | None = None) -> list[str]:
    """The rows of one section: its own columns, then bytes moved, bound and % of bound of `measured`, then (with
    baseline = (column name, its measured key)) the baseline's % of its own bound ("baseline_bytes_moved")."""
    header = [name for name, _ in columns] + BOUND_HEADER
    if baseline is not None:
        header.append(f"{baseline[0]} % of bound")
    body = []
    for row in rows:
        if row["section"] != section:
            continue
        cells = [cell(row) for _, cell in columns] + bound_cells(row, copy_tbps, measured)
        if baseline is not None:
            cells.append(_percent(of_bound(row, copy_tbps, baseline[1], "baseline_bytes_moved")))
        body.append(cells)
    return _table(header, body)


def _get(key: str, digits: int = 1) -> Callable[[dict], str]:
    return lambda row: _fmt(row.get(key), digits)


def gdn_decode_table(rows: list[dict], copy_tbps: float) -> list[str]:
    columns = [
        ("batch", lambda r: str(r["batch"])), ("L", lambda r: str(r["flush_length"])),
        ("step us", _get("ours_step_us")), ("flush us", _get("ours_flush_us")), ("amortised us", _get("ours_us")),
        ("fla us", _get("fla_us")),
        ("x fla", _get("speedup_vs_fla", 2)), ("sglang us", _get("sglang_us")),
        ("S0 read TB/s", _get("state_read_tbps", 2)),
        ("of copy", lambda r: _percent(r["state_read_tbps"] / copy_tbps)),
    ]
    return kernel_table(rows, "gdn_decode", columns, copy_tbps, baseline=("fla", "fla_us"))


def gdn_verify_table(rows: list[dict], copy_tbps: float) -> list[str]:
    columns = [
        ("draft", lambda r: r["tree"]), ("batch", lambda r: str(r["batch"])), ("ours us", _get("ours_us")),
        ("intermediate-state us", _get("baseline_us")), ("x", _get("speedup_vs_baseline", 2)),
        ("our state bytes/req", lambda r: "0"),
        ("our scratch/req", lambda r: f"{r['ours_scratch_bytes_per_request'] / 2**10:.0f} KiB"),
        ("baseline states/req", lambda r: f"{r['baseline_state_bytes_per_request'] / 2**20:.0f} MiB"),
    ]
    return kernel_table(rows, "gdn_verify", columns, copy_tbps, baseline=("baseline", "baseline_us"))


def gdn_fold_table(rows: list[dict], copy_tbps: float) -> list[str]:
    columns = [("op", lambda r: r["case"]), ("batch", lambda r: str(r["batch"])),
               ("rows folded", lambda r: str(r["folded_rows"])), ("ours us", _get("ours_us")),
               ("intermediate-state commit us", _get("baseline_us")), ("x", _get("speedup_vs_baseline", 2))]
    return kernel_table(rows, "gdn_fold", columns, copy_tbps, baseline=("baseline", "baseline_us"))


def mamba2_decode_table(rows: list[dict], copy_tbps: float) -> list[str]:
    columns = [
        ("batch", lambda r: str(r["batch"])), ("L", lambda r: str(r["flush_length"])),
        ("step us", _get("ours_step_us")), ("flush us", _get("ours_flush_us")), ("amortised us", _get("ours_us")),
        ("selective_state_update us", _get("baseline_us")), ("x", _get("speedup_vs_baseline", 2)),
    ]
    return kernel_table(rows, "mamba2_decode", columns, copy_tbps, baseline=("baseline", "baseline_us"))


def mamba2_verify_table(rows: list[dict], copy_tbps: float) -> list[str]:
    columns = [("draft", lambda r: r["tree"]), ("batch", lambda r: str(r["batch"])), ("ours us", _get("ours_us")),
               ("intermediate-state us", _get("baseline_us")), ("x", _get("speedup_vs_baseline", 2))]
    return kernel_table(rows, "mamba2_verify", columns, copy_tbps, baseline=("baseline", "baseline_us"))


def mamba2_commit_table(rows: list[dict], copy_tbps: float) -> list[str]:
    columns = [("op", lambda r: r["case"]), ("batch", lambda r: str(r["batch"])),
               ("rows folded", lambda r: str(r["folded_rows"])), ("ours us", _get("ours_us")),
               ("intermediate-state commit us", _get("baseline_us")), ("x", _get("speedup_vs_baseline", 2))]
    return kernel_table(rows, "mamba2_commit", columns, copy_tbps, baseline=("baseline", "baseline_us"))


# (section, title, table) in the order of the report; a section without rows in a run is left out
TABLES = (
    ("gdn_decode", "GDN decode, Qwen3.5-9B shapes (H=16, HV=32, K=V=128, fp32 state)", gdn_decode_table),
    ("gdn_verify", "GDN verify: one pass over a draft chain / tree, no per-draft state", gdn_verify_table),
    ("gdn_fold", "GDN fold and commit (flush_length 16, 3 of a 4-chain accepted per row; the intermediate-state "
     "baseline's commit copies the last accepted node's state)", gdn_fold_table),
    ("mamba2_decode", "Mamba2 decode, Nemotron-3-Nano shapes (64 heads, head dim 64, state 128, 8 groups)",
     mamba2_decode_table),
    ("mamba2_verify", "Mamba2 verify, Nemotron-3-Nano shapes", mamba2_verify_table),
    ("mamba2_commit", "Mamba2 commit (flush_length 16, 3 of a 5-chain accepted per row; the intermediate-state "
     "baseline's commit copies the last accepted node's state)", mamba2_commit_table),
)


def tables_lines(result: dict, heading: Callable[[str], list[str]]) -> list[str]:
    """Every kernel table with rows in the run, each after heading(title)."""
    rows, lines = result["rows"], []
    for section, title, table in TABLES:
        if any(row["section"] == section for row in rows):
            lines += [*heading(title), *table(rows, result["copy_tbps"])]
    return lines


def _figures(rows: list[dict], section: str, value: Callable[[dict], float | None], keep: Callable[[dict], bool],
             digits: int = 2, unit: str = "x") -> str:
    found = [(row["batch"], value(row)) for row in rows if row["section"] == section and keep(row)]
    found = [(batch, v) for batch, v in found if v is not None]
    if not found:
        return "not measured"
    return ", ".join(f"{v:.{digits}f}{unit} ({batch})" for batch, v in found)


def _tree_over_chain(rows: list[dict], section: str, tree: str, chain: str, min_batch: int) -> str:
    us = {(r["tree"], r["batch"]): r["ours_us"] for r in rows if r["section"] == section}
    found = [(b, us[(tree, b)] / us[(chain, b)]) for (t, b) in us if t == tree and b >= min_batch and (chain, b) in us]
    return ", ".join(f"{ratio:.2f}x ({batch})" for batch, ratio in found) or "not measured"


def targets_lines(result: dict) -> list[str]:
    """Issue 15's kernel targets and what this run reached, batch in brackets."""
    rows, copy = result["rows"], result["copy_tbps"]
    body = [
        ["GDN fold: >= 80% of copy bandwidth",
         _figures(rows, "gdn_fold", lambda r: 100 * of_bound(r, copy, "ours_us", "bytes_moved"),
                  lambda r: r["case"].startswith("flush") and r["batch"] >= 64, 0, "%")],
        ["GDN commit that folds no row costs an append, not a fold",
         _figures(rows, "gdn_fold", lambda r: r["ours_us"], lambda r: r["folded_rows"] == 0, 1, " us")],
        ["GDN decode amortised L=16, batch >= 128: >= 1.9x fla fused_recurrent",
         _figures(rows, "gdn_decode", lambda r: r.get("speedup_vs_fla"),
                  lambda r: r["flush_length"] == 16 and r["batch"] >= 128)],
        ["GDN verify 4-chain, batch >= 64: >= 3x SGLang's intermediate-state verify",
         _figures(rows, "gdn_verify", lambda r: r.get("speedup_vs_baseline"),
                  lambda r: r["tree"] == "chain4" and r["batch"] >= 64)],
        ["GDN verify 16-node tree <= 1.5x the 4-chain", _tree_over_chain(rows, "gdn_verify", "tree16", "chain4", 64)],
        ["GDN verify 4-chain, batch 1: <= 10 us",
         _figures(rows, "gdn_verify", lambda r: r["ours_us"], lambda r: r["tree"] == "chain4" and r["batch"] == 1,
                  1, " us")],
        ["Mamba2 decode amortised L=16, batch >= 128: >= 1.7x selective_state_update",
         _figures(rows, "mamba2_decode", lambda r: r.get("speedup_vs_baseline"),
                  lambda r: r["flush_length"] == 16 and r["batch"] >= 128)],
        ["Mamba2 verify, batch 64-512: >= 3x the intermediate-state kernel",
         _figures(rows, "mamba2_verify", lambda r: r.get("speedup_vs_baseline"), lambda r: r["batch"] >= 64)],
        ["Mamba2 verify, batch 64-512: <= 1.5x its bound (>= 67% of bound)",
         _figures(rows, "mamba2_verify", lambda r: 100 * (of_bound(r, copy, "ours_us", "bytes_moved") or 0),
                  lambda r: r["batch"] >= 64 and r.get("bytes_moved") is not None, 0, "%")],
    ]
    return _table(["target", "reached (batch)"], body)


def summary_lines(result: dict) -> list[str]:
    return [f"{result['device']}, {result['date']}, copy {result['copy_tbps']:.2f} TB/s; {result['software']}",
            *tables_lines(result, lambda title: ["", title + ":"]), "", "Targets:", *targets_lines(result)]


def markdown_section(result: dict) -> str:
    lines = [
        START,
        "## Kernels (one layer, H200)",
        "",
        f"Generated by `python -m benchmarks.report` from `{result.get('source', DEFAULT_RESULTS)}`,"
        f" measured with `{result['command']}` on {result['date']} ({result['device']}; torch "
        f"{result['software']['torch']}, triton {result['software']['triton']}; baselines: "
        f"{result['software']['fla']}, {result['software']['sglang']})."
        + kernel_settings.sentence(result.get("kernel_settings")),
        "",
        "Method: every op captured in a CUDA graph, replays timed with CUDA events (median of 10), inputs rotated "
        f"over >= 2 GiB of distinct states per graph so the L2 cannot hold them; device copy in the same run: "
        f"{result['copy_tbps']:.2f} TB/s (read + write). Decode is amortised over L steps: (L-1) steps at the "
        "mean buffer fill plus one step that folds the buffer into the state; GDN verify over buffers at every fill "
        "from 0 to 15 over the rows (the engine's rows at every point of their flush cycle). Checks against the torch "
        "references at these shapes before timing (max relative error): "
        + ", ".join(f"{name} {error:.1e}" for name, error in result["checks"].items()) + ".",
        "",
        "bound us: the bytes the op must move (each state read once, and written once where it folds; inputs, "
        "outputs and buffer entries) at the copy bandwidth of the run; % of bound: bound / measured. The baseline's "
        "% of bound counts the states it reads and writes.",
        "",
        "Targets (issue 15):",
        "",
        *targets_lines(result),
        *tables_lines(result, lambda title: ["", f"### {title}", ""]),
        END,
    ]
    return "\n".join(lines)


def write_markdown(result: dict, path: Path) -> None:
    """Replace the kernels section of `path` (or create the file) with one generated from `result`."""
    replace_section(path, START, END, markdown_section(result))


def replace_section(path: Path, start: str, end: str, section: str) -> None:
    """Put `section` (which begins with `start` and ends with `end`) in place of the one in `path`, or append it
    (creating the file) if there is none."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\nEvery table here is generated from a run's JSON.\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--markdown", type=Path, default=Path("BENCHMARKS.md"))
    args = parser.parse_args()
    result = json.loads(args.results.read_text())
    result["source"] = str(args.results)
    write_markdown(result, args.markdown)
    print("\n".join(summary_lines(result)))


if __name__ == "__main__":
    main()
