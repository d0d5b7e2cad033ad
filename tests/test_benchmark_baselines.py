"""benchmarks/baselines.py's reading of an sglang wheel, on stand-in wheels (no sglang here): each kernel file is
found at the first of its known places, the subset written for carrying to a GPU machine holds exactly those files,
and a wheel with neither place names what it looked for; fla-core's wheel trimmed to the ops the benchmarks import,
which still import from it."""

import subprocess
import sys
import tarfile
import zipfile

import pytest

from benchmarks.baselines import SGLANG_GDN, SGLANG_SSU, _inner_path, write_fla_subset, write_subset


def stand_in_wheel(path, files: dict[str, str]):
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
    return path


@pytest.mark.parametrize("layout", [0, 1], ids=["0.5.2x", "0.5.1x"])
def test_subset_holds_the_two_kernel_files(tmp_path, layout):
    files = {SGLANG_GDN[layout]: "gdn = 1\n", SGLANG_SSU[layout]: "ssu = 2\n", "sglang/srt/server.py": "big\n"}
    wheel = stand_in_wheel(tmp_path / "sglang-0-py3-none-any.whl", files)
    subset = tmp_path / "subset.zip"
    write_subset(wheel, subset)
    with zipfile.ZipFile(subset) as archive:
        assert sorted(archive.namelist()) == sorted([SGLANG_GDN[layout], SGLANG_SSU[layout]])
        assert archive.read(SGLANG_GDN[layout]) == b"gdn = 1\n"
        assert _inner_path(archive, SGLANG_SSU) == SGLANG_SSU[layout]


def test_missing_kernel_file_is_named(tmp_path):
    wheel = stand_in_wheel(tmp_path / "other.whl", {SGLANG_GDN[1]: "gdn = 1\n"})
    with pytest.raises(FileNotFoundError, match="mamba_ssm.py"):
        write_subset(wheel, tmp_path / "subset.zip")


def test_fla_subset_keeps_the_gated_delta_rule_and_imports(tmp_path):
    """The trimmed fla keeps its modules, utils, licence and the gated delta rule's ops, drops the other ops (whose
    imports the ops package no longer makes) and the RECORD that lists them, and `from fla.ops.gated_delta_rule
    import ...` works from it."""
    wheel = stand_in_wheel(tmp_path / "fla_core-0.6.0-py3-none-any.whl", {
        "fla/__init__.py": "",
        "fla/ops/__init__.py": "from .kda import chunk_kda\nfrom .gated_delta_rule import chunk_gated_delta_rule\n",
        "fla/ops/gated_delta_rule/__init__.py": "from ..utils.helper import one\n"
                                                "chunk_gated_delta_rule = fused_recurrent_gated_delta_rule = one\n",
        "fla/ops/utils/helper.py": "one = 1\n",
        "fla/ops/kda/__init__.py": "raise ImportError('dropped ops must not be imported')\n",
        "fla/modules/l2norm.py": "l2norm = 2\n",
        "fla_core-0.6.0.dist-info/licenses/LICENSE": "MIT\n",
        "fla_core-0.6.0.dist-info/RECORD": "fla/ops/kda/__init__.py,,\n",
    })
    subset = tmp_path / "fla.tar.xz"
    write_fla_subset(wheel, subset)
    with tarfile.open(subset) as archive:
        names = set(archive.getnames())
        archive.extractall(tmp_path / "site")
    assert "fla/ops/kda/__init__.py" not in names and "fla_core-0.6.0.dist-info/RECORD" not in names
    assert "fla_core-0.6.0.dist-info/licenses/LICENSE" in names
    assert {"fla/modules/l2norm.py", "fla/ops/utils/helper.py", "fla/ops/gated_delta_rule/__init__.py"} <= names
    run = subprocess.run([sys.executable, "-c", "from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule "
                          "as f; from fla.modules.l2norm import l2norm; print(f, l2norm)"],
                         cwd=tmp_path / "site", capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "2"]


def test_the_carried_sglang_wheel_is_the_kernel_tables_default(tmp_path):
    """benchmarks.kernels takes the SGLang baselines from the wheel or subset a device call carries in .whl/ when
    --sglang-wheel is not given (a run without them loses the table's SGLang columns)."""
    from benchmarks.baselines import carried_sglang_wheel

    assert carried_sglang_wheel(tmp_path) is None
    (tmp_path / "fla_slim.tar.xz").write_bytes(b"")
    assert carried_sglang_wheel(tmp_path) is None
    subset = tmp_path / "sglang-0.5.10.post1-kernels-subset.zip"
    subset.write_bytes(b"")
    assert carried_sglang_wheel(tmp_path) == subset
    wheel = tmp_path / "sglang-0.5.10-py3-none-any.whl"
    wheel.write_bytes(b"")
    assert carried_sglang_wheel(tmp_path) == wheel  # a whole wheel before a subset
