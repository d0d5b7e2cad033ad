"""The PNG plots of `specdec eval`: accepted-length histogram, acceptance per draft position, throughput against
batch size."""

from __future__ import annotations

from pathlib import Path

from specdec.eval.summary import RunSummary

PLOTS = ("accepted_length.png", "position_acceptance.png", "throughput.png")


def write_plots(out: Path, rows: list[RunSummary], emitted_per_step: list[int], title: str) -> list[Path]:
    """emitted_per_step: the speculative runs' tokens per target step (for the histogram). -> the files written."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    written = []
    speculative = [row for row in rows if row.mode == "speculative"]
    if emitted_per_step:
        fig, ax = plt.subplots(figsize=(6, 4))
        top = max(emitted_per_step)
        ax.hist(emitted_per_step, bins=[n - 0.5 for n in range(1, top + 2)], rwidth=0.8)
        ax.set(xlabel="tokens per target step (accepted drafts + bonus)", ylabel="steps", title=title)
        ax.set_xticks(range(1, top + 1))
        written.append(save_figure(fig, out / PLOTS[0]))
    if speculative and speculative[0].position_acceptance:
        fig, ax = plt.subplots(figsize=(6, 4))
        for row in speculative:
            positions = range(1, len(row.position_acceptance) + 1)
            ax.plot(positions, row.position_acceptance, marker="o", label=f"batch {row.batch_size}")
        ax.set(xlabel="draft position", ylabel="share of steps accepting it", ylim=(0, 1), title=title)
        ax.set_xticks(range(1, len(speculative[0].position_acceptance) + 1))
        ax.legend()
        written.append(save_figure(fig, out / PLOTS[1]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in ("plain", "speculative", "adaptive"):
        points = sorted((row.batch_size, row.tokens_per_second) for row in rows if row.mode == mode)
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=mode)
    ax.set(xlabel="batch size", ylabel="new tokens / s", title=title)
    ax.set_xscale("log", base=2)
    ax.legend()
    written.append(save_figure(fig, out / PLOTS[2]))
    return written


def save_figure(fig, path: Path) -> Path:
    """The figure as a PNG of 256 colours (Pillow's palette, which matplotlib brings): a third of the bytes of the
    true-colour file, the same plot to the eye (its lines and text use a handful of colours). Closes the figure."""
    import io

    import matplotlib.pyplot as plt
    from PIL import Image

    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    Image.open(buffer).convert("RGB").quantize(256).save(path, "PNG", optimize=True)
    return path
