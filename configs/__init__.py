"""Presets as data: model-family aliases (models.json) and the shipped models' training presets
(shipped_models.json). A package so that an installed specdec carries them; read with config_file()."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def config_file(name: str) -> Path:
    """The path of configs/NAME, in a clone or in an installed package."""
    return Path(str(files(__name__) / name))
