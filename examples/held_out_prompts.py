"""Prompts from the held-out part of the training corpus (specdec/training/corpus.py), for measuring acceptance
on text the shipped models never trained on:

    python examples/held_out_prompts.py prompts.jsonl --per-file 8
    specdec run --target DIR --draft mtp --prompts-file prompts.jsonl --max-new-tokens 64

Each prompt is the start of a held-out passage (a line boundary), PROMPT_CHARS characters long, one JSON object
with a "prompt" field per line.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.training.corpus import CORPUS_DIR, read_corpus

PROMPT_CHARS = 200


def held_out_prompts(data: Path, per_file: int) -> list[dict]:
    prompts = []
    for file in read_corpus(data):
        lines = file.held_out.splitlines(keepends=True)
        starts = range(0, len(lines), max(1, len(lines) // per_file))
        for start in list(starts)[:per_file]:
            text = "".join(lines[start:start + 40])[:PROMPT_CHARS]
            if text.strip():
                prompts.append({"source": file.name, "prompt": text})
    return prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--data", type=Path, default=CORPUS_DIR)
    parser.add_argument("--per-file", type=int, default=8)
    args = parser.parse_args()
    prompts = held_out_prompts(args.data, args.per_file)
    args.out.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    print(f"{len(prompts)} prompts written to {args.out}")


if __name__ == "__main__":
    main()
