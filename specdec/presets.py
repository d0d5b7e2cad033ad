"""Model-family aliases from configs/models.json: `qwen3.5`, `qwen3.5:0.8b`, `nemotron-3`; `small` and `eagle3` for
a drafter.

A size's entry is a hub id or `shipped:NAME`, one of the small trained models in specdec/checkpoints (the families'
default size, so that everything runs offline). `small` is the draft paired with the target's size (`drafts`), else
the family's smallest size; `eagle3` is the EAGLE-3 head trained for the target's size (`eagle3_heads`).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from configs import config_file

# specdec.models.checkpoint (HUB_ID, read_config) is imported where needed: it brings torch, and the command line
# resolves aliases before it needs torch.

MODELS_FILE = config_file("models.json")
SHIPPED_DIR = Path(__file__).resolve().parent / "checkpoints"
SHIPPED = "shipped:"
DEFAULT_TARGET = "qwen3.5"  # its default size is the shipped qwen3.5-tiny
RANDOM = "random:"


@functools.cache
def families() -> dict[str, dict]:
    if not MODELS_FILE.is_file():
        raise FileNotFoundError(f"{MODELS_FILE} is missing; reinstall specdec (model aliases live in configs/)")
    return json.loads(MODELS_FILE.read_text())


def resolve(name: str) -> str:
    """An alias (`family` or `family:size`) -> hub id or shipped directory; `random:SHAPE[:LAYERS]` -> the directory of
    a random-weight model of a real model's shapes (its config; the weights are drawn on the device it loads on);
    anything else (hub id, local path) is returned as given."""
    if name.startswith(RANDOM):  # random weights at a real model's shapes, for benchmarks
        from specdec.models.random_checkpoint import random_target_at_shape

        shape, _, layers = name.removeprefix(RANDOM).partition(":")
        if layers and not layers.isdigit():
            raise ValueError(f"{name!r}: the part after the shape name is a layer count, e.g. random:{shape}:8")
        return str(random_target_at_shape(shape, int(layers) if layers else None))
    family, _, size = name.partition(":")
    if family not in families():
        if Path(name).expanduser().exists() or _is_hub_id(name):
            return name
        raise ValueError(
            f"unknown model {name!r}: not a family alias ({', '.join(sorted(families()))}, optionally with "
            "':size'), a hub id (owner/name) or an existing directory"
        )
    spec = families()[family]
    size = size or spec["default"]
    if size not in spec["sizes"]:
        raise ValueError(f"{family} has no size {size!r}; sizes: {', '.join(spec['sizes'])}")
    return location(spec["sizes"][size])


def _is_hub_id(name: str) -> bool:
    if "/" not in name:  # every hub id has one: an unknown alias fails without importing torch
        return False
    from specdec.models.checkpoint import HUB_ID

    return bool(HUB_ID.match(name))


def location(entry: str) -> str:
    """A size's entry -> hub id, or the directory of a shipped model."""
    if not entry.startswith(SHIPPED):
        return entry
    directory = SHIPPED_DIR / entry.removeprefix(SHIPPED)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"the shipped model {directory} is missing: it comes with a full clone of the "
                                "repository (or rebuild it with examples/train_shipped_models.sh)")
    return str(directory)


def small_draft_for(target: str) -> str:
    """`--draft small`: the draft model paired with the target's size, else the family's smallest size (the target
    given as alias, hub id or directory)."""
    family, size = family_and_size(target)
    spec = families()[family]
    return location(spec["sizes"][spec.get("drafts", {}).get(size, spec["smallest"])])


def eagle3_head_for(target: str) -> str:
    """`--draft eagle3`: the EAGLE-3 head trained for the target's size."""
    family, size = family_and_size(target)
    heads = families()[family].get("eagle3_heads", {})
    if size not in heads:
        known = ", ".join(f"{family}:{s}" for s in heads) or "none"
        raise ValueError(f"no EAGLE-3 head is listed for {target!r} (listed: {known}); "
                         "give one as --draft eagle3:PATH")
    return location(heads[size])


def family_and_size(target: str) -> tuple[str, str | None]:
    """The target's family and size key; the size is None for a hub id or directory that no size names."""
    family, _, size = target.partition(":")
    if family in families():
        return family, size or families()[family]["default"]
    family = family_of_checkpoint(target)
    for key, entry in families()[family]["sizes"].items():
        shipped = SHIPPED_DIR / entry.removeprefix(SHIPPED)
        if entry.startswith(SHIPPED) and Path(target).resolve() == shipped.resolve():
            return family, key
    return family, None


def family_of_checkpoint(path: str) -> str:
    directory = Path(path)
    if not directory.is_dir():
        raise ValueError(
            f"--draft small needs the target's family: give the target as an alias ({', '.join(families())}) "
            f"or a local directory, not {path!r}"
        )
    from specdec.models.checkpoint import read_config

    model_type = read_config(directory).get("model_type")
    for family, spec in families().items():
        if model_type in spec["model_types"]:
            return family
    raise ValueError(f"no model family in configs/models.json has model_type {model_type!r}")


def drafter_asked(target: str | None, draft: str | None) -> str | None:
    """The drafter a command line asks for: --draft as given ('none': plain decoding); without it the paired
    'small' draft for the default target, and plain decoding for a target the user named."""
    if draft is None:
        return "small" if target is None else None
    return None if draft == "none" else draft
