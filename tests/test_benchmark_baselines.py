"""benchmarks/baselines.py's reading of an sglang wheel, on stand-in wheels (no sglang here): each kernel file is
found at the first of its known places, the subset written for carrying to a GPU machine holds exactly those files,
and a wheel with neither place names what it looked for."""

import zipfile

import pytest

from benchmarks.baselines import SGLANG_GDN, SGLANG_SSU, _inner_path, write_subset


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
