"""`specdec serve` captures, at its start, the CUDA graphs of every batch and request length it may be sent
(specdec/serve/cli.py capture_graphs). There are no CUDA graphs on the CPU, so the engine's graphs are stood in for
by their capture switch and its prepare_steps by a recorder: what is checked is what the start asks for, what it
prints, and that a capture that runs out of GPU memory leaves the server to capture the rest on first use."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdec.api import LLM
from specdec.engine.engine import EngineConfig
from specdec.serve import cli as serve_cli
from specdec.serve.cli import capture_graphs, warm_kernels


@pytest.fixture(scope="module")
def llm():
    return LLM("qwen3.5", draft="small", device="cpu", config=EngineConfig.from_flags(max_batch=4, max_seq_len=256,
                                                                                      speculation="fixed"))


def test_nothing_is_captured_without_cuda_graphs(llm, capsys):
    assert llm.engine.runner.graphs is None  # (the CPU)
    capture_graphs(llm, announce=True)
    assert capsys.readouterr().out == ""


def test_every_batch_and_length_is_asked_for_and_announced(llm, capsys, monkeypatch):
    asked = []

    def prepare_steps(rows, prompt_tokens, max_new_tokens, built_one):
        asked.append((rows, prompt_tokens, max_new_tokens))
        for _ in range(40):
            built_one()
        return 40

    monkeypatch.setattr(llm.engine.runner, "graphs", SimpleNamespace(capture=True))
    monkeypatch.setattr(llm.engine, "prepare_steps", prepare_steps)
    monkeypatch.setattr(serve_cli, "PROGRESS_SECONDS", 0.0)  # (a progress line after every graph)
    capture_graphs(llm, announce=True)
    # batches up to --max-batch; rows up to --max-seq-len (a one-token prompt and 255 new tokens)
    assert asked == [(4, 1, 255)]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[specdec] capturing CUDA graphs for batches of up to 4 requests of up to 256 tokens"
    assert [line.split(" (")[0] for line in lines[1:-1]] == [f"[specdec] {n} CUDA graphs captured" for n in
                                                              range(1, 41)]
    assert lines[-1].startswith("[specdec] 40 CUDA graphs captured in ") and len(lines) == 42
    capture_graphs(llm, announce=False)  # (the other ranks under --tp capture the same, silently)
    assert len(asked) == 2 and capsys.readouterr().out == ""


def test_graphs_that_do_not_fit_are_left_to_first_use(llm, capsys, monkeypatch):
    def out_of_memory(*args):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(llm.engine.runner, "graphs", SimpleNamespace(capture=True))
    monkeypatch.setattr(llm.engine, "prepare_steps", out_of_memory)
    capture_graphs(llm, announce=True)  # (no exception: the server starts)
    out = capsys.readouterr().out
    assert "not every CUDA graph fits beside the KVBuffer pools: the rest are captured on first use" in out


def test_nothing_is_warmed_up_on_the_cpu(llm, capsys, monkeypatch):
    monkeypatch.setattr(llm.engine, "add_request", lambda *args, **kwargs: pytest.fail("a warm-up request on the CPU"))
    assert warm_kernels(llm, announce=True) == []
    assert capsys.readouterr().out == ""


def test_the_warm_up_runs_a_request_of_each_length_that_fits_and_forgets_the_acceptance(capsys, monkeypatch):
    """Where kernels compile on first use (a GPU: stood in for by compiles_kernels), one request of each warm-up
    length that fits --max-seq-len runs before serving, through the real engine; adaptive speculation keeps what its
    steps taught of their costs and forgets the acceptance its prompts of no text showed."""
    adaptive = LLM("qwen3.5", draft="small", device="cpu",
                   config=EngineConfig.from_flags(max_batch=4, max_seq_len=320, speculation="adaptive"))
    policy = adaptive.engine.policy
    prior = policy._pooled()
    ran, add_request = [], adaptive.engine.add_request

    def recorded(prompt, **kwargs):
        ran.append(add_request(prompt, **kwargs))
        return ran[-1]

    monkeypatch.setattr(serve_cli, "compiles_kernels", lambda llm: True)
    monkeypatch.setattr(adaptive.engine, "add_request", recorded)
    warm_kernels(adaptive, announce=True)
    # 13, 47 and 256 prompt tokens fit 320 positions with 16 new tokens and a step's tree; 1000 does not
    assert [(len(r.prompt), len(r.output), r.finished) for r in ran] == \
        [(n, serve_cli.WARM_UP_NEW_TOKENS, True) for n in (13, 47, 256)]
    assert adaptive.engine.scheduler.idle
    assert policy.steps >= 3 * (serve_cli.WARM_UP_NEW_TOKENS // 5)  # (its steps were planned by the policy)
    assert policy._pooled() == prior and not policy.counts
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[specdec] warming up the kernels: requests of 13, 47, 256 prompt tokens"
    assert lines[1].startswith("[specdec] kernels warm in ") and len(lines) == 2
