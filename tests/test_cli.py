"""`specdec run` on tiny checkpoints: streaming and the stats line, SGLang flag aliases, a prompts file decoded as one
batch with every answer under its prompt and in the --output JSONL, the chat-template rule, and Ctrl-C (one line,
a valid JSONL of the answers so far)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import specdec.api
from specdec.cli import build_parser, main
from specdec.engine.engine import Engine
from tests.tiny_models import qwen35_text_config, save_tiny, save_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["aa ae ai aa ae ai", "ba be", "ca ce ci co", "da"]
SHORT = ["--max-seq-len", "64", "--draft", "ngram", "--speculative-num-steps", "3"]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    directory = tmp_path_factory.mktemp("target")
    save_tiny(qwen35_text_config(), directory, seed=51)
    save_tiny_tokenizer(directory)
    return str(directory)


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return path


def test_run_streams_text_and_ends_with_stats(target, capsys):
    assert main(["run", "--target", target, *SHORT, "--prompt", "aa ae ai aa ae ai", "--max-new-tokens", "12"]) == 0
    out, err = capsys.readouterr()
    assert out.strip()  # the streamed continuation
    assert "tokens/s" in err and "mean accepted length" in err and "acceptance rate" in err


def test_prompts_file_is_decoded_as_one_batch(target, prompts_file, tmp_path, capsys, monkeypatch):
    """At most --max-batch requests run at once, more than one of them at a time; each prompt's record and console
    block hold its own answer, equal to generating it alone."""
    batch_sizes = []
    step = Engine.step

    def counting_step(engine):  # the step's batch: what still runs after it, and what it finished
        finished = step(engine)
        batch_sizes.append(len(engine.scheduler.running) + len(finished))
        return finished

    monkeypatch.setattr(Engine, "step", counting_step)
    answers = tmp_path / "answers.jsonl"
    assert main(["run", "--target", target, *SHORT, "--prompts-file", str(prompts_file), "--max-new-tokens", "6",
                 "--max-batch", "3", "--no-chat", "--output", str(answers)]) == 0
    assert max(batch_sizes) == 3, batch_sizes
    records = [json.loads(line) for line in answers.read_text().splitlines()]
    assert [r["prompt"] for r in records] == PROMPTS and [r["index"] for r in records] == [0, 1, 2, 3]
    monkeypatch.undo()
    llm = specdec.api.LLM(target, config=specdec.EngineConfig.from_flags(max_seq_len=64))
    for record, prompt in zip(records, PROMPTS, strict=True):
        alone = llm.generate(prompt, max_new_tokens=6)[0]
        assert record["text"] == alone.text and record["token_ids"] == alone.token_ids
        assert record["new_tokens"] == len(alone.token_ids) and record["mean_accepted_length"] >= 1
    out, _ = capsys.readouterr()
    blocks = out.split("=== prompt ")[1:]
    assert len(blocks) == 4
    for number, (block, record) in enumerate(zip(blocks, records, strict=True), start=1):
        assert block.startswith(f"{number} of 4 ") and record["prompt"] in block and record["text"] in block


def test_chat_template_whenever_the_tokenizer_has_one(target, prompts_file, monkeypatch, capsys):
    """One rule for --prompt, --prompts-file and the default prompt: the chat template when the tokenizer has one,
    raw text with --no-chat."""
    asked = []
    encode = specdec.api.LLM.encode
    monkeypatch.setattr(specdec.api.LLM, "encode", lambda self, prompt, chat=False: asked.append(chat) or
                        encode(self, prompt, chat))
    cases = [(["--prompt", "aa ae"], True), (["--prompts-file", str(prompts_file)], True), ([], True),
             (["--prompt", "aa ae", "--no-chat"], False), (["--prompts-file", str(prompts_file), "--no-chat"], False)]
    for flags, expected in cases:
        asked.clear()
        assert main(["run", "--target", target, *SHORT, "--max-new-tokens", "2", *flags]) == 0
        assert asked and set(asked) == {expected}, (flags, asked)
    capsys.readouterr()


def test_ctrl_c_prints_one_line_and_leaves_the_answers_so_far(target, prompts_file, tmp_path, monkeypatch, capsys):
    steps = []
    step = Engine.step

    def interrupted_step(engine):
        steps.append(1)
        if len(steps) == 12:  # one request at a time, 6 tokens each: the first answer is in
            raise KeyboardInterrupt
        return step(engine)

    monkeypatch.setattr(Engine, "step", interrupted_step)
    answers = tmp_path / "answers.jsonl"
    assert main(["run", "--target", target, *SHORT, "--prompts-file", str(prompts_file), "--max-new-tokens", "6",
                 "--max-batch", "1", "--output", str(answers)]) == 130
    err = capsys.readouterr().err
    records = [json.loads(line) for line in answers.read_text().splitlines()]
    assert 1 <= len(records) < len(PROMPTS)
    last = err.strip().splitlines()[-1]
    assert last == f"specdec: interrupted: {len(records)} of 4 prompts answered; the first {len(records)} answers " \
                   f"are in {answers}"
    assert "Traceback" not in err


def test_help_lists_every_option():
    run_help = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    for flag in ("--target", "--draft", "--prompt", "--prompts-file", "--output", "--no-chat", "--max-new-tokens",
                 "--temperature", "--top-p", "--seed", "--device", "--dtype", "--flush-length", "--max-batch",
                 "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
                 "--disable-cuda-graph", "--max-prefill-tokens"):
        assert flag in run_help
    commands = build_parser()._subparsers._group_actions[0].choices
    for command in ("serve", "eval", "bench"):  # the prefill budget wherever an engine prefills prompts
        assert "--max-prefill-tokens" in commands[command].format_help(), command


def test_a_real_ctrl_c_while_decoding(target, tmp_path):
    """SIGINT to `python -m specdec run` once the first answer is written: exit status 130, one line, no traceback,
    and every line of --output a whole record."""
    prompts, answers = tmp_path / "prompts.txt", tmp_path / "answers.jsonl"
    prompts.write_text("aa ae ai\n" * 400)  # far more than a few seconds of decoding
    process = subprocess.Popen(
        [sys.executable, "-m", "specdec", "run", "--target", target, *SHORT, "--prompts-file", str(prompts),
         "--max-new-tokens", "40", "--max-batch", "1", "--output", str(answers)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # a user's Ctrl-C: SIGINT at its default, even where this test runs with it ignored (a background job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while process.poll() is None and time.monotonic() < deadline and not (
            answers.is_file() and answers.read_text().count("\n") >= 1):
        time.sleep(0.2)
    process.send_signal(signal.SIGINT)
    err = process.communicate(timeout=120)[1]
    assert process.returncode == 130, err[-2000:]
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("specdec: interrupted: "), err
    records = [json.loads(line) for line in answers.read_text().splitlines()]
    assert 1 <= len(records) < 400


def test_ctrl_c_in_eval_is_one_line_and_the_rerun_resumes(target, prompts_file, tmp_path, monkeypatch, capsys):
    out = tmp_path / "eval"
    argv = ["eval", "--target", target, "--draft", "ngram", "--dataset", str(prompts_file), "--max-new-tokens", "6",
            "--no-baseline", "--output", str(out)]
    steps = []
    step = Engine.step

    def interrupted_step(engine):
        steps.append(1)
        if len(steps) == 12:
            raise KeyboardInterrupt
        return step(engine)

    monkeypatch.setattr(Engine, "step", interrupted_step)
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines()[-1] == f"specdec: interrupted: finished requests are recorded in {out}; the " \
                                          "same command resumes" and "Traceback" not in err
    (records,) = (out / "requests").glob("*.jsonl")
    done = [json.loads(line) for line in records.read_text().splitlines()]
    assert 1 <= len(done) < len(PROMPTS)
    monkeypatch.undo()
    assert main(argv) == 0
    assert len(records.read_text().splitlines()) == len(PROMPTS)
