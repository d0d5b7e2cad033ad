"""The L2 prefetch of the state-streaming kernels (verify_kernels/prefetch.py): off in Triton's interpreter, which runs
no PTX, and, where on, compiled for the H200 (sm_90) into prefetch instructions. Its timing is the GPU sweeps'
(benchmarks/sweep_gdn.py, sweep_mamba2.py); its correctness the kernels' own tests and the sweeps' checks (it moves
no data a kernel reads)."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

from verify_kernels import prefetch  # noqa: E402

# compiled in a process of its own: the tests' kernels are the interpreter's (tests/conftest.py), which compile to
# nothing
COMPILE = """
from benchmarks import gdn_registers
from verify_kernels.gdn import decode, fold
decode.PREFETCH_AHEAD, fold.FOLD_PREFETCH_ROWS = {ahead}, {rows}
for label, kernel, constexprs, warps in gdn_registers.variants():
    if label in ("decode + commit", "fold: flush"):
        ptx = gdn_registers.compiled(kernel, constexprs, warps).asm["ptx"]
        print(label, constexprs["PREFETCH"], "prefetch.global.L2" in ptx)
"""


def test_prefetch_is_off_in_the_interpreter_and_when_not_asked(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert not prefetch.enabled(800)
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not prefetch.enabled(0)
    assert prefetch.enabled(800)


@pytest.mark.parametrize("on", [False, True])
def test_prefetching_kernels_compile_for_sm90_with_prefetch_instructions(on):
    """Compiled as for the H200 (no GPU needed): the PTX of the decode and the fold holds an L2 prefetch when on and
    none when off."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = COMPILE.format(ahead=800 if on else 0, rows=1 if on else 0)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:2] == [f"decode + commit {on} {on}", f"fold: flush {on} {on}"]
