"""Prompt sets for `specdec eval`: the shipped ones (specdec/eval/prompts, licences in its SOURCES.md) by name, or
any JSON Lines file with a "prompt" field per line."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"


@dataclass(frozen=True)
class EvalPrompt:
    id: str
    text: str
    chat: bool  # send it through the tokenizer's chat template


# name -> (file, field holding the text, whether it goes through the chat template)
SHIPPED = {
    "mt-bench": ("mt_bench.jsonl", "turns", True),      # the first of the two turns
    "humaneval": ("humaneval.jsonl", "prompt", False),  # a function head to complete
    "gsm8k": ("gsm8k.jsonl", "question", True),
}


def load_prompts(dataset: str, num_prompts: int | None = None, chat: bool = False) -> list[EvalPrompt]:
    """The first num_prompts prompts (all without it) of a shipped set or of a JSONL file; `chat` applies the chat
    template to a file's prompts (the shipped sets say themselves)."""
    if num_prompts is not None and num_prompts < 1:
        raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
    if dataset in SHIPPED:
        file, field, chat = SHIPPED[dataset]
        path = PROMPTS_DIR / file
    else:
        path, field = Path(dataset), "prompt"
        if path.suffix != ".jsonl" or not path.is_file():
            raise ValueError(f"--dataset {dataset!r} is neither a shipped set ({', '.join(SHIPPED)}) nor an "
                             "existing .jsonl file with a 'prompt' field per line")
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number} is not JSON ({error.msg}); write one JSON object per line") from None
        text = row.get(field) if isinstance(row, dict) else None
        if isinstance(text, list):  # multi-turn: the first turn
            text = text[0] if text else None
        if not isinstance(text, str) or not text:
            raise ValueError(f"{path}:{number} has no non-empty string {field!r} field")
        prompts.append(EvalPrompt(str(row.get("id", number - 1)), text, chat))
        if num_prompts is not None and len(prompts) == num_prompts:
            break
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    if len({p.id for p in prompts}) != len(prompts):
        raise ValueError(f"{path}: the 'id' fields repeat; give every prompt its own id (or none)")
    return prompts
