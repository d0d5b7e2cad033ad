"""benchmarks/study.py on the shipped Qwen3.5 (its --tiny smoke run): the JSON it writes, rooflines and peaks
included, turns into the BENCHMARKS.md section; runs split over processes are joined per model and layer count."""

from __future__ import annotations

import json

from benchmarks.study import merge, plot, run
from benchmarks.study_report import STUDY_END, STUDY_START, study_section


def test_a_smoke_run_makes_the_section(tmp_path):
    result = run("qwen3.5-9b", layers=8, batches=(1, 2), new_tokens=8, device="cpu", tiny=True)
    assert {(r["backend"], r["mode"]) for r in result["rows"]} == {
        ("kvbuffer", "plain"), ("kvbuffer", "speculative"), ("recurrent", "plain"), ("recurrent", "speculative")}
    assert [r["batch_size"] for r in result["transformers"]] == [1]
    assert result["peaks"]["copy_bytes_per_second"] > 0 and "CPU" in result["peaks"]["source"]
    assert all(r["roofline_ms_per_step"] > 0 and r["x_roofline"] > 0 for r in result["rows"])
    figure = plot(result, tmp_path / "study.png")
    assert figure.read_bytes()[:4] == b"\x89PNG"
    section = study_section([result], [figure])
    assert section.startswith(STUDY_START) and section.endswith(STUDY_END) and "synthetic" not in section
    assert f"]({figure.as_posix()})" in section and "| 2 | " in section
    assert "qwen3.5-9b (8 layers), plain B=256" not in section  # no target point in a smoke run


def test_parts_of_a_model_are_joined_per_layer_count():
    part = {"model": "m", "layers": 40, "rows": [{"batch_size": 1}], "transformers": [{"batch_size": 1}]}
    other = {"model": "m", "layers": 40, "rows": [{"batch_size": 512}], "transformers": []}
    shallow = {"model": "m", "layers": 8, "rows": [{"batch_size": 1}], "transformers": []}
    joined, eight = merge([part, other, shallow])
    assert [r["batch_size"] for r in joined["rows"]] == [1, 512] and len(joined["transformers"]) == 1
    assert eight["layers"] == 8 and len(eight["rows"]) == 1
    assert part["rows"] == [{"batch_size": 1}]  # the inputs stay as they were


def test_adaptive_rows_are_held_against_plain_and_fixed_and_collapsed_runs_kept_apart():
    from benchmarks.study import acceptance_suffix
    from benchmarks.study_report import adaptive_table

    def row(mode, batch, speed, shapes=None):
        return {"backend": "kvbuffer", "mode": mode, "batch_size": batch, "tokens_per_second": speed,
                "shapes": shapes}

    rows = [row("plain", 1, 100.0), row("speculative", 1, 200.0), row("adaptive", 1, 190.0, {"chain-4": 9, "plain": 1}),
            row("plain", 256, 9000.0), row("speculative", 256, 8000.0), row("adaptive", 256, 9000.0, {"plain": 4})]
    table = adaptive_table({"rows": rows})
    assert table[2] == "| 1 | 100 | 200 | 190 | 0.95x | 1.90x | chain-4 90%, plain 10% |"
    assert table[3] == "| 256 | 9000 | 8000 | 9000 | 1.00x | 1.00x | plain 100% |"
    assert adaptive_table({"rows": rows[:2]})[2:] == []  # no adaptive rows: no table
    measured = {"model": "qwen3.5-9b", "layers": 32, "rows": rows[:3], "transformers": [],
                "settings": {"draft": "synthetic:2.72"}}
    collapsed = {**measured, "rows": rows[3:], "settings": {"draft": "synthetic:1.2"}}
    assert len(merge([measured, collapsed])) == 2
    assert (acceptance_suffix(measured), acceptance_suffix(collapsed)) == ("", "_accepted1.2")


