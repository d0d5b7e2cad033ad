"""The training corpus (specdec/training/corpus, licences in its SOURCES.md, or any folder of *.txt, *.txt.gz or
*.txt.xz files):
per file a training part and a held-out part, the file's last HELD_OUT_FRACTION cut at a line, so held-out text
never sits next to training text of the same passage."""

from __future__ import annotations

import gzip
import lzma
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CORPUS_DIR = Path(__file__).parent / "corpus"
HELD_OUT_FRACTION = 0.02

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# Files of "title\nextract" blocks (Wikipedia leads): every CHAT_EVERY-th block becomes a chat exchange, so the
# models learn the chat template their tokenizer ships with.
CHAT_FILES = ("wiki_en",)
CHAT_EVERY = 2


@dataclass(frozen=True)
class CorpusFile:
    name: str       # file name without .txt / .txt.gz / .txt.xz
    train: str
    held_out: str


def read_corpus(directory: Path | str = CORPUS_DIR) -> list[CorpusFile]:
    """Every *.txt, *.txt.gz and *.txt.xz file of `directory` (compressed ones first, each kind by name), split into
    training and held-out text."""
    directory = Path(directory)
    paths = sorted([*directory.glob("*.txt.gz"), *directory.glob("*.txt.xz")]) + sorted(directory.glob("*.txt"))
    if not paths:
        raise ValueError(f"no *.txt, *.txt.gz or *.txt.xz files in {directory}: pass a folder of UTF-8 text files")
    files = []
    for path in paths:
        name = path.name.removesuffix(".gz").removesuffix(".xz").removesuffix(".txt")
        text = read_text(path)
        train, held_out = split_text(text)
        if name in CHAT_FILES:
            train, held_out = as_chat(train), as_chat(held_out)
        files.append(CorpusFile(name, train, held_out))
    return files


def read_text(path: Path) -> str:
    """A corpus file's UTF-8 text: plain, gzip (.gz) or xz (.xz; the shipped corpus, ~25% smaller than gzip)."""
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix)
    return opener(path, "rt", encoding="utf-8").read() if opener else path.read_text("utf-8")


def split_text(text: str, fraction: float = HELD_OUT_FRACTION) -> tuple[str, str]:
    """(training part, held-out part): the held-out part is the last `fraction` of the text, from a line start."""
    cut = text.rfind("\n", 0, int(len(text) * (1 - fraction))) + 1
    return text[:cut], text[cut:]


def as_chat(text: str) -> str:
    """Blocks "title\\nextract" separated by blank lines; every CHAT_EVERY-th one as a user question about the title
    and the extract as the assistant's answer, in the chat template's format."""
    blocks = [block for block in text.split("\n\n") if block.strip()]
    out = []
    for index, block in enumerate(blocks):
        title, _, extract = block.strip().partition("\n")
        if index % CHAT_EVERY == 0 and extract:
            block = f"{IM_START}user\nTell me about {title}.{IM_END}\n{IM_START}assistant\n{extract}{IM_END}"
        out.append(block)
    return "\n\n".join(out) + "\n"


def text_chunks(texts: list[str], lines_per_chunk: int = 2000) -> Iterator[str]:
    """The texts in pieces of a few thousand lines (what tokenizer training reads at a time)."""
    for text in texts:
        lines = text.splitlines(keepends=True)
        for start in range(0, len(lines), lines_per_chunk):
            yield "".join(lines[start:start + lines_per_chunk])
