"""Tree attention of one layer on the GPU: the Triton kernel that reads the KV pool in place
(verify_kernels/attention/flash_tree.py) against the path it replaces, the nodes' write + a gather of
pool[req_slots, :kv_len] + SDPA with the step's boolean mask (built once per step, outside the timing).

    python -m benchmarks.attention --out benchmarks/results/attention_h200.json

Qwen3.5-9B (16 query / 4 KV heads of 256) and Nemotron-3-Nano (32 / 2 of 128), bf16; batch 1 to 256; every row's
context (committed tokens) 128, 1024 or 4096; T = 1 (decode) or 5 (a 5-node chain: verify of 4 drafts). The gather
path is timed at the key length the engine's CUDA graphs give it (a power of two >= context + T, at least 256) and
at the exact one (eager steps). bytes_moved counts K/V read once (context + T keys), q read and out written;
kernel_tbps = bytes_moved / kernel time, next to a device copy measured in the same run. CUDA graphs, CUDA events,
medians, inputs rotated over >= 2 GiB (benchmarks/timing.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
from functools import partial
from pathlib import Path

import torch

from benchmarks.timing import copy_bandwidth, rotations_for, time_calls
from verify_kernels.attention import (
    masked_attention_ref,
    tree_attention,
    tree_attention_mask,
    tree_attention_ref,
    write_nodes_ref,
)
from verify_kernels.tree import ancestor_mask, chain_parents

MODELS = {"qwen3.5-9b": (16, 4, 256), "nemotron-3-nano": (32, 2, 128)}  # query heads, KV heads, head dim
BATCHES = (1, 16, 64, 128, 256)
CONTEXTS = (128, 1024, 4096)
WIDTHS = (1, 5)
DTYPE = torch.bfloat16


def kv_bucket(keys: int) -> int:
    """The key length of the engine's captured steps (specdec/engine/cuda_graphs.py: MIN_KV_LEN 256)."""
    return max(256, 1 << (keys - 1).bit_length())


def bytes_moved(batch: int, context: int, width: int, hq: int, hkv: int, dim: int) -> int:
    """K and V of context + T keys read once, q read and out written (bf16)."""
    return 2 * batch * dim * (2 * (context + width) * hkv + 2 * width * hq)


def gather_sdpa(query, key, value, key_pool, value_pool, req_slots, seq_lens, mask, scale) -> torch.Tensor:
    """The replaced per-layer path: write the nodes, gather kv_len = mask.shape[-1] positions per row, SDPA."""
    write_nodes_ref(key, value, key_pool, value_pool, req_slots, seq_lens)
    kv_len = mask.shape[-1]
    return masked_attention_ref(query, key_pool[req_slots, :kv_len], value_pool[req_slots, :kv_len], mask, scale)


