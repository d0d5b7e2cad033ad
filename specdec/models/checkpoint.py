"""Finding a checkpoint and reading its tensor names and tensors (config.json + safetensors, single or sharded)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm.auto import tqdm

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# What a model directory needs from the hub: weights, config, tokenizer and generation settings.
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


class CheckpointError(ValueError):
    """A checkpoint that cannot be found or does not match the model its config describes."""


def resolve_checkpoint(name_or_path: str | Path) -> Path:
    """A local directory, or a Hugging Face hub id downloaded (or found in the local hub cache)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path} is a file; pass the checkpoint DIRECTORY (the one holding config.json)")
    name = str(name_or_path)
    if not HUB_ID.match(name):
        raise CheckpointError(
            f"no checkpoint directory at {path} and {name!r} is not a hub id of the form 'owner/name'; "
            "pass the path of a directory holding config.json and *.safetensors"
        )
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id=name, allow_patterns=HUB_PATTERNS))
    except Exception as error:  # offline, unknown repo, gated repo, network down: one actionable message
        raise CheckpointError(
            f"could not get {name!r} from the Hugging Face hub and it is not in the local hub cache "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else 'no details'}). "
            f"Download it where the hub is reachable (`huggingface-cli download {name} --local-dir DIR`) and pass "
            "that directory instead, e.g. `--target DIR` or `load_model('DIR')`"
        ) from error


def read_config(directory: Path) -> dict:
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{directory} has no config.json; is it a Hugging Face model directory?")
    with open(config_file) as handle:
        return json.load(handle)


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those named by the shard index, else model.safetensors, else all."""
    index = directory / INDEX_FILE
    if index.is_file():
        with open(index) as handle:
            weight_map = json.load(handle)["weight_map"]
        files = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [str(f.name) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{INDEX_FILE} in {directory} names shards that are not there: {missing}")
        return files
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        present = sorted(p.name for p in directory.iterdir())[:12]
        raise CheckpointError(
            f"no .safetensors weights in {directory} (it holds {present}); specdec reads safetensors only: "
            "re-save the model with save_pretrained(..., safe_serialization=True)"
        )
    return files


def damaged(file: Path, error: Exception) -> CheckpointError:
    """The error for a weights file that is not a complete safetensors file."""
    return CheckpointError(f"{file} is damaged: it is not a complete safetensors file ({error}); it was probably cut "
                           "short while downloading or copying: fetch or copy it again")


def tensor_names(files: list[Path]) -> dict[str, Path]:
    """Every tensor name -> the file holding it (reads headers only); a damaged file is named as such."""
    names: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as handle:
                keys = list(handle.keys())
        except SafetensorError as error:
            raise damaged(file, error) from None
        for name in keys:
            if name in names:
                raise CheckpointError(f"tensor {name} appears in both {names[name].name} and {file.name}")
            names[name] = file
    return names


def iter_tensors(files: list[Path], device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) one at a time, read straight onto `device`, so a model is never held twice."""
    for name, handle in iter_handles(files, device):
        yield name, handle.get_tensor(name)


def iter_handles(files: list[Path], device: torch.device) -> Iterator[tuple[str, TensorReader]]:
    """(name, a reader of the open file holding it) one name at a time, for the caller to read the whole tensor
    (get_tensor) or a part (get_slice: a tensor-parallel rank's rows) before the next name.
    A progress bar over the shards shows on a terminal (not in logs or tests)."""
    target = "cpu" if device.type == "cpu" else str(device)
    for file in tqdm(files, desc="loading shards", unit="shard", disable=None if len(files) > 1 else True):
        try:
            with safe_open(file, framework="pt", device=target) as handle:
                reader = TensorReader(file, handle)
                for name in handle.keys():
                    yield name, reader
        except SafetensorError as error:
            raise damaged(file, error) from None


class TensorReader:
    """Reads tensors of one open safetensors file; a damaged file is named as such."""

    def __init__(self, file: Path, handle):
        self.file = file
        self.handle = handle

    def get_tensor(self, name: str) -> torch.Tensor:
        try:
            return self.handle.get_tensor(name)
        except SafetensorError as error:
            raise damaged(self.file, error) from None

    def get_slice(self, name: str):
        """A lazy view of tensor `name`: get_shape(), and indexing with slices reads only the rows asked for."""
        try:
            return self.handle.get_slice(name)
        except SafetensorError as error:
            raise damaged(self.file, error) from None
