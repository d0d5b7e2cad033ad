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
        module = importlib.import_module(kernels[name])
        # bind every kernel of that module now (later lookups skip this function): importing a submodule sets it as
        # a package attribute, which would hide a kernel of the same name (moe.grouped_linear, glue.mamba2_inputs)
        for other, where in kernels.items():
            if where == kernels[name]:
                package[other] = getattr(module, other)
        return package[name]

    return __getattr__
