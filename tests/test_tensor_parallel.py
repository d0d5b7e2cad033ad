"""Tensor parallelism on the CPU with gloo, 2 ranks: tiny Qwen3.5 (dense, MoE) and Nemotron-H checkpoints sharded
by heads, groups and expert channels give the single-process logits to 1e-5 (relative to the largest logit) in fp32
through the runner's prefill and decode steps, and the engine's greedy outputs, plain and speculative, equal the
single-process ones; each rank reads only its slices and caches only its heads; a rank that stalls or dies ends the
others with TensorParallelError within the collective timeout. One spawn of the ranks serves every multi-process
check: starting a rank (imports) costs far more than its work here."""

from __future__ import annotations

import json
import re
import socket

import pytest
import torch

from specdec.cli import main
from specdec.models import load_model
from specdec.parallel import SINGLE, Shard, TensorParallel, join
from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny
from tests.tp_workers import (
    EVAL_ARGS,
    SHIPPED_DRAFTERS,
    logits,
    rank_logits,
    rank_main,
    rank_main_cuda,
    run_ranks,
    single_process,
)

RANKS = 2
# what every rank holds whole: norms, routers, the shared-expert gate, the latent projections (all small)
REPLICATED = re.compile(r"norm|\.gate\.|shared_expert_gate|latent_proj")
TOLERANCE = 1e-5  # relative to the largest logit: the ranks sum partial matmuls, one process sums in one
ODD_VOCAB = 97  # no rank count divides it: the vocabulary shards are padded (specdec/parallel/layers.py vocab_shard)
CHECKPOINTS = {
    # 4 key heads, 8 value heads (2 per key head); 4 query heads over 2 KV heads: KV heads split; tied head; odd vocab
    "qwen3_5-kv-split": lambda **dims: qwen35_text_config(linear_num_key_heads=4, linear_num_value_heads=8,
                                                          tie_word_embeddings=True, vocab_size=ODD_VOCAB, **dims),
    # 2 key heads, 6 value heads (3 per key head); 1 KV head, shared by both ranks; MoE
    "qwen3_5_moe-kv-shared": lambda **dims: qwen35_text_config(value_heads_per_key=3, moe=True, num_key_value_heads=1,
                                                               **dims),
    # 2 groups of 2 Mamba heads, attention, MLP and MoE blocks with a latent projection; odd vocab, untied head
    "nemotron_h": lambda **dims: nemotron_h_config(heads_per_group=2, moe_latent_size=16, vocab_size=ODD_VOCAB - 2,
                                                   **dims),
}
# on GPUs: state head dims the Triton kernels take (specdec.backend.KERNEL_HEAD_DIMS), so that the steps run the
# kernels and replay from CUDA graphs, with the collectives captured
GPU_DIMS = {"qwen3_5-kv-split": dict(linear_key_head_dim=16, linear_value_head_dim=16),
            "qwen3_5_moe-kv-shared": dict(linear_key_head_dim=16, linear_value_head_dim=16),
            "nemotron_h": dict(mamba_head_dim=16, ssm_state_size=16)}


def save_checkpoints(tmp_path_factory, dims: dict[str, dict]) -> dict:
    directories = {}
    for seed, (name, config) in enumerate(CHECKPOINTS.items()):
        directories[name] = tmp_path_factory.mktemp(name)
        save_tiny(config(**dims.get(name, {})), directories[name], seed=11 + seed)
    return directories


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return save_checkpoints(tmp_path_factory, {})


@pytest.fixture(scope="module")
def ranks(checkpoints, tmp_path_factory):
    """-> (per rank: {checkpoint name: results}, the surviving ranks' failure records, per rank: the shipped
    drafters' answers, rank 0's eval folder, per rank: adaptive speculation's answers)."""
    out = tmp_path_factory.mktemp("ranks")
    run_ranks(rank_main, RANKS, list(checkpoints.values()), out, limit_s=240)
    results = [dict(zip(checkpoints, torch.load(out / f"rank{rank}.pt", weights_only=False), strict=True))
               for rank in range(RANKS)]
    return (results, [torch.load(out / f"failures{rank}.pt") for rank in range(RANKS - 1)],
            [torch.load(out / f"drafters{rank}.pt") for rank in range(RANKS)], out / "eval",
            [torch.load(out / f"adaptive{rank}.pt") for rank in range(RANKS)])


