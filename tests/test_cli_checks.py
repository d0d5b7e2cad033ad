"""What the command line refuses, and when: flags while parsing, without torch (one subprocess shows that the parser
imports none of torch, transformers, accelerate, triton); files, the device, drafter names and the tree size
before any model loads (a fixture makes loading one fail the test); damaged weights named once loading starts.
Every refusal is one line on stderr with exit status 2 and no traceback."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import specdec.api
from specdec import options
from specdec.cli import main
from tests.tiny_models import qwen35_text_config, save_tiny, save_tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "accelerate", "triton")


def one_line_error(capsys, message: str) -> str:
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model started loading before the arguments were checked")

    monkeypatch.setattr(specdec.api, "load_model", refuse)


def test_parsing_and_argument_errors_import_no_heavy_module():
    code = ("import sys; from specdec.cli import main; "
            "codes = [main(['--help']), main(['run', '--help']), main(['eval', '--help']), "
            "main(['run', '--temperature', '-1']), main(['run', '--bogus'])]; "
            f"print(codes, [name for name in {HEAVY!r} if name in sys.modules])")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[0, 0, 0, 2, 2] []", result.stdout


@pytest.mark.parametrize("argv, message", [
    (["--temperature", "-1"], "argument --temperature: must be >= 0 (0 = greedy), got -1"),
    (["--temperature", "hot"], "argument --temperature: expected a number, got 'hot'"),
    (["--top-p", "1.5"], "argument --top-p: must be in (0, 1], got 1.5"),
    (["--top-k", "-2"], "argument --top-k: must be >= 0, got -2"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1, got 0"),
    (["--max-new-tokens", "1.5"], "argument --max-new-tokens: expected an integer, got '1.5'"),
    (["--num-draft-tokens", "10000"], "must be between 1 and 63, got 10000"),
    (["--speculative-num-steps", "0"], "must be >= 1, got 0"),
    (["--max-batch", "0"], "argument --max-batch: must be >= 1, got 0"),
    (["--state-memory-gb", "0"], "argument --state-memory-gb: must be > 0, got 0"),
    (["--max-prefill-tokens", "0"], "argument --max-prefill-tokens: must be >= 1, got 0"),
    (["--device", "gpu"], "argument --device: expected cpu, cuda or cuda:N, got 'gpu'"),
    (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
    (["--prompt", ""], "argument --prompt: must not be empty"),
    (["--stop", ""], "argument --stop: must not be empty"),
    (["--prompt", "x", "--prompts-file", "p.txt"], "not allowed with argument --prompt"),
    (["--temprature", "1"], "unrecognized arguments: --temprature 1"),
], ids=lambda value: value[0] if isinstance(value, list) else None)
def test_flag_errors_while_parsing(argv, message, capsys):
    assert main(["run", *argv]) == 2
    one_line_error(capsys, message)


@pytest.mark.parametrize("argv, message", [
    (["--batch-sizes", "4", "0"], "argument --batch-sizes: must be >= 1, got 0"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be >= 1, got 0"),
    (["--prompt-tokens", "x"], "argument --prompt-tokens: expected an integer, got 'x'"),
    (["--state-memory-gb", "-1"], "argument --state-memory-gb: must be > 0, got -1"),
    (["--peak-copy-gbs", "0"], "argument --peak-copy-gbs: must be > 0, got 0"),
], ids=lambda value: value[0] if isinstance(value, list) else None)
def test_bench_flag_errors_while_parsing(argv, message, capsys):
    """Refused by the parser, before the roofline's peaks are measured (seconds on a GPU) or any model loads."""
    assert main(["bench", *argv]) == 2
    one_line_error(capsys, message)


