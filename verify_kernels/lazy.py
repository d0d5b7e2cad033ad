"""The Triton kernels of a package, imported on first use: they need triton (the `gpu` extra), and the CPU path,
which runs the references, never imports it."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def kernels_on_first_use(package: dict, kernels: dict[str, str]) -> Callable[[str], object]:
    """A module __getattr__ (PEP 562) for a package's globals(): `kernels` maps a name to the module defining it."""

    def __getattr__(name: str):
        if name not in kernels:
            raise AttributeError(f"module {package['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(kernels[name]), name)
        package[name] = value  # later lookups skip this function
        return value

    return __getattr__
