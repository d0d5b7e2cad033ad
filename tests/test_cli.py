"""`specdec run` on tiny checkpoints: output, the stats line, SGLang flag aliases, and clear errors."""

from __future__ import annotations

import json

import pytest

from specdec.cli import build_parser, main
from tests.tiny_models import qwen35_text_config, save_tiny, save_tiny_tokenizer


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    directory = tmp_path_factory.mktemp("target")
    save_tiny(qwen35_text_config(), directory, seed=51)
    save_tiny_tokenizer(directory)
    return str(directory)


def test_run_streams_text_and_ends_with_stats(target, capsys):
    assert main(["run", "--target", target, "--draft", "ngram", "--prompt", "aa ae ai aa ae ai",
                 "--max-new-tokens", "12", "--speculative-num-steps", "3", "--max-seq-len", "64"]) == 0
    out, err = capsys.readouterr()
    assert out.strip()  # the streamed continuation
    assert "tokens/s" in err and "mean accepted length" in err and "acceptance rate" in err


def test_prompts_file_with_progress(target, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"prompt": p}) for p in ["aa ae", "ba be bi"]))
    assert main(["run", "--target", target, "--prompts-file", str(prompts), "--max-new-tokens", "4",
                 "--max-seq-len", "64"]) == 0
    out, _ = capsys.readouterr()
    assert len(out.strip().splitlines()) == 2


@pytest.mark.parametrize(
    "argv, message",
    [(["--target", "llama-9", "--prompt", "x"], "unknown model 'llama-9'"),
     (["--prompt", "aa", "--temperature", "-1"], "temperature must be >= 0"),
     (["--prompt", "aa", "--draft", "medium"], "unknown model 'medium'"),
     (["--prompts-file", "/no/such/file.txt"], "does not exist")],
    ids=["unknown-target", "temperature", "unknown-draft", "missing-file"],
)
def test_errors_are_one_clear_line(target, argv, message, capsys):
    if "--target" not in argv:
        argv = ["--target", target, "--max-seq-len", "64", *argv]
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_help_lists_every_option():
    text = build_parser().parse_args(["run", "--prompt", "x"]) and build_parser().format_help()
    assert "run" in text
    run_help = build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    for flag in ("--target", "--draft", "--prompt", "--prompts-file", "--max-new-tokens", "--temperature",
                 "--top-p", "--seed", "--device", "--dtype", "--flush-length", "--speculative-num-steps",
                 "--speculative-eagle-topk", "--speculative-num-draft-tokens", "--disable-cuda-graph"):
        assert flag in run_help
