"""Tensor parallelism across the GPUs of one host (torch.distributed: nccl on CUDA, gloo on CPU).

Every rank runs the same program (SPMD): the same engine, scheduler and drafter, on the same inputs; only the
target model is sharded. Ranks stay in lockstep without broadcasting step inputs because every rank ends each
forward with the same full logits (see the LM head below), so greedy acceptance, and seeded sampling, decide the
same tokens everywhere.

What is sharded how (Megatron-style: a column-parallel projection feeds a row-parallel one, so each block costs
one all-reduce; the residual stream, the norms and the rotary tables are replicated):
- Gated DeltaNet (Qwen3.5): the key heads are split evenly and each rank holds the value heads that read its key
  heads (value head h reads key head h // (HV / H), so the HV / H value heads of a key head stay on one rank).
  in_proj_qkv is column-parallel with its q, k and v parts each cut by heads (Shard.parts), and so are the conv
  channels, which run over the same concatenated q / k / v channels (a depthwise conv: channels are independent);
  in_proj_z, in_proj_a / in_proj_b, A_log and dt_bias follow the value heads; the gated norm is per head and
  replicated; out_proj is row-parallel (all-reduce 1). The recurrence needs no communication: heads are
  independent, so each rank's KVBuffer holds the entries and states of its own heads only, and the per-rank
  linear-state memory falls as 1 / size.
- Gated attention: query heads split evenly (q_proj's per-head (query, gate) rows stay together); KV heads split
  evenly when there are at least as many as ranks, else each rank holds the one KV head its query heads read
  (replicated over size / KV ranks); o_proj row-parallel (all-reduce 2). The KV pool holds the rank's KV heads.
- Mamba2 (Nemotron-H): the groups are split evenly with the heads that read them (head h reads group
  h // (NH / NG)); groups are never shared, since the gated output norm normalises over a group's channels.
  in_proj is column-parallel over its parts z, x, B, C, dt, each cut by heads or groups; the conv channels
  (x, B, C) and their bias alike; dt_bias, A_log, D and the norm weight by heads; out_proj row-parallel. Again
  each rank's KVBuffer holds its own heads' states and its own groups' B entries.
- Attention (both families): as gated attention above.
- MLP: gate_proj / up_proj column-parallel, down_proj row-parallel (all-reduce 3).
- MoE (Qwen3.5, Nemotron-H): every expert sharded as an MLP (the rank holds all experts, each with 1 / size of
  its intermediate channels); the router is replicated and computed identically on every rank, so no tokens are
  exchanged; the routed partial sums take one all-reduce (Nemotron: in the latent dim, before the replicated
  fc2_latent_proj), the shared expert, an MLP sharded alike, another. Expert parallelism (whole experts per rank,
  tokens exchanged twice per block) and fusing the two all-reduces into one are left for measurement.
- Embedding: vocabulary-parallel (ceil(V / size) rows per rank, the last rank's padded with zero rows where size
  does not divide V; a token outside the rank's rows embeds to zero; all-reduce).
- LM head: vocabulary-parallel over the same rows (so a tied head stays tied), then an all-gather of the logits:
  [B, T, V / size] per rank -> [B, T, V] on every rank (the padding rows' logits dropped). Gathering costs
  B * T * V floats per step, but the acceptance (greedy argmax, sampling, the top-k / top-p filters) then reads
  full logits unchanged; a sharded argmax / sampler would gather less and is left for when the gather shows in a
  profile.
A layer learns its per-rank head counts from TensorParallel at construction, so cache_spec() (and with it the
KVBuffer pools) is per rank without the cache knowing about ranks.

Loading: each sharded parameter's module carries `tp_shards` (Shard: which rows or columns of the checkpoint
tensor the rank holds); the loader reads exactly those through safetensors' get_slice, so no rank ever holds the
full tensor. Replicated tensors are read whole by every rank.

Launching (launch.py): `--tp N` on a command (run, serve, eval, bench) is checked first (specdec/options.py
check_tp: a GPU per rank, heads the ranks can split, the command's own checks), then re-runs it as N ranks under
torchrun (one process per GPU); every rank runs the whole command, rank 0 alone prints and writes. Unseeded sampling
draws from generators seeded alike on every rank (one seed broadcast at join). A server's requests arrive at rank 0
alone: it broadcasts its engine's changes before each step and the other ranks mirror them (specdec/serve/ranks.py).
Drafters are replicated, every rank drafting the same trees (drafters/base.py says why). Adaptive speculation
chooses each step's shape from the step times it measures, which differ from rank to rank: every rank's policy is
told rank 0's times (comm.broadcast_seconds, host to host over a gloo group beside nccl's), so every rank plans
alike (everything else it reads, the drafts kept and the drafter's backlog, is the same on every rank).

Failure: the process group carries a collective timeout; a collective that fails (a peer died, or did not arrive
within the timeout) raises TensorParallelError naming the rank and the timeout, so a dead rank ends the others
with that error instead of a hang.
"""

from .comm import TensorParallelError, all_gather_last, all_reduce, broadcast_int, broadcast_object, broadcast_seconds
from .group import SINGLE, TensorParallel, init_from_env, init_tensor_parallel, joined, rank_device, shutdown
from .launch import is_primary, join, relaunch, under_launcher
from .layers import (
    RowParallelLinear,
    VocabParallelEmbedding,
    VocabParallelLMHead,
    column_linear,
    row_linear,
    shard_parameters,
    vocab_embedding,
    vocab_lm_head,
)
from .shard import Shard

__all__ = [
    "SINGLE",
    "RowParallelLinear",
    "Shard",
    "TensorParallel",
    "TensorParallelError",
    "VocabParallelEmbedding",
    "VocabParallelLMHead",
    "all_gather_last",
    "all_reduce",
    "broadcast_int",
    "broadcast_object",
    "broadcast_seconds",
    "column_linear",
    "init_from_env",
    "init_tensor_parallel",
    "is_primary",
    "join",
    "joined",
    "rank_device",
    "relaunch",
    "row_linear",
    "shard_parameters",
    "shutdown",
    "under_launcher",
    "vocab_embedding",
    "vocab_lm_head",
]