def test_an_engine_run_in_several_processes_keeps_its_median_run():
    from benchmarks.study_report import adaptive_table

    def row(mode, speed, shapes=None):
        return {"backend": "kvbuffer", "mode": mode, "batch_size": 1, "tokens_per_second": speed, "shapes": shapes}

    parts = [{"model": "m", "layers": 4, "transformers": [], "settings": {"draft": "synthetic:2.72"}, "rows": rows}
             for rows in ([row("plain", 100.0), row("speculative", 200.0)],
                          [row("speculative", 180.0), row("adaptive", 150.0, {"chain-4": 9})],
                          [row("speculative", 210.0), row("adaptive", 190.0, {"chain-4": 10})])]
    (joined,) = merge(parts)
    kept = {r["mode"]: r for r in joined["rows"]}
    assert len(joined["rows"]) == 3
    assert kept["speculative"]["tokens_per_second"] == 200.0 and kept["speculative"]["runs"] == [180.0, 200.0, 210.0]
    assert kept["adaptive"]["tokens_per_second"] == 150.0 and kept["adaptive"]["shapes"] == {"chain-4": 9}
    assert "runs" not in kept["plain"]
    assert adaptive_table(joined)[2] == ("| 1 | 100 | 200 (180-210, 3 runs) | 150 (150-190, 2 runs) | 0.75x | 1.50x | "
                                         "chain-4 100% |")


def test_a_collapsed_run_borrows_the_plain_rows_and_sets_no_targets():
    """Plain decoding drafts nothing: a run at a collapsed acceptance shows the measured run's plain rows beside its
    own adaptive ones (the study reads the issue's targets off the measured runs alone: study.report)."""
    from benchmarks.study import with_plain_rows

    def row(mode, batch, speed, backend="kvbuffer"):
        return {"backend": backend, "mode": mode, "batch_size": batch, "tokens_per_second": speed,
                "x_roofline": 1.5, "roofline_speedup_over_recurrent": 1.2}

    measured = {"model": "qwen3.5-9b", "layers": 32, "transformers": [], "settings": {"draft": "synthetic:2.72"},
                "rows": [row("plain", 256, 9000.0), row("speculative", 128, 8000.0)]}
    collapsed = {**measured, "settings": {"draft": "synthetic:1.2"},
                 "rows": [row("speculative", 128, 4000.0), row("adaptive", 256, 8500.0)]}
    joined_measured, joined_collapsed = with_plain_rows([measured, collapsed])
    assert joined_measured is measured
    assert [r["mode"] for r in joined_collapsed["rows"]] == ["plain", "speculative", "adaptive"]
    from benchmarks.study_report import study_target_lines
    targets = "\n".join(study_target_lines([joined_measured]))
    assert targets.count("speculative B=128: KVBuffer step") == 1 and "| 1.50x |" in targets


def test_repeated_adaptive_runs_are_tabled_from_each_engines_median_run(tmp_path):
    from benchmarks.adaptive_runs import table

    speeds = {"plain": (100.0, 90.0), "speculative": (200.0, 180.0), "adaptive": (170.0, 190.0)}
    for mode, runs in speeds.items():
        for index, tokens_per_second in enumerate(runs, 1):
            rows = [{"mode": mode, "backend": "kvbuffer", "batch_size": 16, "tokens_per_second": tokens_per_second,
                     "shapes": {"chain-4": 30, "plain": 2} if mode == "adaptive" else None}]
            result = {"model": "qwen3.5-9b", "settings": {"draft": "synthetic:2.72"}, "rows": rows}
            (tmp_path / f"study_qwen3.5-9b_b16_kvbuffer_{mode}_acc2.72_r{index}.json").write_text(json.dumps(result))
    lines = table(tmp_path)
    assert len(lines) == 3  # the header, its rule, one row
    # each engine's lower run of two: adaptive 170 against fixed 180 and plain 90
    assert lines[2] == ("| qwen3.5-9b | 2.72 | 16 | 90 / 100 | 180 / 200 | 170 / 190 | 0.944x | 1.889x | "
                        "chain-4 30, plain 2 |")
    for path in tmp_path.glob("*_speculative_*"):  # a point run without fixed chains: against plain decoding alone
        path.unlink()
    assert table(tmp_path)[2] == ("| qwen3.5-9b | 2.72 | 16 | 90 / 100 | — | 170 / 190 | 1.889x | 1.889x | "
                                  "chain-4 30, plain 2 |")
    # a run of REPEATS=1 names no run (study_on_device.sh): its file is read all the same
    single = tmp_path / "study_qwen3.5-9b_b16_kvbuffer_speculative_acc2.72.json"
    single.write_text(json.dumps({"model": "qwen3.5-9b", "settings": {"draft": "synthetic:2.72"}, "rows": [
        {"mode": "speculative", "backend": "kvbuffer", "batch_size": 16, "tokens_per_second": 160.0}]}))
    assert table(tmp_path)[2].startswith("| qwen3.5-9b | 2.72 | 16 | 90 / 100 | 160 | 170 / 190 | 1.062x | 1.889x |")
    # engines that ran out of memory at a batch: said so, no ratio
    big = [{"mode": mode, "backend": "kvbuffer", "batch_size": 512, "tokens_per_second": speed,
            "out_of_memory": not speed} for mode, speed in (("plain", 300.0), ("speculative", 0.0), ("adaptive", 0.0))]
    (tmp_path / "study_qwen3.5-9b_b512_kvbuffer_acc2.72.json").write_text(json.dumps(
        {"model": "qwen3.5-9b", "settings": {"draft": "synthetic:2.72"}, "rows": big}))
    assert table(tmp_path)[3] == "| qwen3.5-9b | 2.72 | 512 | 300 | out of memory | out of memory | — | — |  |"
    for path in tmp_path.glob("*_plain_*"):  # a point run without plain decoding: against the fixed shapes alone
        path.unlink()
    assert table(tmp_path)[2] == ("| qwen3.5-9b | 2.72 | 16 | — | 160 | 170 / 190 | 1.062x | — | "
                                  "chain-4 30, plain 2 |")


