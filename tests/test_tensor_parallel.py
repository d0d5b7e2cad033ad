"""Tensor parallelism on the CPU with gloo, 2 ranks: tiny Qwen3.5 (dense, MoE) and Nemotron-H checkpoints sharded
by heads, groups and expert channels give the single-process logits to 1e-5 (relative to the largest logit) in fp32
through the runner's prefill and decode steps, and the engine's greedy outputs, plain and speculative, equal the
single-process ones; each rank reads only its slices and caches only its heads; a rank that stalls or dies ends the
others with TensorParallelError within the collective timeout. One spawn of the ranks serves every multi-process
check: starting a rank (imports) costs far more than its work here."""

from __future__ import annotations

import re

import pytest
import torch

from specdec.models import load_model
from specdec.parallel import SINGLE, Shard, TensorParallel, join
from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny
from tests.tp_workers import rank_main, rank_main_cuda, run_ranks, single_process

RANKS = 2
# what every rank holds whole: norms, routers, the shared-expert gate, the latent projections (all small)
REPLICATED = re.compile(r"norm|\.gate\.|shared_expert_gate|latent_proj")
TOLERANCE = 1e-5  # relative to the largest logit: the ranks sum partial matmuls, one process sums in one
CHECKPOINTS = {
    # 4 key heads, 8 value heads (2 per key head); 4 query heads over 2 KV heads: KV heads split; tied head
    "qwen3_5-kv-split": lambda **dims: qwen35_text_config(linear_num_key_heads=4, linear_num_value_heads=8,
                                                          tie_word_embeddings=True, **dims),
    # 2 key heads, 6 value heads (3 per key head); 1 KV head, shared by both ranks; MoE
    "qwen3_5_moe-kv-shared": lambda **dims: qwen35_text_config(value_heads_per_key=3, moe=True, num_key_value_heads=1,
                                                               **dims),
    # 2 groups of 2 Mamba heads, attention, MLP and MoE blocks with a latent projection
    "nemotron_h": lambda **dims: nemotron_h_config(heads_per_group=2, moe_latent_size=16, **dims),
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
    """-> (per rank: {checkpoint name: results}, the surviving ranks' failure records)."""
    out = tmp_path_factory.mktemp("ranks")
    run_ranks(rank_main, RANKS, list(checkpoints.values()), out)
    results = [dict(zip(checkpoints, torch.load(out / f"rank{rank}.pt", weights_only=False), strict=True))
               for rank in range(RANKS)]
    return results, [torch.load(out / f"failures{rank}.pt") for rank in range(RANKS - 1)]


def test_shard_reads_its_piece_of_each_part():
    full = torch.arange(12).reshape(12, 1)  # parts of 4 and 8 rows, in 2 pieces
    assert Shard(0, (4, 8), 2, 1).read(full).flatten().tolist() == [2, 3, 8, 9, 10, 11]
    assert Shard(0, (4, 8), 2, 1).full_shape((6, 1)) == (12, 1)
    with pytest.raises(ValueError, match="equal pieces"):
        Shard(0, (3,), 2, 0)


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


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < RANKS, reason=f"needs {RANKS} CUDA devices")
def test_sharded_runs_on_gpus_equal_one_gpu(tmp_path_factory, tmp_path):
    """The same over nccl, one GPU per rank, the engine's steps replayed from CUDA graphs (collectives captured)."""
    checkpoints = save_checkpoints(tmp_path_factory, GPU_DIMS)
    run_ranks(rank_main_cuda, RANKS, list(checkpoints.values()), tmp_path, limit_s=600)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt", weights_only=False) for rank in range(RANKS)]
    for index, name in enumerate(checkpoints):
        check_parity(single_process(checkpoints[name], "cuda:0"), [results[index] for results in ranks])


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


def test_more_ranks_than_processes_is_refused_with_the_way_to_launch(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="specdec ... --tp 2"):
        join(2)
    assert join(1) is SINGLE
