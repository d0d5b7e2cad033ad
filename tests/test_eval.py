"""`specdec eval` on the shipped Qwen3.5 pair: the summary agrees with the per-request JSONL, reruns resume,
settings are guarded, prompt sets load, bad input fails clearly."""

from __future__ import annotations

import json

import pytest

from specdec.cli import main as cli_main
from specdec.eval.datasets import load_prompts
from specdec.eval.run import EvalSettings, run_eval
from specdec.eval.summary import read_records

ARGS = ["eval", "--target", "qwen3.5", "--draft", "small", "--dataset", "mt-bench", "--max-new-tokens", "16",
        "--batch-size", "1", "2"]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    assert cli_main([*ARGS, "--num-prompts", "3", "--output", str(out)]) == 0
    return out


def test_summary_agrees_with_the_records(evaluated):
    summary = json.loads((evaluated / "summary.json").read_text())
    segments = json.loads((evaluated / "segments.json").read_text())
    rows = {(row["mode"], row["batch_size"]): row for row in summary["runs"]}
    assert set(rows) == {("plain", 1), ("plain", 2), ("speculative", 1), ("speculative", 2)}
    for (mode, batch), row in rows.items():
        records = read_records(evaluated / "requests" / f"{mode}-b{batch}.jsonl")
        assert sorted(r["id"] for r in records) == ["81", "82", "83"] and row["requests"] == 3
        emitted = [n for r in records for n in r["emitted_per_step"]]
        drafted = [n for r in records for n in r["drafted_per_step"]]
        new_tokens = sum(r["new_tokens"] for r in records)
        seconds = sum(s["seconds"] for s in segments[f"{mode}-b{batch}"])
        assert all(len(r["token_ids"]) == r["new_tokens"] <= 16 for r in records)
        assert row["new_tokens"] == new_tokens
        assert row["tokens_per_second"] == pytest.approx(new_tokens / seconds)
        assert row["mean_accepted_length"] == pytest.approx(sum(emitted) / len(emitted))
        if mode == "plain":
            assert set(emitted) == {1} and row["draft_acceptance_rate"] is None and row["speedup"] is None
            continue
        accepted = [e - 1 for e in emitted]
        assert row["draft_acceptance_rate"] == pytest.approx(sum(accepted) / sum(drafted))
        assert row["position_acceptance"] == pytest.approx([sum(a >= k for a in accepted) / len(accepted)
                                                            for k in (1, 2, 3, 4)])
        assert row["speedup"] == pytest.approx(row["tokens_per_second"] / rows["plain", batch]["tokens_per_second"])
        assert row["same_as_plain"] == 1.0  # greedy speculative decoding is lossless
        assert row["mean_accepted_length"] > 1.5  # the shipped draft is trained
    table = (evaluated / "summary.md").read_text()
    assert table.count("| speculative |") == 2 and "same tokens as plain" in table
    for plot in ("accepted_length.png", "position_acceptance.png", "throughput.png"):
        assert (evaluated / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_rerun_adds_only_what_is_missing(tmp_path):
    settings = EvalSettings(target="qwen3.5", draft="ngram", dataset="gsm8k", max_new_tokens=8)
    run_eval(settings, load_prompts("gsm8k", 2), [1], tmp_path)
    path = tmp_path / "requests" / "speculative-b1.jsonl"
    first = path.read_text()
    run_eval(settings, load_prompts("gsm8k", 2), [1], tmp_path)   # nothing left to do
    assert path.read_text() == first
    assert len(json.loads((tmp_path / "segments.json").read_text())["speculative-b1"]) == 1
    with open(path, "a") as handle:  # an interrupted run: the last line cut short
        handle.write('{"id": "2", "new_tok')
    rows = run_eval(settings, load_prompts("gsm8k", 3), [1], tmp_path)
    records = read_records(path)
    assert path.read_text().startswith(first) and [r["id"] for r in records] == ["0", "1", "2"]
    assert len(json.loads((tmp_path / "segments.json").read_text())["speculative-b1"]) == 2
    assert {row.requests for row in rows} == {3}
    with pytest.raises(ValueError, match="temperature: 0.0 there, 0.5 now"):
        run_eval(EvalSettings(**{**settings.__dict__, "temperature": 0.5}), load_prompts("gsm8k", 3), [1], tmp_path)


def test_interleaved_rounds_run_each_part_through_every_mode(tmp_path, monkeypatch):
    import specdec.eval.run as run_module

    settings = EvalSettings(target="qwen3.5", draft="ngram", dataset="gsm8k", max_new_tokens=8)
    prompts = load_prompts("gsm8k", 3)
    calls, run_requests = [], run_module.run_requests

    def recorded(llm, todo, batch_size, settings, path, progress, segments, part=None):
        calls.append((path.stem, [prompt.id for _, prompt in todo]))
        run_requests(llm, todo, batch_size, settings, path, progress, segments, part)

    loaded, load_llm = [], run_module.load_llm

    def recorded_load(*args, **kwargs):
        loaded.append(load_llm(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(run_module, "run_requests", recorded)
    monkeypatch.setattr(run_module, "load_llm", recorded_load)
    run_eval(settings, prompts, [1], tmp_path / "rounds", speculation=("fixed", "adaptive"), rounds=3)
    # every mode's engine kept over one target, loaded once (LLM.beside): every mode reads the same weights
    assert len(loaded) == 3 and all(llm.model is loaded[0].model for llm in loaded)
    assert len({id(llm.engine) for llm in loaded}) == 3 and loaded[0].drafter is None
    # part by part, every mode, the order turning by one mode each part
    assert calls == [("plain-b1", ["0"]), ("speculative-b1", ["0"]), ("adaptive-b1", ["0"]),
                     ("speculative-b1", ["1"]), ("adaptive-b1", ["1"]), ("plain-b1", ["1"]),
                     ("adaptive-b1", ["2"]), ("plain-b1", ["2"]), ("speculative-b1", ["2"])]
    segments = json.loads((tmp_path / "rounds" / "segments.json").read_text())
    assert {key: [s["part"] for s in value] for key, value in segments.items()} == {
        "plain-b1": [0, 1, 2], "speculative-b1": [0, 1, 2], "adaptive-b1": [0, 1, 2]}
    rate = {key: [s["new_tokens"] / s["seconds"] for s in value] for key, value in segments.items()}
    for row in json.loads((tmp_path / "rounds" / "summary.json").read_text())["runs"]:  # each part against plain's
        key = f"{row['mode']}-b1"
        by_part = [a / b for a, b in zip(rate[key], rate["plain-b1"], strict=True)]
        assert row["speedup_by_part"] == (None if row["mode"] == "plain" else pytest.approx(by_part))
    assert "speedup by part" in (tmp_path / "rounds" / "summary.md").read_text()
    calls.clear()
    loaded.clear()
    run_eval(settings, prompts, [1], tmp_path / "one", speculation=("fixed", "adaptive"))
    assert [key for key, _ in calls] == ["plain-b1", "speculative-b1", "adaptive-b1"]
    assert len({id(llm.model) for llm in loaded}) == 3  # (one round: a mode at a time, each loading its own)
    one = json.loads((tmp_path / "one" / "summary.json").read_text())["runs"]
    assert all(row["speedup_by_part"] is None for row in one)  # one round: no parts
    assert "speedup by part" not in (tmp_path / "one" / "summary.md").read_text()
    for key in ("plain-b1", "speculative-b1", "adaptive-b1"):  # greedy: the same tokens either way
        interleaved, in_turn = (read_records(tmp_path / folder / "requests" / f"{key}.jsonl")
                                for folder in ("rounds", "one"))
        assert [r["token_ids"] for r in interleaved] == [r["token_ids"] for r in in_turn]
    with pytest.raises(ValueError, match="--rounds needs a value from 1 to the number of prompts"):
        run_eval(settings, prompts, [1], tmp_path / "bad", rounds=4)


def test_prompt_sets():
    assert len(load_prompts("mt-bench")) == 80 and len(load_prompts("humaneval")) == 164
    assert len(load_prompts("gsm8k")) == 1319
    first = load_prompts("mt-bench", 1)[0]
    assert first.id == "81" and first.chat and first.text.startswith("Compose an engaging travel blog post")
    code = load_prompts("humaneval", 1)[0]
    assert not code.chat and code.text.startswith("from typing import List")


def test_a_jsonl_file_of_prompts(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"prompt": "one"}\n\n{"prompt": "two", "id": "b"}\n')
    prompts = load_prompts(str(path), chat=True)
    assert [(p.id, p.text, p.chat) for p in prompts] == [("0", "one", True), ("b", "two", True)]


@pytest.mark.parametrize("content, message", [
    ('{"text": "x"}\n', "no non-empty string 'prompt'"),
    ('{"prompt": "x"\n', "is not JSON"),
    ('{"prompt": "x", "id": 1}\n{"prompt": "y", "id": 1}\n', "'id' fields repeat"),
    ("", "holds no prompts"),
], ids=["no-prompt-field", "bad-json", "repeated-ids", "empty"])
def test_bad_prompt_files_fail_clearly(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_prompts(str(path))


@pytest.mark.parametrize("argv, message", [
    (["--dataset", "squad"], "neither a shipped set"),
    (["--num-prompts", "0"], "argument --num-prompts: must be >= 1, got 0"),
    (["--batch-size", "1", "0"], "argument --batch-size: must be >= 1, got 0"),
    (["--temperature", "-1"], "argument --temperature: must be >= 0, got -1"),
    (["--num-prompts", "2", "--rounds", "3"], "--rounds needs a value from 1 to the number of prompts (2)"),
], ids=["unknown-dataset", "no-prompts", "batch-zero", "negative-temperature", "rounds-above-prompts"])
def test_bad_arguments_are_one_clear_line(argv, message, tmp_path, capsys):
    assert cli_main(["eval", "--output", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_speedup_by_part_pairs_whole_parts_only():
    """A part run in two segments (interrupted, resumed) or untagged is left out; fewer than two parts: None."""
    from specdec.eval.summary import Segment, speedup_by_part

    plain = [Segment(100, 1.0, 0.0, 0), Segment(100, 1.0, 0.0, 1), Segment(100, 2.0, 0.0, 2)]
    ours = [Segment(100, 0.5, 0.0, 0), Segment(50, 0.4, 0.0, 1), Segment(50, 0.4, 0.0, 1), Segment(100, 1.0, 0.0, 2)]
    assert speedup_by_part(ours, plain) == [2.0, 2.0]  # parts 0 and 2; part 1 ran in two stretches
    assert speedup_by_part(ours[:3], plain) is None
    assert speedup_by_part([Segment(100, 1.0, 0.0), Segment(100, 1.0, 0.0)], plain) is None