def test_an_adaptive_folder_names_its_devices_and_sittings_and_keeps_its_notes(tmp_path):
    from benchmarks.adaptive_runs import provenance

    for mode, sitting in (("plain", "15:11 UTC"), ("adaptive", "15:34 UTC")):
        (tmp_path / f"study_qwen3.5-9b_b512_kvbuffer_{mode}_acc2.72.json").write_text(json.dumps(
            {"model": "qwen3.5-9b", "device": "NVIDIA H100 80GB HBM3", "sitting": sitting, "rows": []}))
    assert provenance(tmp_path) == ["", "Measured on NVIDIA H100 80GB HBM3; sittings 15:11 UTC, 15:34 UTC."]
    (tmp_path / "NOTES.md").write_text("## Readings\n\nplain from another sitting\n")
    assert provenance(tmp_path)[2:] == ["", "## Readings\n\nplain from another sitting"]


def test_a_point_re_run_later_replaces_its_earlier_runs_and_is_named():
    from benchmarks.study_report import rerun_note

    def row(backend, batch, speed):
        return {"backend": backend, "mode": "plain", "batch_size": batch, "tokens_per_second": speed}

    first = {"model": "m", "layers": 4, "transformers": [], "settings": {"draft": "synthetic:2.72"},
             "date": "2026-12-02", "rows": [row("kvbuffer", 1, 100.0), row("kvbuffer", 256, 9000.0),
                                            row("recurrent", 256, 9500.0)]}
    later = {**first, "date": "2026-12-03", "rows": [row("kvbuffer", 256, 9900.0), row("recurrent", 256, 9400.0)]}
    (joined,) = merge([later, first])
    kept = {(r["backend"], r["batch_size"]): r["tokens_per_second"] for r in joined["rows"]}
    assert kept == {("kvbuffer", 1): 100.0, ("kvbuffer", 256): 9900.0, ("recurrent", 256): 9400.0}
    assert rerun_note(joined) == (" Re-run on 2026-12-03, after changes to the engine step: plain batch 256 "
                                  "(kvbuffer and recurrent); the same-run ratios of those rows compare backends "
                                  "measured together.")
    (alone,) = merge([first])
    assert rerun_note(alone) == ""


def test_a_later_sitting_of_the_same_day_replaces_the_earlier_runs():
    """Runs of one day: those of the latest sitting (the device call, benchmarks/study_on_device.sh) are kept, their
    median if several; runs with no sitting (before sittings were recorded) count as the day's earliest."""
    from benchmarks.study_report import rerun_note

    def part(sitting, speed, batch=128):
        return {"model": "m", "layers": 4, "transformers": [], "settings": {"draft": "synthetic:2.58"},
                "date": "2026-12-04", "sitting": sitting, "rows": [
                    {"backend": "kvbuffer", "mode": "speculative", "batch_size": batch, "tokens_per_second": speed}]}

    old = {**part("", 10441.0), "rows": part("", 10441.0)["rows"] + part("", 500.0, batch=1)["rows"]}
    del old["sitting"]
    (joined,) = merge([old, part("", 10586.0), part("10:12 UTC", 10896.0), part("10:12 UTC", 10700.0),
                       part("09:47 UTC", 10000.0)])
    kept = {r["batch_size"]: r for r in joined["rows"]}
    assert kept[128]["tokens_per_second"] == 10700.0 and kept[128]["runs"] == [10700.0, 10896.0]
    assert kept[1]["tokens_per_second"] == 500.0
    assert "Re-run on 2026-12-04, 10:12 UTC" in rerun_note(joined)
    # a folder of adaptive runs (study.adaptive_folders) keeps every run of its latest day, as its README does
    (folder,) = merge([part("09:47 UTC", 10000.0), part("10:12 UTC", 10896.0), part("10:12 UTC", 10700.0),
                       {**part("10:00 UTC", 9000.0), "date": "2026-12-03"}], per_day=True)
    assert folder["rows"][0]["runs"] == [10000.0, 10700.0, 10896.0]
    assert folder["rows"][0]["tokens_per_second"] == 10700.0


