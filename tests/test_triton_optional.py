"""triton is the `gpu` extra: a CPU install without it runs `specdec run` and the API on the references. One
subprocess, whose import system refuses triton as an uninstalled package would, decodes with both shipped targets
(Qwen3.5's GDN and attention, Nemotron-3's Mamba2, MoE and attention) and never imports triton; asking for the
kernels there says which extra to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

WITHOUT_TRITON = '''
import importlib.abc, sys

class NoTriton(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "triton":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoTriton())
import specdec
from specdec.cli import main

assert main(["run", "--prompt", "The river", "--max-new-tokens", "6", "--device", "cpu"]) == 0
(out,) = specdec.generate(["In the beginning"], target="nemotron-3", draft="mtp", device="cpu", max_new_tokens=6)
print("nemotron tokens", len(out.token_ids))
print("triton imported:", any(name.partition(".")[0] == "triton" for name in sys.modules))
import os, torch
from specdec.backend import backend_for
os.environ["SPECDEC_BACKEND"] = "triton"  # as a CUDA device would pick
try:
    backend_for(torch.device("cpu"), 128, 128)
except ValueError as error:
    print("kernels without triton:", error)
'''


def test_cpu_decoding_without_triton():
    result = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert lines[-3] == "nemotron tokens 6" and lines[-2] == "triton imported: False", result.stdout
    assert lines[-1].startswith("kernels without triton: the GPU kernels need triton, which is not installed: "
                                "pip install 'specdec[gpu]'"), result.stdout
    assert "mean accepted length" in result.stderr


LAZY_KERNELS = """
import importlib, types
for package in ("attention", "conv", "gdn", "glue", "intermediate", "mamba2", "moe"):
    module = importlib.import_module("verify_kernels." + package)
    for name in sorted(getattr(module, "_KERNELS", {})):  # ExpertBlocks before grouped_linear
        assert not isinstance(getattr(module, name), types.ModuleType), (package, name)
print("ok")
"""


def test_lazy_kernels_are_the_functions_not_their_modules():
    """A kernel named like its module (moe.grouped_linear) stays the function whichever name is asked first."""
    result = subprocess.run([sys.executable, "-c", LAZY_KERNELS], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