def test_shard_reads_its_piece_of_each_part():
    full = torch.arange(12).reshape(12, 1)  # parts of 4 and 8 rows, in 2 pieces
    assert Shard(0, (4, 8), 2, 1).read(full).flatten().tolist() == [2, 3, 8, 9, 10, 11]
    assert Shard(0, (4, 8), 2, 1).full_shape((6, 1)) == (12, 1)
    with pytest.raises(ValueError, match="equal pieces"):
        Shard(0, (3,), 2, 0)
    padded = [Shard(0, (9,), 3, index, length=7) for index in range(3)]  # 7 rows in 3 pieces of 3, zeros after
    assert [shard.read(torch.arange(1, 8)).tolist() for shard in padded] == [[1, 2, 3], [4, 5, 6], [7, 0, 0]]
    assert padded[2].full_shape((3,)) == (7,)


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_each_rank_loads_its_slices_and_caches_its_heads(checkpoints, name):
    full = load_model(checkpoints[name], device="cpu")
    weights = dict(full.named_parameters())
    for rank in range(RANKS):
        model = load_model(checkpoints[name], device="cpu", tp=TensorParallel(rank, RANKS))  # no group: loading
        for param_name, param in model.named_parameters():
            module, _, leaf = param_name.rpartition(".")
            shard = getattr(model.get_submodule(module), "tp_shards", {}).get(leaf)
            assert shard is not None or REPLICATED.search(param_name), f"{param_name} is not sharded"
            assert torch.equal(param, shard.read(weights[param_name]) if shard else weights[param_name]), param_name
        embedding = getattr(model.model, "embed_tokens", None) or model.model.embeddings
        full_embedding = getattr(full.model, "embed_tokens", None) or full.model.embeddings
        assert (model.lm_head.weight is embedding.weight) == (full.lm_head.weight is full_embedding.weight)
        for ours, whole in zip(model.cache_spec().linear, full.cache_spec().linear, strict=True):
            assert ours.state_shape[0] * RANKS == whole.state_shape[0] and ours.conv_dim * RANKS == whole.conv_dim
            assert ours.key_shape[0] * RANKS == whole.key_shape[0]  # key heads (GDN), groups (Mamba2)
        kv_heads = full.cache_spec().attention[0].num_kv_heads
        assert model.cache_spec().attention[0].num_kv_heads == max(kv_heads // RANKS, 1)


def test_heads_the_ranks_cannot_split_are_refused(checkpoints):
    with pytest.raises(ValueError, match=r"linear_num_key_heads \(2\) must be a multiple of the tensor-parallel"):
        load_model(checkpoints["qwen3_5_moe-kv-shared"], device="cpu", tp=TensorParallel(0, 4))


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_sharded_runs_equal_the_single_process(checkpoints, ranks, name):
    check_parity(single_process(checkpoints[name]), [results[name] for results in ranks[0]])


def test_four_ranks_give_the_single_process_logits(checkpoints, tmp_path):
    """The dense Qwen3.5 over 4 ranks: a key head and 2 value heads each, KV heads shared by pairs of ranks, the odd
    vocabulary padded (25 rows a rank, 3 of them padding on the last)."""
    directory = checkpoints["qwen3_5-kv-split"]
    run_ranks(rank_logits, 4, [directory], tmp_path)
    reference = single_process(directory, what=logits)
    for rank in range(4):
        (result,) = torch.load(tmp_path / f"rank{rank}.pt")
        for key in ("prefill", "decode"):
            diff = ((result[key] - reference[key]).abs().max() / reference[key].abs().max()).item()
            assert diff <= TOLERANCE, f"rank {rank} of 4: {key} logits differ from one process by {diff:.2e}"


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < RANKS, reason=f"needs {RANKS} CUDA devices")
def test_sharded_runs_on_gpus_equal_one_gpu(tmp_path_factory, tmp_path):
    """The same over nccl, one GPU per rank, the engine's steps replayed from CUDA graphs (collectives captured);
    the shipped drafters too."""
    checkpoints = save_checkpoints(tmp_path_factory, GPU_DIMS)
    run_ranks(rank_main_cuda, RANKS, list(checkpoints.values()), tmp_path, limit_s=600)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(RANKS)]
    for index, name in enumerate(checkpoints):
        check_parity(single_process(checkpoints[name], "cuda:0"), [results[index] for results in ranks])
    drafters = [torch.load(tmp_path / f"drafters{rank}.pt") for rank in range(RANKS)]
    check_drafters(single_process(None, "cuda:0"), drafters)


