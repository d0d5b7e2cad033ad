"""Model-family aliases from configs/models.json: `qwen3.5`, `qwen3.5:0.8b`, `nemotron-3`, and `small` for a draft."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from specdec.models.checkpoint import HUB_ID, read_config

MODELS_FILE = Path(__file__).resolve().parents[1] / "configs" / "models.json"


@functools.cache
def families() -> dict[str, dict]:
    if not MODELS_FILE.is_file():
        raise FileNotFoundError(f"{MODELS_FILE} is missing; model aliases need the repository's configs/ folder")
    return json.loads(MODELS_FILE.read_text())


def resolve(name: str) -> str:
    """An alias (`family` or `family:size`) -> hub id; anything else (hub id, local path) is returned as given."""
    family, _, size = name.partition(":")
    if family not in families():
        if Path(name).expanduser().exists() or HUB_ID.match(name):
            return name
        raise ValueError(
            f"unknown model {name!r}: not a family alias ({', '.join(sorted(families()))}, optionally with "
            "':size'), a hub id (owner/name) or an existing directory"
        )
    spec = families()[family]
    size = size or spec["default"]
    if size not in spec["sizes"]:
        raise ValueError(f"{family} has no size {size!r}; sizes: {', '.join(spec['sizes'])}")
    return spec["sizes"][size]


def smallest_of_family(target: str) -> str:
    """The hub id of the smallest size of the target's family (the target given as alias, hub id or directory)."""
    family = target.partition(":")[0]
    if family not in families():
        family = family_of_checkpoint(target)
    spec = families()[family]
    return spec["sizes"][spec["smallest"]]


def family_of_checkpoint(path: str) -> str:
    directory = Path(path)
    if not directory.is_dir():
        raise ValueError(
            f"--draft small needs the target's family: give the target as an alias ({', '.join(families())}) "
            f"or a local directory, not {path!r}"
        )
    model_type = read_config(directory).get("model_type")
    for family, spec in families().items():
        if model_type in spec["model_types"]:
            return family
    raise ValueError(f"no model family in configs/models.json has model_type {model_type!r}")