def test_transformers_reference_re_run_keeps_its_latest_run():
    """The outside reference re-run at a batch (the KVBuffer's plain engine's run brings it) replaces its earlier run
    in the section's line instead of standing beside it ("19 tok/s at batch 1, 8 tok/s at batch 1")."""
    def part(date, speed, batch=1):
        reference = {"backend": "transformers", "mode": "plain", "batch_size": batch, "tokens_per_second": speed}
        return {"model": "m", "layers": 4, "settings": {"draft": "synthetic:2.72"}, "date": date, "rows": [],
                "transformers": [reference]}

    (joined,) = merge([part("2026-12-05", 19.0), part("2026-12-02", 8.0), part("2026-12-02", 113.0, batch=16)])
    kept = {r["batch_size"]: r["tokens_per_second"] for r in joined["transformers"]}
    assert kept == {1: 19.0, 16: 113.0}


def test_adaptive_rows_come_from_the_newest_folder_of_one_sitting_runs(tmp_path):
    """A folder of adaptive runs (plain, fixed and adaptive measured in one sitting) gives each batch it measured
    later than the joined study rows, named in a note; a batch it lacks keeps the study's rows and their mark."""
    from benchmarks.study import adaptive_folders
    from benchmarks.study_report import adaptive_table, section_key

    def run_file(folder, date, rows):
        folder.mkdir(exist_ok=True)
        result = {"model": "m", "layers": 4, "date": date, "sitting": "10:00 UTC", "transformers": [],
                  "settings": {"draft": "synthetic:2.72", "max_new_tokens": 256}, "rows": rows}
        (folder / f"study_m_{len(list(folder.iterdir()))}_r1.json").write_text(json.dumps(result))
        return result

    def row(mode, batch, speed, date=None):
        return {"backend": "kvbuffer", "mode": mode, "batch_size": batch, "tokens_per_second": speed,
                "shapes": {"chain-4": 1} if mode == "adaptive" else None, **({"date": date} if date else {})}

    study = {"model": "m", "layers": 4, "settings": {"draft": "synthetic:2.72"},
             "rows": [row("plain", b, 100.0, "2026-12-05") for b in (1, 64)]
             + [row("speculative", b, 200.0, "2026-12-05") for b in (1, 64)]
             + [row("adaptive", b, 120.0, "2026-12-02") for b in (1, 64)]}
    older, newer = tmp_path / "adaptive_h200_a", tmp_path / "adaptive_h200_b"
    run_file(older, "2026-12-04", [row("plain", 64, 90.0), row("speculative", 64, 100.0), row("adaptive", 64, 99.0)])
    run_file(newer, "2026-12-05", [row("plain", 1, 100.0), row("speculative", 1, 150.0), row("adaptive", 1, 147.0)])
    (tmp_path / "not_adaptive").mkdir()
    found = adaptive_folders(tmp_path)
    assert list(found) == [section_key(study)] and [f for f, _ in found[section_key(study)]] == [
        older.as_posix(), newer.as_posix()]
    lines = adaptive_table(study, found[section_key(study)])
    assert lines[2].startswith("| 1 | 100 | 150 | 147 | 0.98x | 1.47x |"), "the newer folder's sitting"
    assert lines[3].startswith("| 64 | 90 | 100 | 99 | 0.99x | 1.10x |"), "the older folder, still newer than 12-02"
    assert f"Batch 1: `{newer.as_posix()}`" in lines[-2] and "256 new tokens a request" in lines[-2]
    assert f"Batch 64: `{older.as_posix()}`" in lines[-1] and "2026-12-04, 10:00 UTC" in lines[-1]
    alone = adaptive_table(study)  # no folder: the study's own rows, across sittings and marked
    assert alone[2].startswith("| 1 | 100 | 200 | 120 | 0.60x * |")