def check_parity(reference: dict, ranks: list[dict]) -> None:
    for rank, result in enumerate(ranks):
        for key in ("prefill", "decode"):
            diff = ((result[key] - reference[key]).abs().max() / reference[key].abs().max()).item()
            assert diff <= TOLERANCE, f"rank {rank}: {key} logits differ from one process by {diff:.2e} (relative)"
        assert result["plain"] == reference["plain"], f"rank {rank}: greedy outputs differ from one process"
        assert result["ngram"] == result["plain"], f"rank {rank}: speculative greedy differs from plain greedy"
        assert result["ngram_accepted"] > 0, "no draft token accepted: the test would not exercise commits"


@pytest.mark.parametrize("case", ["stalled", "dead"])
def test_a_failed_rank_ends_the_others_with_a_clear_error(ranks, case):
    """stalled: alive but in no collective, the others fail when the timeout passes (as NCCL ranks do when a peer
    dies: nothing tells them); dead: gloo sees the closed connection at once."""
    for rank, failures in enumerate(ranks[1]):
        failure = failures[case]
        assert f"tensor-parallel all_reduce failed on rank {rank} of {RANKS}" in failure["message"], failure
        assert failure["seconds"] < failure["timeout_s"] + 3, f"rank {rank} took {failure['seconds']:.1f} s to fail"
        if case == "stalled":
            assert failure["seconds"] >= failure["timeout_s"] * 0.9, "failed before the timeout: not a timeout"


def test_drafters_are_lossless_under_tp(ranks):
    """The shipped Qwen3.5 with its draft model, MTP layer and EAGLE-3 head, each replicated on every rank
    (drafters/base.py): greedy speculative answers equal plain ones, which equal one process's."""
    check_drafters(single_process(None), ranks[2])


def check_drafters(reference: dict, ranks: list[dict]) -> None:
    for rank, answers in enumerate(ranks):
        assert answers["plain"] == reference["plain"], f"rank {rank}: plain greedy differs from one process"
        for draft in SHIPPED_DRAFTERS:
            assert answers[draft] == answers["plain"], f"rank {rank}: {draft} speculative greedy differs from plain"
            assert answers[f"{draft}_accepted"] > 0, f"rank {rank}: no {draft} draft accepted"


