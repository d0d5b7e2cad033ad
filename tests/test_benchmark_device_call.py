"""benchmarks/device_call.sh, the one-call runner of timed steps for a lent GPU machine, run here with shell steps:
each step's files and log come back packed in one archive, a step that runs out of its time loses only itself, and a
step that would not fit in what is left of the call is skipped."""

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device_call.sh"
PATH = {"PATH": "/usr/bin:/bin"}
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def test_steps_packed_timed_out_and_skipped(tmp_path):
    steps = ['5:echo kept > "$STEP_OUT/result.txt"; echo step one done', "1:sleep 5", "60:echo never"]
    run = subprocess.run(["bash", str(SCRIPT), *steps], env={"OUT": str(tmp_path), "TOTAL": "20", **PATH},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "[call] step 2 exit 124" in run.stdout  # the sleep ran out of its second, the call went on
    assert "[call] step 3 skipped: it asks 60s" in run.stdout
    with tarfile.open(tmp_path / "call.tar.gz") as archive:
        names = {Path(name).as_posix().lstrip("./") for name in archive.getnames()}
        assert {"step01/result.txt", "step01/log.txt", "step02/log.txt", "step03/command.txt"} <= names
        assert "step03/log.txt" not in names
        assert archive.extractfile("./step01/result.txt").read() == b"kept\n"
        assert archive.extractfile("./step01/log.txt").read() == b"step one done\n"


def test_a_call_killed_from_outside_hands_back_the_steps_that_ended(tmp_path):
    """The run's own limit kills the whole call (2026-12-06: a cold machine's compile outlasted the call, and nothing
    came back): the archive, packed after every step, holds those that ended."""
    steps = ['5:echo kept > "$STEP_OUT/result.txt"', "10:sleep 10"]  # (the sleep outlives the test by ~7 s)
    run = subprocess.run(["timeout", "3", "bash", str(SCRIPT), *steps], env={"OUT": str(tmp_path), **PATH},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 124  # (killed while the second step slept)
    with tarfile.open(tmp_path / "call.tar.gz") as archive:
        assert archive.extractfile("./step01/result.txt").read() == b"kept\n"


def test_out_is_required(tmp_path):
    run = subprocess.run(["bash", str(SCRIPT), "5:true"], env=PATH, capture_output=True,
                         text=True, timeout=60)
    assert run.returncode != 0
    assert "OUT must name the folder" in run.stderr


@pytest.mark.parametrize("kind", ["zip", "tar.xz"])
def test_fla_unpacked_from_a_wheel_or_a_trimmed_archive(tmp_path, kind):
    """The carried fla-core (a wheel, or a trimmed copy as .tar.xz) is unpacked onto the steps' PYTHONPATH."""
    wheels, site, out = tmp_path / "wheels", tmp_path / "site", tmp_path / "out"
    wheels.mkdir()
    out.mkdir()
    package = tmp_path / "package"
    (package / "fla").mkdir(parents=True)
    (package / "fla" / "__init__.py").write_text("VERSION = 'carried'\n")
    archive = shutil.make_archive(str(wheels / "fla_core"), "zip" if kind == "zip" else "xztar", package)
    assert archive.endswith(kind)
    run = subprocess.run(["bash", str(SCRIPT), '5:python3 -c "import fla; print(fla.VERSION)"'],
                         env={"OUT": str(out), "WHEELS": str(wheels), "SITE": str(site), **PATH},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert "carried" in run.stdout


def test_steps_share_a_kernel_settings_file(tmp_path):
    """KERNEL_WINNERS starts as an empty settings file ({}, valid for SPECDEC_KERNEL_SETTINGS) that a sweep step
    adds to and a later step reads; it comes back in the archive."""
    steps = ['5:cat "$KERNEL_WINNERS"; echo \'{"verify_kernels.gdn.fold.FOLD_LANES": 8}\' > "$KERNEL_WINNERS"',
             '5:cat "$KERNEL_WINNERS"']
    run = subprocess.run(["bash", str(SCRIPT), *steps], env={"OUT": str(tmp_path), "TOTAL": "20", **PATH},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    with tarfile.open(tmp_path / "call.tar.gz") as archive:
        assert archive.extractfile("./step01/log.txt").read() == b"{}\n"
        assert b"FOLD_LANES" in archive.extractfile("./step02/log.txt").read()
        assert b"FOLD_LANES" in archive.extractfile("./kernel_winners.json").read()


def test_a_call_starts_from_an_earlier_calls_winners(tmp_path):
    earlier = tmp_path / "winners.json"
    earlier.write_text('{"verify_kernels.gdn.fold.FOLD_LANES": 8}')
    out = tmp_path / "out"
    out.mkdir()
    run = subprocess.run(["bash", str(SCRIPT), '5:cat "$KERNEL_WINNERS"'],
                         env={"OUT": str(out), "KERNEL_WINNERS_FROM": str(earlier), **PATH},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    with tarfile.open(out / "call.tar.gz") as archive:
        assert b"FOLD_LANES" in archive.extractfile("./step01/log.txt").read()
