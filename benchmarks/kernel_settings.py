"""Kernel launch settings applied to a benchmark's process from a JSON file, so that one device call can sweep a
kernel's settings and then measure the kernel table and the engine with the sweep's winners, instead of waiting for
a later call (device time comes in rare, short loans).

The file maps a verify_kernels module constant, by its full dotted name, to a value:

    {"verify_kernels.gdn.verify.SMALL_TREE_PASS": true, "verify_kernels.gdn.verify.SMALL_TREE_CONFIG": [64, 1, 2]}

`python -m benchmarks.sweep_gdn --winners FILE` (and sweep_mamba2's) merge into it the settings that beat the
defaults by WIN_MARGIN; SPECDEC_KERNEL_SETTINGS=FILE applies it to any `python -m benchmarks.X` started after
(benchmarks/__init__.py calls apply_from_env), and the kernel table, the study and the step profiles record what
was applied beside their figures. The kernels read these constants at launch, so setting them is all it takes; a
winner becomes a default only when a person writes it into the module with the sweep's figures.
"""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

ENV = "SPECDEC_KERNEL_SETTINGS"
PACKAGE = "verify_kernels."
WIN_MARGIN = 0.03  # a sweep's setting must beat the defaults' total time by this share to be written as a winner

_applied: dict[str, object] = {}
_replaced: dict[str, object] = {}  # the module's own value of each constant apply() set (its code's default)


def _target(name: str) -> tuple[object, str]:
    """The module and attribute of a full dotted name, or a one-line error naming the fix."""
    module_name, _, attribute = name.rpartition(".")
    if not name.startswith(PACKAGE) or not module_name:
        raise ValueError(f"kernel setting {name!r}: name a verify_kernels module constant in full, e.g. "
                         f"'verify_kernels.gdn.verify.SMALL_TREE_PASS'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"kernel setting {name!r}: no module {module_name!r} ({error})") from None
    if not hasattr(module, attribute) or not attribute.isupper():
        raise ValueError(f"kernel setting {name!r}: {module_name} has no constant {attribute!r}")
    return module, attribute


def like(current: object, value: object) -> object:
    """A JSON value in the form of the constant it replaces: lists back to tuples, a dict's keys back to ints."""
    if isinstance(current, tuple) and isinstance(value, list):
        return tuple(like(c, v) for c, v in zip(current, value, strict=False)) + tuple(value[len(current):])
    if isinstance(current, dict) and isinstance(value, dict):
        sample = next(iter(current.values()), None)
        return {(int(k) if isinstance(next(iter(current), None), int) else k): like(sample, v)
                for k, v in value.items()}
    return value


def read(path: Path) -> dict[str, object]:
    """The settings of a file, checked: every name a verify_kernels constant."""
    try:
        settings = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"kernel settings {path}: not a readable JSON file ({error})") from None
    if not isinstance(settings, dict):
        raise ValueError(f"kernel settings {path}: expected a JSON object of name -> value")
    for name in settings:
        _target(name)
    return settings


def apply(settings: dict[str, object]) -> None:
    """Set each constant (in this process; the kernels read them at launch)."""
    for name, value in settings.items():
        module, attribute = _target(name)
        _replaced.setdefault(name, getattr(module, attribute))
        setattr(module, attribute, like(getattr(module, attribute), value))
        _applied[name] = value


def apply_from_env() -> dict[str, object]:
    """Apply the file that SPECDEC_KERNEL_SETTINGS names, if any; -> what was applied. A bad file stops the process
    with its problem in one line (a benchmark must not run at settings other than those asked for)."""
    path = os.environ.get(ENV)
    if path:
        try:
            settings = read(Path(path))
        except ValueError as error:
            raise SystemExit(f"{ENV}: {error}") from None
        apply(settings)
        print(f"[kernel settings] {len(settings)} from {path}: "
              + ", ".join(f"{name.removeprefix(PACKAGE)} = {value!r}" for name, value in settings.items()),
              flush=True)
    return applied()


def applied() -> dict[str, object]:
    """The settings applied in this process (recorded beside a run's figures; empty at the defaults)."""
    return dict(_applied)


def merge_winners(path: Path, winners: list[dict[str, object]]) -> dict[str, object]:
    """Add winners to the file (created if missing), each group of settings (one op's winning candidate) whole or
    not at all: a group that would change a value the file holds (an earlier op's or sweep's winner) is left out and
    reported, since its settings were only measured together. -> the file's settings."""
    path = Path(path)
    settings = read(path) if path.exists() else {}
    for group in winners:
        group = json.loads(json.dumps(group))  # (as the file holds them: tuples as lists)
        for name in group:
            _target(name)
        clashes = [name for name, value in group.items() if name in settings and settings[name] != value]
        if clashes:
            print(f"[kernel settings] not written: {group} (would change {', '.join(clashes)}, an earlier winner)",
                  flush=True)
            continue
        settings |= group
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(settings, indent=1) + "\n")
    return settings


def beats(total_us: float, default_us: float) -> bool:
    """Whether a setting's total time beats the defaults' by WIN_MARGIN (sweeps move 1-2% between identical runs)."""
    return total_us < default_us * (1 - WIN_MARGIN)


def is_default(name: str, value: object) -> bool:
    """Whether a setting (in a results file's JSON form) is its constant's default in the code as it is now (a
    winner written into its module since the run): the module's own value, not one apply() set in this process."""
    module, attribute = _target(name)
    default = _replaced.get(name, getattr(module, attribute))
    return json.loads(json.dumps(default)) == json.loads(json.dumps(value))


def sentence(settings: dict[str, object] | None) -> str:
    """" Kernel settings other than the defaults: ..." for a results header, the settings since made the defaults
    named apart (a table regenerated after a winner went into the code must not call it other than the default);
    "" at the defaults."""
    if not settings:
        return ""
    others = {name: value for name, value in settings.items() if not is_default(name, value)}
    now_default = {name: value for name, value in settings.items() if name not in others}
    parts = []
    if others:
        parts.append("Kernel settings other than the defaults (a sweep's winners, benchmarks/kernel_settings.py): "
                     + _listed(others))
    if now_default:
        parts.append("Run with a sweep's winners applied (benchmarks/kernel_settings.py), since made the defaults: "
                     + _listed(now_default))
    return "".join(f" {part}." for part in parts)


def _listed(settings: dict[str, object]) -> str:
    return ", ".join(f"{name.removeprefix(PACKAGE)} = {value!r}" for name, value in settings.items())