def test_adaptive_ranks_choose_alike_on_clocks_that_disagree(ranks):
    """Adaptive speculation under TP: rank 1 is given other peaks for its roofline prior and measures its steps on a
    clock up to 20 ms off at random, yet every step drafts alike on both ranks (their policies price shapes at rank
    0's peaks and times), through `specdec serve`'s warm-up (the same step costs learnt on both) and the requests
    after it, and greedy answers equal plain ones."""
    plain = ranks[2][0]["plain"]  # (SHIPPED_TOKENS of each answer; adaptive ran on to ADAPTIVE_TOKENS)
    answers = ranks[4]
    for rank, result in enumerate(answers):
        assert [answer[:len(first)] for answer, first in zip(result["answers"], plain, strict=True)] == plain, \
            f"rank {rank}: adaptive greedy differs from plain"
    assert answers[1]["answers"] == answers[0]["answers"]
    assert answers[1]["drafted"] == answers[0]["drafted"], "the ranks drafted apart"
    assert answers[1]["shapes"] == answers[0]["shapes"]
    assert answers[0]["warmed"] and answers[1]["costs_after_warm_up"] == answers[0]["costs_after_warm_up"] != {}
    # several shapes chosen, drafting among them: the ranks agreed on choices that could have differed (which ones
    # rank 0's CPU times make best varies with the machine's load: under CI's, none was plain on 2026-12-07)
    shapes = answers[0]["shapes"]
    assert len(shapes) >= 2 and sum(n for label, n in shapes.items() if label != "plain") > 0, shapes


def test_bench_under_tp_traces_rank_0s_decisions(ranks):
    """`specdec bench --tp 2 --speculation adaptive --policy-trace`: one row, and one traced decision per step the
    policy counted (rank 0 alone writes the trace: the ranks plan alike)."""
    folder = ranks[3].parent
    rows = json.loads((folder / "bench.json").read_text())["rows"]
    assert [(r["mode"], r["batch_size"]) for r in rows] == [("plain", 2), ("adaptive", 2)]
    decisions = [json.loads(line) for line in (folder / "trace.jsonl").read_text().splitlines()]
    timed = [d for d in decisions if d["timed"]]
    assert len(timed) == sum(rows[1]["shapes"].values()) >= 1


def test_eval_under_tp_gives_the_single_process_summary(ranks, tmp_path):
    """`specdec eval --tp 2` (rank 0 writes) and `--tp 1`: the same tokens and accepted lengths per request."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*EVAL_ARGS, "--tp", "1", "--output", str(tmp_path)]) == 0
    finally:
        torch.set_num_threads(threads)
    summaries = [json.loads((folder / "summary.json").read_text()) for folder in (tmp_path, ranks[3])]
    assert summaries[1]["settings"] == {**summaries[0]["settings"], "tp": RANKS}
    keys = ("mode", "batch_size", "requests", "new_tokens", "mean_accepted_length", "draft_acceptance_rate",
            "same_as_plain")
    rows = [[{key: row[key] for key in keys} for row in summary["runs"]] for summary in summaries]
    assert rows[0] == rows[1] and len(rows[0]) == 2 and rows[0][1]["same_as_plain"] == 1.0
    for name in ("plain-b2", "speculative-b2"):
        records = [[(r["id"], r["token_ids"], r["emitted_per_step"]) for r in
                    map(json.loads, (folder / "requests" / f"{name}.jsonl").read_text().splitlines())]
                   for folder in (tmp_path, ranks[3])]
        assert sorted(records[0]) == sorted(records[1]), name


def test_launch_refuses_what_it_cannot_run(capsys):
    """--tp is checked before any rank starts: heads the ranks cannot split, more GPUs than the host has, and the
    command's own checks (a taken port for serve), each one line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert main(["serve", "--tp", "2", "--device", "cpu", "--port", port]) == 2
    assert main(["run", "--tp", "4", "--device", "cpu"]) == 2
    assert main(["eval", "--tp", "2", "--device", "cpu", "--dataset", "nope.jsonl"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and "cannot listen on 127.0.0.1" in lines[0], lines
    assert "--tp 4 cannot shard qwen3.5: linear_num_key_heads (2) must be a multiple of the tensor-parallel size (4)" \
        in lines[1]
    assert "neither a shipped set" in lines[2]
    if not torch.cuda.is_available():
        assert main(["run", "--tp", "2", "--device", "cuda"]) == 2
        assert "--tp 2 needs 2 GPUs (one per rank), but torch sees 0" in capsys.readouterr().err


def test_more_ranks_than_processes_is_refused_with_the_way_to_launch(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="specdec ... --tp 2"):
        join(2)
    assert join(1) is SINGLE
