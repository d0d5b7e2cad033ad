"""A non-editable install carries everything the aliases need: the wheel built from the repository holds the
configs/ presets and the shipped models, and, unpacked away from the clone, resolves `qwen3.5` to its own copy."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_an_installed_wheel_knows_the_aliases(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("specdec-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"configs/models.json", "configs/shipped_models.json", "specdec/presets.py"} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("from specdec.presets import resolve, small_draft_for; from specdec.training.lm import PRESETS_FILE; "
            "print(resolve('qwen3.5')); print(small_draft_for('qwen3.5')); print(PRESETS_FILE.is_file())")
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True, capture_output=True,
                         text=True).stdout.split()
    assert out[0].startswith(str(site)) and Path(out[0], "config.json").is_file(), out
    assert out[1].startswith(str(site)) and out[2] == "True", out
