"""benchmarks/kernel_settings.py: a sweep's winners written to a settings file, applied to every benchmark started
with SPECDEC_KERNEL_SETTINGS, and recorded beside the figures they produced; and the sweeps' choice of winners."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import kernel_settings
from benchmarks.sweep_gdn import best_settings
from benchmarks.sweep_gdn_candidates import Candidate
from verify_kernels.gdn import fold, verify

ROOT = Path(__file__).resolve().parents[1]
PASS, CONFIG, LANES = ("verify_kernels.gdn.verify.SMALL_TREE_PASS", "verify_kernels.gdn.verify.SMALL_TREE_CONFIG",
                       "verify_kernels.gdn.fold.FOLD_LANES")


@pytest.fixture
def restored(monkeypatch):
    """The constants a test sets, put back after it."""
    for module, name in ((verify, "SMALL_TREE_PASS"), (verify, "SMALL_TREE_CONFIG"), (verify, "STATE_DOT_CONFIGS"),
                         (fold, "FOLD_LANES")):
        monkeypatch.setattr(module, name, getattr(module, name))
    monkeypatch.setattr(kernel_settings, "_applied", {})


def test_values_come_back_in_the_constants_form(tmp_path, restored):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({PASS: True, CONFIG: [64, 1, 2],
                                "verify_kernels.gdn.verify.STATE_DOT_CONFIGS": {"16": [64, 4], "32": [64, 4]}}))
    kernel_settings.apply(kernel_settings.read(path))
    assert verify.SMALL_TREE_PASS is True
    assert verify.SMALL_TREE_CONFIG == (64, 1, 2)                   # a tuple again, not a list
    assert verify.STATE_DOT_CONFIGS == {16: (64, 4), 32: (64, 4)}  # int keys again
    assert kernel_settings.applied() == {PASS: True, CONFIG: [64, 1, 2],
                                         "verify_kernels.gdn.verify.STATE_DOT_CONFIGS": {"16": [64, 4],
                                                                                          "32": [64, 4]}}


@pytest.mark.parametrize(("text", "message"), [
    ('{"verify.SMALL_TREE_PASS": true}', "name a verify_kernels module constant in full"),
    ('{"verify_kernels.gdn.verify.NO_SUCH": 1}', "has no constant 'NO_SUCH'"),
    ('{"verify_kernels.gdn.no_such.X": 1}', "no module 'verify_kernels.gdn.no_such'"),
    ('{"verify_kernels.gdn.verify.gdn_verify": 1}', "has no constant 'gdn_verify'"),  # (a function, not a setting)
    ("[1, 2]", "expected a JSON object"),
    ("{not json", "not a readable JSON file"),
])
def test_bad_files_are_refused_in_one_line(tmp_path, text, message):
    path = tmp_path / "settings.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        kernel_settings.read(path)
    assert "\n" not in str(error.value)


def test_winners_merge_whole_or_not_at_all(tmp_path, capsys):
    """A group (one op's winning candidate) that would change an earlier winner's value is left out whole: its
    settings were only measured together."""
    path = tmp_path / "winners.json"
    assert kernel_settings.merge_winners(path, []) == {}                   # (the file exists even with no winner)
    kernel_settings.merge_winners(path, [{PASS: True, CONFIG: (64, 1, 2)}])
    held = kernel_settings.merge_winners(path, [{CONFIG: (32, 1, 4), LANES: 8}, {PASS: True, LANES: 2}])
    assert held == {PASS: True, CONFIG: [64, 1, 2], LANES: 2}
    assert "not written" in capsys.readouterr().out
    assert kernel_settings.merge_winners(path, [{CONFIG: (64, 1, 2)}]) == held  # the same value is no clash


def test_the_environment_applies_them_to_any_benchmark(tmp_path):
    """SPECDEC_KERNEL_SETTINGS is read when the benchmarks package is imported, before any benchmark runs; a bad
    file stops it with the file's problem named."""
    path = tmp_path / "winners.json"
    path.write_text(json.dumps({PASS: True, LANES: 8}))
    script = "import benchmarks.report\nfrom verify_kernels.gdn import fold, verify\n" \
             "print(verify.SMALL_TREE_PASS, fold.FOLD_LANES)"
    env = {**os.environ, kernel_settings.ENV: str(path)}
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "True 8"
    assert "[kernel settings] 2 from" in run.stdout
    path.write_text('{"verify_kernels.gdn.verify.NO_SUCH": 1}')
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0 and "has no constant 'NO_SUCH'" in run.stderr and "Traceback" not in run.stderr


@pytest.mark.parametrize("sweep", ["benchmarks.sweep_gdn", "benchmarks.sweep_mamba2"])
def test_the_sweeps_describe_their_winners_flag(sweep):
    """--help of the sweeps (argparse formats help strings with %: a margin written as "3%" broke it)."""
    run = subprocess.run([sys.executable, "-m", sweep, "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "--winners" in run.stdout and "3%" in run.stdout


def test_results_name_the_settings_they_ran_with():
    from benchmarks.study import merge
    from benchmarks.study_report import tuned_note

    assert kernel_settings.sentence({}) == ""
    assert "gdn.verify.SMALL_TREE_PASS = True" in kernel_settings.sentence({PASS: True})
    row = {"backend": "kvbuffer", "mode": "speculative", "batch_size": 128, "tokens_per_s": 1.0}
    result = {"model": "m", "layers": 1, "settings": {"draft": "synthetic:2.7"}, "transformers": []}
    merged = merge([{**result, "rows": [row], "kernel_settings": {PASS: True}},
                    {**result, "rows": [{**row, "backend": "intermediate"}], "kernel_settings": {}}])
    assert [r.get("kernel_settings") for r in merged[0]["rows"]] == [{PASS: True}, None]
    note = tuned_note(merged[0])
    assert "SMALL_TREE_PASS = True, in kvbuffer speculative batch 128." in note
    assert "intermediate" not in note


def test_settings_since_made_the_defaults_are_named_apart(monkeypatch):
    """A results table regenerated after a winner went into its module names it as a default now, not as a setting
    other than the defaults; the comparison is with the code's value even where this process applied another."""
    from verify_kernels.gdn import verify

    default, other = verify.SMALL_TREE_CONFIG, [1, 2, 3]
    text = kernel_settings.sentence({CONFIG: list(default)})
    assert "since made the defaults: gdn.verify.SMALL_TREE_CONFIG" in text and "other than" not in text
    text = kernel_settings.sentence({CONFIG: other})
    assert "other than the defaults" in text and "since made" not in text
    monkeypatch.setattr(kernel_settings, "_replaced", {})
    monkeypatch.setattr(kernel_settings, "_applied", {})
    monkeypatch.setattr(verify, "SMALL_TREE_CONFIG", default)
    kernel_settings.apply({CONFIG: other})  # (monkeypatch restores the module's value)
    assert verify.SMALL_TREE_CONFIG == tuple(other)
    assert "other than the defaults" in kernel_settings.sentence(kernel_settings.applied())


def _rows(table: dict[str, list[float]], op: str = "smalltree", errors: dict[str, float] | None = None) -> list:
    """Sweep rows (candidate, workload, batch, us, share, registers, error) of the candidates' times per batch."""
    rows = []
    for label, times in table.items():
        candidate = Candidate(op, label, {} if label == "defaults" else {"verify.SMALL_TREE_PASS": True})
        for batch, us in zip((64, 256), times, strict=False):
            rows.append((candidate, f"verify {op}", batch, us, 0.5, "", (errors or {}).get(label, 0.0)))
    return rows


def test_a_sweep_winner_must_time_every_workload_and_pass_its_check():
    (op, label, total, default, best), = best_settings(_rows({"defaults": [10, 100], "pass": [9, 90],
                                                              "half": [1], "wrong": [1, 1]}, errors={"wrong": 1.0}))
    assert (op, label, total, default) == ("smalltree", "pass", 99, 110)
    assert best.settings() == {PASS: True}                              # full names, for the settings file
    assert kernel_settings.beats(total, default)
    (_, label, total, default, _), = best_settings(_rows({"defaults": [10, 100], "close": [10, 98]}))
    assert label == "close" and not kernel_settings.beats(total, default)  # 2% is within a sweep's noise


def test_the_mamba2_sweep_writes_only_a_finish_tile_that_wins():
    from benchmarks.sweep_mamba2 import DEFAULTS, finish_name, verify_winner

    rows = [{"op": f"verify {tree}", "batch": batch, "config": config, "us": us}
            for tree in ("chain5", "tree16") for batch in (64, 256)
            for config, us in ((DEFAULTS, 100.0), (finish_name(32, 1), 90.0), ("dots bp32 w4", 50.0),
                               (f"{DEFAULTS}, fp32 B and C", 10.0))]
    name, settings = verify_winner(rows)
    assert name == finish_name(32, 1)  # the faster "dots" has no module setting of its own: a person sets it
    assert settings == {"verify_kernels.mamba2.verify.SPLIT_FINISH_BLOCK_P": 32,
                        "verify_kernels.mamba2.verify.SPLIT_FINISH_WARPS": 1}
    assert verify_winner([{**row, "us": 99.0} if row["config"] != DEFAULTS else row for row in rows]) is None


def test_the_mamba2_sweep_writes_the_commit_settings_that_win_its_speculative_case():
    from benchmarks.sweep_mamba2 import COMMIT_CASE, commit_winner

    rows = [{"op": case, "batch": batch, "config": config, "us": us}
            for batch in (64, 256)
            for case in (COMMIT_CASE, "commit, no row folds")
            for config, us in (("defaults", 100.0), ("16 P rows a program", 90.0 if case == COMMIT_CASE else 200.0),
                               ("16 P rows a program, 2 warps", 95.0))]
    name, settings = commit_winner(rows)
    assert name == "16 P rows a program" and settings == {"verify_kernels.mamba2.commit.BLOCK_P_MAX": 16}
    close = [{**row, "us": 98.0} if row["config"] != "defaults" else row for row in rows]
    assert commit_winner(close) is None