def shape_rows(model: str, batch: int, context: int, widths, copy_bw: float) -> list[dict]:
    hq, hkv, dim = MODELS[model]
    positions = kv_bucket(context + max(widths))
    per_call = bytes_moved(batch, context, max(widths), hq, hkv, dim)
    rotations = rotations_for(per_call)
    shape = (rotations * batch, positions, hkv, dim)
    key_pool = torch.randn(shape, device="cuda", dtype=DTYPE)
    value_pool = torch.randn(shape, device="cuda", dtype=DTYPE)
    seq_lens = torch.full((batch,), context, device="cuda")
    slots = [torch.arange(r * batch, (r + 1) * batch, device="cuda") for r in range(rotations)]
    scale = dim**-0.5
    rows = []
    for width in widths:
        query = torch.randn(batch, width, hq, dim, device="cuda", dtype=DTYPE)
        key = torch.randn(batch, width, hkv, dim, device="cuda", dtype=DTYPE)
        value = torch.randn(batch, width, hkv, dim, device="cuda", dtype=DTYPE)
        ancestors = ancestor_mask(chain_parents(batch, width, "cuda"), torch.full((batch,), width, device="cuda"))
        bucket, exact = kv_bucket(context + width), context + width
        nodes = (query, key, value, key_pool, value_pool)
        kernel = [partial(tree_attention, *nodes, s, seq_lens, ancestors, scale, bucket) for s in slots]
        moved = bytes_moved(batch, context, width, hq, hkv, dim)
        row = {"model": model, "batch": batch, "context": context, "T": width, "rotations": rotations,
               "bytes_moved": moved}
        row["kernel_us"] = time_calls(kernel) * 1e6
        for name, kv_len in (("gather_bucket", bucket), ("gather_exact", exact)):
            mask = tree_attention_mask(seq_lens, ancestors, kv_len)
            calls = [partial(gather_sdpa, *nodes, s, seq_lens, mask, scale) for s in slots]
            row[f"{name}_us"] = time_calls(calls) * 1e6
        row["kernel_tbps"] = moved / row["kernel_us"] / 1e6
        row["kernel_x_copy"] = row["kernel_tbps"] * 1e12 / copy_bw
        row["speedup_vs_bucket"] = row["gather_bucket_us"] / row["kernel_us"]
        row["speedup_vs_exact"] = row["gather_exact_us"] / row["kernel_us"]
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def check(model: str) -> float:
    """Largest error of the kernel against the fp32 reference on one ragged step at full size (3 rows, T = 5)."""
    hq, hkv, dim = MODELS[model]
    gen = torch.Generator(device="cuda").manual_seed(0)
    seq_lens = torch.tensor([4000, 0, 700], device="cuda")
    parents = torch.tensor([[-1, 0, 0, 1, 2], [-1, 0, 1, 2, 3], [-1, -1, 0, 1000, 1000]], device="cuda")
    ancestors = ancestor_mask(parents, torch.tensor([5, 5, 3], device="cuda"))
    query = torch.randn(3, 5, hq, dim, device="cuda", generator=gen).to(DTYPE)
    key, value = (torch.randn(3, 5, hkv, dim, device="cuda", generator=gen).to(DTYPE) for _ in range(2))
    pools = [torch.randn(4, 4096, hkv, dim, device="cuda", generator=gen).to(DTYPE) for _ in range(2)]
    slots = torch.tensor([2, 0, 3], device="cuda")
    args = (slots, seq_lens, ancestors, dim**-0.5, 4005)
    ref = tree_attention_ref(query.float(), key.float(), value.float(), *(p.float() for p in pools), *args)
    out = tree_attention(query, key, value, *pools, *args)
    return ((out.float() - ref).abs().max() / ref.abs().max()).item()


HEADER = (f"{'model':16} {'B':>4} {'ctx':>5} {'T':>2} {'MB moved':>9} {'kernel us':>10} {'TB/s':>5} {'x copy':>6} "
          f"{'gather(bucket) us':>17} {'gather(exact) us':>16} {'x bucket':>8} {'x exact':>7}")


def _line(row: dict) -> str:
    return (f"{row['model']:16} {row['batch']:>4} {row['context']:>5} {row['T']:>2} {row['bytes_moved'] / 1e6:>9.1f} "
            f"{row['kernel_us']:>10.1f} {row['kernel_tbps']:>5.2f} {row['kernel_x_copy']:>6.2f} "
            f"{row['gather_bucket_us']:>17.1f} {row['gather_exact_us']:>16.1f} {row['speedup_vs_bucket']:>8.2f} "
            f"{row['speedup_vs_exact']:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--quick", action="store_true", help="batches 1 and 128, contexts 1024 and 4096 only")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the attention benchmark needs a CUDA GPU")
    torch.manual_seed(0)
    batches, contexts = ((1, 128), (1024, 4096)) if args.quick else (BATCHES, CONTEXTS)
    print(f"device: {torch.cuda.get_device_name()}", flush=True)
    checks = {model: check(model) for model in MODELS}
    for model, error in checks.items():
        print(f"check {model}: largest error / largest output {error:.2e}", flush=True)
    copy_bw = copy_bandwidth()
    print(f"device copy: {copy_bw / 1e12:.2f} TB/s\n{HEADER}", flush=True)
    rows = []
    for model in MODELS:
        for batch in batches:
            for context in contexts:
                rows += shape_rows(model, batch, context, WIDTHS, copy_bw)
                torch.cuda.empty_cache()
    if args.out is not None:
        result = {"command": "python -m benchmarks.attention" + (" --quick" if args.quick else ""),
                  "date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
                  "software": {"torch": torch.__version__, "triton": __import__("triton").__version__},
                  "copy_tbps": copy_bw / 1e12, "checks": checks, "rows": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
