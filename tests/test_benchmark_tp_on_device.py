"""benchmarks/tp_on_device.sh, issue 18's run for a host of two GPUs, run here on the CPU (gloo ranks) with the shipped
Qwen3.5 at a tiny batch: `specdec bench` at TP2 and TP1, plain, fixed and adaptive speculation, each rank holding half
the linear-state memory of one process."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_tp2_and_tp1_rows_with_the_state_halved(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "SKIP_TESTS": "1", "TARGET": "qwen3.5", "BATCHES": "2",
           "BENCH_ARGS": "--device cpu --max-new-tokens 6 --prompt-tokens 8 --peak-copy-gbs 20 --peak-gemm-tflops 0.2",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(["bash", str(ROOT / "benchmarks" / "tp_on_device.sh"), "300"], env=env, capture_output=True,
                         text=True, timeout=400)
    assert run.returncode == 0, run.stderr
    assert "failed" not in run.stdout, (tmp_path / "tp_qwen3.5.log").read_text()[-3000:]
    rows = {tp: json.loads((tmp_path / f"tp{tp}_qwen3.5.json").read_text())["rows"] for tp in (1, 2)}
    for tp, found in rows.items():
        assert [r["mode"] for r in found] == ["plain", "speculative", "adaptive"], tp
        assert all(r["tokens_per_second"] > 0 for r in found)
        assert json.loads((tmp_path / f"tp{tp}_qwen3.5.json").read_text())["settings"]["tp"] == tp
    for one, two in zip(rows[1], rows[2], strict=True):
        assert two["state_mib_per_request"] == pytest.approx(one["state_mib_per_request"] / 2)
