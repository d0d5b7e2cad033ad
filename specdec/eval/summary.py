"""What `specdec eval` writes and reports: one JSON record per finished request, the timed segments of each run,
and the summary of a run computed from those two alone (so a resumed run sums up like an uninterrupted one)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from specdec.engine.request import Request


def request_record(prompt_id: str, request: Request) -> dict:
    """One line of a run's JSONL. emitted_per_step: tokens each target step emitted (accepted drafts + the bonus
    token); drafted_per_step: draft tokens on the tree that step verified; shapes: steps per shape the adaptive
    policy chose (absent for fixed speculation); wall_seconds: from joining the batch to
    the last token; latency_seconds: from submission (waiting for room included)."""
    stats = request.stats
    return {"id": prompt_id, "prompt_tokens": len(request.prompt), "new_tokens": len(request.output),
            "finish_reason": request.finish_reason,
            "wall_seconds": stats.end - (stats.admitted or stats.start), "latency_seconds": stats.end - stats.start,
            "prefill_seconds": stats.prefill_seconds,
            "emitted_per_step": list(stats.emitted_per_step), "drafted_per_step": list(stats.drafted_per_step),
            "token_ids": list(request.output), **({"shapes": dict(stats.shapes)} if stats.shapes else {})}


def read_records(path: Path) -> list[dict]:
    """The records of a run's JSONL; a last line cut short by an interrupted run is dropped (its request reruns)."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def drop_broken_lines(path: Path) -> list[dict]:
    """Rewrite a run's JSONL without the lines an interrupted run left unfinished; -> its records."""
    records = read_records(path)
    if path.is_file() and len(path.read_text().splitlines()) != len(records):
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    return records


def append_record(path: Path, record: dict) -> None:
    with open(path, "a") as handle:
        handle.write(json.dumps(record) + "\n")


@dataclass(frozen=True)
class Segment:
    """One uninterrupted stretch of a run: its new tokens, wall seconds and peak memory; part: which of the prompts'
    parts it ran (`specdec eval --rounds N`: every mode runs part 0, then every mode part 1, ...), None for a run of
    the whole set (or one recorded before parts were)."""

    new_tokens: int
    seconds: float
    peak_memory_gib: float
    part: int | None = None


@dataclass(frozen=True)
class RunSummary:
    mode: str                           # "plain" or "speculative"
    batch_size: int
    requests: int
    new_tokens: int
    seconds: float                      # wall time of the run's segments
    tokens_per_second: float
    mean_accepted_length: float         # tokens per target step, the bonus token included
    draft_acceptance_rate: float | None  # accepted draft tokens / drafted tokens (None: nothing drafted)
    position_acceptance: list[float]    # [k-1]: share of drafting steps that accepted >= k draft tokens
    peak_memory_gib: float
    speedup: float | None = None        # tokens/s over plain decoding at the same batch size, same run
    same_as_plain: float | None = None  # share of requests whose tokens equal plain decoding's (greedy evals)
    shapes: dict[str, int] = field(default_factory=dict)  # request-steps per shape adaptive speculation chose
    # tokens/s over plain decoding's part by part (--rounds > 1; the same prompts, run in turn): how far the
    # machine's drift moves the speedup, which the one figure of totals hides
    speedup_by_part: list[float] | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def summarize(mode: str, batch_size: int, records: list[dict], segments: list[Segment],
              depth: int) -> RunSummary:
    """A run's figures from its records and segments; depth: the drafts' depth (positions reported)."""
    emitted = [n for record in records for n in record["emitted_per_step"]]
    drafted = [n for record in records for n in record["drafted_per_step"]]
    accepted_per_drafting_step = [e - 1 for e, d in zip(emitted, drafted, strict=True) if d > 0]
    seconds = sum(segment.seconds for segment in segments)
    new_tokens = sum(record["new_tokens"] for record in records)
    positions = [sum(a >= k for a in accepted_per_drafting_step) / len(accepted_per_drafting_step)
                 for k in range(1, depth + 1)] if accepted_per_drafting_step else []
    return RunSummary(
        mode=mode, batch_size=batch_size, requests=len(records), new_tokens=new_tokens, seconds=seconds,
        tokens_per_second=new_tokens / seconds if seconds > 0 else 0.0,
        mean_accepted_length=sum(emitted) / len(emitted) if emitted else 0.0,
        draft_acceptance_rate=(sum(emitted) - len(emitted)) / sum(drafted) if sum(drafted) else None,
        position_acceptance=positions,
        shapes=dict(sum((Counter(record.get("shapes", {})) for record in records), Counter())),
        peak_memory_gib=max((segment.peak_memory_gib for segment in segments), default=0.0))