def test_a_folder_note_says_more_than_one_sitting_only_where_a_row_spans_sittings(tmp_path):
    """A folder whose batches ran in different calls, each row's engines in one of them, says every engine of a row
    ran in one sitting and names both; a row whose plain run came from another sitting is marked and said so."""
    from benchmarks.study import adaptive_folders
    from benchmarks.study_report import adaptive_table

    def part(folder, name, sitting, mode, batch, speed):
        folder.mkdir(exist_ok=True)
        row = {"backend": "kvbuffer", "mode": mode, "batch_size": batch, "tokens_per_second": speed,
               "shapes": {"chain-4": 1} if mode == "adaptive" else None}
        (folder / f"study_m_{name}.json").write_text(json.dumps(
            {"model": "m", "layers": 4, "date": "2026-12-05", "sitting": sitting, "transformers": [],
             "settings": {"draft": "synthetic:2.58", "max_new_tokens": 256}, "rows": [row]}))

    study = {"model": "m", "layers": 4, "settings": {"draft": "synthetic:2.58"}, "rows": []}
    apart = tmp_path / "adaptive_h100_a"
    for batch, sitting in ((1, "17:31 UTC"), (64, "17:29 UTC")):
        for mode, speed in (("plain", 100.0), ("adaptive", 150.0)):
            part(apart, f"b{batch}_{mode}", sitting, mode, batch, speed)
    note = adaptive_table(study, next(iter(adaptive_folders(tmp_path).values())))[-1]
    assert "every engine of a row in one sitting (2026-12-05, 17:29 UTC; 2026-12-05, 17:31 UTC;" in note

    part(apart, "b64_plain", "17:02 UTC", "plain", 64, 100.0)  # batch 64's plain now from an earlier sitting
    lines = adaptive_table(study, next(iter(adaptive_folders(tmp_path).values())))
    assert lines[3].startswith("| 64 | 100 |  | 150 | 1.50x * |")
    assert "its engines in more than one sitting" in lines[-1]


def test_fixed_trees_are_a_mode_of_their_own_and_a_column_where_measured(tmp_path):
    """`--only kvbuffer tree`: the fixed speculative engine on static trees (study.TREE) of synthetic drafts, its rows
    labelled "tree"; the adaptive tables give them a column, and adaptive's best-of counts them."""
    from benchmarks.adaptive_runs import table
    from benchmarks.study_report import adaptive_table

    result = run("qwen3.5-9b", layers=8, batches=(2,), new_tokens=12, device="cpu", tiny=True,
                 only=("kvbuffer", "tree"))
    assert [(r["backend"], r["mode"]) for r in result["rows"]] == [("kvbuffer", "tree")]
    assert (result["settings"]["topk"], result["settings"]["num_draft_tokens"]) == (2, 16)
    assert result["rows"][0]["mean_accepted_length"] > 1

    def row(mode, speed):
        return {"backend": "kvbuffer", "mode": mode, "batch_size": 16, "tokens_per_second": speed,
                "shapes": {"chain-4": 10} if mode == "adaptive" else None}

    speeds = {"plain": 100.0, "speculative": 200.0, "tree": 250.0, "adaptive": 210.0}
    lines = adaptive_table({"rows": [row(mode, speed) for mode, speed in speeds.items()]})
    assert "| fixed tok/s | fixed tree tok/s | adaptive tok/s |" in lines[0]
    assert lines[2] == "| 16 | 100 | 200 | 250 | 210 | 0.84x | 2.10x | chain-4 100% |"
    for mode, speed in speeds.items():
        (tmp_path / f"study_qwen3.5-9b_b16_kvbuffer_{mode}_acc2.72.json").write_text(json.dumps(
            {"model": "qwen3.5-9b", "settings": {"draft": "synthetic:2.72"}, "rows": [row(mode, speed)]}))
    lines = table(tmp_path)
    assert "| fixed 4-chain tok/s | fixed tree tok/s | adaptive tok/s |" in lines[0]
    assert lines[1].count("|") == lines[0].count("|")
    assert lines[2] == "| qwen3.5-9b | 2.72 | 16 | 100 | 200 | 250 | 210 | 0.840x | 2.100x | chain-4 10 |"