def test_outputs_that_cannot_be_written_are_refused_before_any_work(capsys, no_model_loads, tmp_path):
    """eval's results folder and bench's JSON file: a folder where a file is wanted, a file where a folder is, or a
    place under a file, refused before bench measures its peaks or eval loads a model (bench used to run its whole
    sweep, then fail to write it)."""
    afile = tmp_path / "notes.txt"
    afile.write_text("x")
    cases = [(["eval", "--output", str(afile)], f"--output {afile} is a file; give a folder"),
             (["eval", "--output", str(afile / "run")], f"{afile} is a file, not a folder"),
             (["bench", "--output", str(tmp_path)], f"--output {tmp_path} is a directory; give a file name"),
             (["bench", "--output", str(afile / "rows.json")], f"{afile} is a file, not a folder")]
    for argv, message in cases:
        assert main(argv) == 2
        one_line_error(capsys, message)


def test_train_drafter_wants_a_checkpoint_directory(capsys, tmp_path):
    assert main(["train-drafter", "--target", str(tmp_path), "--method", "eagle3", "--out", str(tmp_path / "o")]) == 2
    one_line_error(capsys, "is not a checkpoint directory (a folder holding config.json)")


def test_the_stated_maximum_is_the_verify_kernels():
    from specdec.speculation.tree import MAX_TREE_NODES
    from verify_kernels.gdn import verify as gdn_verify
    from verify_kernels.mamba2 import verify as mamba2_verify

    assert options.MAX_DRAFT_TOKENS == gdn_verify.MAX_NODES - 1 == mamba2_verify.MAX_NODES - 1 == MAX_TREE_NODES - 1


def test_dtype_names_are_the_loaders():
    from specdec.models.loading import _parse_dtype

    assert all(isinstance(_parse_dtype(name), torch.dtype) for name in options.DTYPES)


def jsonl(*lines: str) -> str:
    return "".join(line + "\n" for line in lines)


@pytest.mark.parametrize("name, content, message", [
    ("p.jsonl", jsonl('{"prompt": "aa"}', '{"text": "ae"}'), "p.jsonl:2 has no non-empty string 'prompt' field"),
    ("p.jsonl", jsonl('{"prompt": "aa"}', '{"prompt": "ae"}', '{"prompt": "ai"'), "p.jsonl:3 is not JSON"),
    ("p.jsonl", jsonl('{"prompt": "aa"}', '["ae"]'), "p.jsonl:2 has no non-empty string 'prompt' field"),
    ("p.jsonl", "", "p.jsonl holds no prompts"),
    ("p.txt", "\n  \n", "p.txt holds no prompts"),
    ("p.txt", "aa\nae \xe9\n".encode("latin-1"), "p.txt:2 is not UTF-8 text (byte 0xe9)"),
    ("p.jsonl", '{"prompt": "aa"}\n{"prompt": "\xe9"}\n'.encode("latin-1"), "p.jsonl:2 is not UTF-8 text"),
], ids=["no-prompt-field", "bad-json-line-3", "not-an-object", "empty-jsonl", "blank-text", "latin-1-text",
        "latin-1-jsonl"])
def test_prompts_file_errors_name_file_and_line(name, content, message, tmp_path, capsys, no_model_loads):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert main(["run", "--prompts-file", str(path)]) == 2
    one_line_error(capsys, message)


@pytest.mark.parametrize("argv, message", [
    (["--prompts-file", "/no/such/file.txt"], "--prompts-file /no/such/file.txt does not exist"),
    (["--prompts-file", "."], "--prompts-file . is not a file"),
    (["--output", "/no/such/folder/answers.jsonl"], "the folder /no/such/folder does not exist"),
    (["--topk", "4", "--num-steps", "4"], "drafts 340 tokens per step, more than the 63 a step verifies"),
    (["--draft", "medium"], "unknown model 'medium'"),
    (["--draft", "eagle3:"], "--draft eagle3:PATH needs a path"),
    (["--target", "llama-9"], "unknown model 'llama-9'"),
    (["--target", "someone/no-such-model-here", "--draft", "ngram"], "could not get 'someone/no-such-model-here'"),
], ids=["missing-file", "folder", "output-folder", "tree-too-big", "unknown-draft", "eagle3-colon", "unknown-target",
        "unknown-hub-id"])