def against_plain(row: RunSummary, plain: RunSummary | None, records: list[dict], plain_records: list[dict],
                  greedy: bool, segments: Sequence[Segment] = (), plain_segments: Sequence[Segment] = ()) -> RunSummary:
    """A speculative row with its speedup over the plain row of the same batch size (and by part, from the two runs'
    segments) and, for greedy evals, the share of the requests both ran whose tokens are the same (lossless decoding
    gives 1.0)."""
    if plain is None or row.mode == "plain":
        return row
    speedup = row.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else None
    same = None
    if greedy:
        plain_tokens = {record["id"]: record["token_ids"] for record in plain_records}
        both = [record for record in records if record["id"] in plain_tokens]
        same = sum(record["token_ids"] == plain_tokens[record["id"]] for record in both) / len(both) if both else None
    return RunSummary(**{**row.as_dict(), "speedup": speedup, "same_as_plain": same,
                         "speedup_by_part": speedup_by_part(segments, plain_segments)})


def speedup_by_part(segments: Sequence[Segment], plain_segments: Sequence[Segment]) -> list[float] | None:
    """tokens/s over plain decoding's, for each part both runs ran in one segment (an interrupted part, run in two,
    is left out), in part order; None with fewer than two such parts."""
    def by_part(run: Sequence[Segment]) -> dict[int, Segment]:
        counts = Counter(segment.part for segment in run)
        return {segment.part: segment for segment in run
                if segment.part is not None and counts[segment.part] == 1 and segment.seconds > 0}
    ours, plain = by_part(segments), by_part(plain_segments)
    parts = sorted(ours.keys() & plain.keys())
    if len(parts) < 2:
        return None
    return [(ours[p].new_tokens / ours[p].seconds) / (plain[p].new_tokens / plain[p].seconds) for p in parts]


def markdown_table(rows: list[RunSummary]) -> str:
    """The runs as a table; the speedup by part where a run has parts (--rounds), and a last column the shapes
    adaptive speculation chose (share of request-steps), when a run has them."""
    adaptive = any(row.shapes for row in rows)
    parts = any(row.speedup_by_part for row in rows)
    lines = ["| mode | batch | requests | new tokens | tokens/s | speedup | "
             + ("speedup by part (lowest-highest) | " if parts else "") + "mean accepted length | "
             "draft acceptance | acceptance at position 1, 2, ... | same tokens as plain | peak memory (GiB) |"
             + (" shapes chosen |" if adaptive else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if parts else "") + ("---|" if adaptive else "")]
    for row in rows:
        speedup = f"{row.speedup:.2f}x" if row.speedup is not None else ""
        rate = f"{row.draft_acceptance_rate:.1%}" if row.draft_acceptance_rate is not None else ""
        positions = ", ".join(f"{p:.2f}" for p in row.position_acceptance)
        same = f"{row.same_as_plain:.0%}" if row.same_as_plain is not None else ""
        by_part = (f"{min(row.speedup_by_part):.2f}-{max(row.speedup_by_part):.2f} | " if row.speedup_by_part
                   else "| ") if parts else ""
        lines.append(f"| {row.mode} | {row.batch_size} | {row.requests} | {row.new_tokens} | "
                     f"{row.tokens_per_second:.1f} | {speedup} | {by_part}{row.mean_accepted_length:.2f} | {rate} | "
                     f"{positions} | {same} | {row.peak_memory_gib:.2f} |" + (f" {shape_shares(row.shapes)} |"
                                                                             if adaptive else ""))
    return "\n".join(lines)


def shape_shares(shapes: dict[str, int]) -> str:
    """{"plain": 3, "chain-4": 1} -> "plain 75%, chain-4 25%"."""
    total = sum(shapes.values())
    return ", ".join(f"{name} {count / total:.0%}" for name, count in sorted(shapes.items(), key=lambda x: -x[1]))
