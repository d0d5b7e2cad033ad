"""A checkpoint's tokenizer, through transformers."""

from __future__ import annotations

from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def load_tokenizer(directory: str | Path):
    """The checkpoint's tokenizer, or None when it ships none."""
    directory = Path(directory)
    if not any((directory / name).exists() for name in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory)