def test_checked_before_any_model_loads(argv, message, capsys, no_model_loads, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["run", *argv]) == 2
    one_line_error(capsys, message)


@pytest.mark.parametrize("command", [["run"], ["eval", "--num-prompts", "1"], ["bench", "--batch-sizes", "1"]])
def test_cuda_without_a_gpu_is_one_line(command, capsys, no_model_loads, monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([*command, "--device", "cuda"]) == 2
    one_line_error(capsys, "torch sees no CUDA GPU on this machine")


def test_eval_checks_the_drafter_before_its_plain_runs(capsys, no_model_loads, tmp_path):
    assert main(["eval", "--draft", "medium", "--output", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "unknown model 'medium'")


def test_eval_dataset_not_utf8(capsys, tmp_path):
    path = tmp_path / "set.jsonl"
    path.write_bytes(b'{"prompt": "aa"}\n\n{"prompt": "\xff"}\n')
    assert main(["eval", "--dataset", str(path), "--output", str(tmp_path / "out")]) == 2
    one_line_error(capsys, f"{path}:3 is not UTF-8 text (byte 0xff)")


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    target, draft = tmp_path_factory.mktemp("target"), tmp_path_factory.mktemp("draft")
    save_tiny(qwen35_text_config(), target, seed=61)
    save_tiny(qwen35_text_config(hidden_size=16), draft, seed=62)
    save_tiny_tokenizer(target)
    save_tiny_tokenizer(draft)
    return target, draft


def damaged_copy(source: Path, destination: Path, damage: str) -> Path:
    shutil.copytree(source, destination)
    (weights,) = destination.glob("*.safetensors")
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\0" * 8 + data[8:])
    return weights


@pytest.mark.parametrize("which", ["target", "draft"])
@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damaged_weights_are_named(which, damage, tiny_pair, tmp_path, capsys):
    target, draft = tiny_pair
    broken = damaged_copy(target if which == "target" else draft, tmp_path / which, damage)
    paths = {"target": str(target), "draft": str(draft), which: str(broken.parent)}
    assert main(["run", "--target", paths["target"], "--draft", paths["draft"], "--prompt", "aa",
                 "--max-seq-len", "64"]) == 2
    one_line_error(capsys, f"{broken} is damaged: it is not a complete safetensors file")


def test_damaged_draft_weights_fail_before_decoding(tiny_pair, tmp_path):
    """The API names the file too (the same loader)."""
    target, draft = tiny_pair
    broken = damaged_copy(draft, tmp_path / "draft", "truncated")
    with pytest.raises(specdec.CheckpointError, match=f"{broken} is damaged"):
        specdec.api.LLM(str(target), draft=str(broken.parent), config=specdec.EngineConfig.from_flags(max_seq_len=64))


def test_tree_size_checked_for_eval_too(capsys, no_model_loads, tmp_path):
    assert main(["eval", "--topk", "8", "--num-steps", "3", "--output", str(tmp_path / "out")]) == 2
    one_line_error(capsys, "drafts 584 tokens per step")


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damaged_eagle3_head_is_named(damage, tmp_path):
    """EAGLE-3 heads load through the checkpoint reader as well: the shipped head, damaged, named."""
    from specdec.models.eagle3 import load_eagle3
    from specdec.models.loading import load_model

    shipped = Path(specdec.__file__).parent / "checkpoints"
    broken = damaged_copy(shipped / "qwen3.5-tiny-eagle3", tmp_path / "head", damage)
    target = load_model(str(shipped / "qwen3.5-tiny"), device="cpu")
    with pytest.raises(specdec.CheckpointError, match=f"{broken} is damaged"):
        load_eagle3(broken.parent, target)


def test_the_api_refuses_a_tree_the_kernels_cannot_verify():
    config = specdec.EngineConfig.from_flags(num_steps=8, topk=2, max_seq_len=64)  # 510 drafts
    with pytest.raises(ValueError, match="drafts 510 tokens per step, more than the 63"):
        specdec.api.LLM(draft="small", config=config)
