"""The engine end to end: tokens/s with its steps run eagerly and replayed from CUDA graphs, for plain decoding and
n-gram speculation, over batch sizes, on a random-weight Qwen3.5 at Qwen3.5-9B shapes with fewer layers.

    python -m benchmarks.engine --out benchmarks/results/engine_h200.json    # on the GPU; rewrites BENCHMARKS.md

Random weights make acceptance meaningless (the shipped trained pairs of issue 5 measure it); what this shows is
what the engine's own overhead costs and what CUDA graphs give back, on the same code in the same run. Every
request: a 64-token prompt (a repeated pattern, so prompt lookup finds matches), `--new-tokens` greedy tokens;
a warm-up round first (graph capture, kernel compilation), then one timed round per row.
`--tiny --device cpu` runs the same code on a tiny model (the CI smoke test).
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path

import torch
from transformers import Qwen3_5TextConfig

from benchmarks.report import replace_section
from drafters import NgramDrafter
from specdec.cache.spec import CacheConfig
from specdec.engine.engine import Engine, EngineConfig
from specdec.models import load_model
from specdec.models.random_checkpoint import save_random_checkpoint
from specdec.models.real_shapes import qwen35_9b
from specdec.speculation import SamplingParams, TreeShape

START, END = "<!-- engine:start -->", "<!-- engine:end -->"
PROMPT_TOKENS = 64
SHAPE = TreeShape(steps=4)


def qwen35_9b_shapes(layers: int, tiny: bool) -> Qwen3_5TextConfig:
    """Qwen3.5-9B's layer shapes (3 Gated DeltaNet : 1 attention), `layers` of them; tiny: a CI-sized stand-in."""
    if not tiny:
        return qwen35_9b(layers)
    layer_types = ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)]
    return Qwen3_5TextConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, num_hidden_layers=layers, layer_types=layer_types, max_position_embeddings=4096,
        tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "mrope_interleaved": True,
                         "partial_rotary_factor": 0.5, "mrope_section": [2, 1, 1]},  # 8 rotary dims
    )


def prompts(batch: int, vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(batch)
    return [torch.randint(2, vocab, (16,), generator=gen).tolist() * (PROMPT_TOKENS // 16) for _ in range(batch)]


def run_row(model, batch: int, drafter: str, graphs: bool, new_tokens: int) -> dict:
    config = EngineConfig(cache=CacheConfig(max_requests=batch, max_seq_len=PROMPT_TOKENS + new_tokens + 16,
                                            flush_length=16), shape=SHAPE, cuda_graphs=graphs, speculation="fixed")
    engine = Engine(model, NgramDrafter() if drafter == "ngram" else None, config)
    work = prompts(batch, model.hf_config.vocab_size)
    for prompt in work:  # warm-up: prefill, both step kinds, compilation
        engine.add_request(prompt, SamplingParams(), 8)
    engine.run()
    requests = [engine.add_request(prompt, SamplingParams(), new_tokens) for prompt in work]
    _sync(model.device)
    start = time.perf_counter()
    engine.run()
    _sync(model.device)
    seconds = time.perf_counter() - start
    emitted = sum(len(r.output) for r in requests)
    steps = sum(r.stats.steps for r in requests)
    return {"batch": batch, "drafter": drafter, "cuda_graphs": graphs, "graph_note": engine.runner.graph_note,
            "tokens_per_s": emitted / seconds, "mean_accepted_length": (emitted - batch) / steps,
            "ms_per_step": 1e3 * seconds / max(r.stats.steps for r in requests)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def table(rows: list[dict]) -> list[str]:
    """tokens/s eager and with graphs side by side, per batch and drafter."""
    lines = ["| batch | drafter | eager tok/s | graphs tok/s | x | eager ms/step | graphs ms/step | accepted len |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if row["cuda_graphs"]:
            continue
        pair = next((r for r in rows if r["cuda_graphs"] and (r["batch"], r["drafter"]) ==
                     (row["batch"], row["drafter"])), None)
        graphed = [f"{pair['tokens_per_s']:.0f}", f"{pair['tokens_per_s'] / row['tokens_per_s']:.2f}",
                   f"{pair['ms_per_step']:.2f}"] if pair else ["—", "—", "—"]
        lines.append(f"| {row['batch']} | {row['drafter']} | {row['tokens_per_s']:.0f} | {graphed[0]} | "
                     f"{graphed[1]} | {row['ms_per_step']:.2f} | {graphed[2]} | {row['mean_accepted_length']:.2f} |")
    return lines


def markdown_section(result: dict) -> str:
    return "\n".join([
        START, "## Engine: eager steps vs CUDA graphs", "",
        f"Generated by `python -m benchmarks.engine` ({result['command']}) on {result['date']} ({result['device']}; "
        f"torch {result['torch']}): a random-weight Qwen3.5 of {result['layers']} layers at Qwen3.5-9B shapes, "
        f"{result['dtype']}, {PROMPT_TOKENS}-token prompts, {result['new_tokens']} greedy new tokens per request, "
        f"flush length 16; n-gram drafts 4-token chains. Accepted length includes the bonus token; on random "
        "weights it says nothing about real drafts.", "",
        *table(result["rows"]),
        *sorted({f"\nCUDA graphs were not used: {row['graph_note']}." for row in result["rows"]
                 if row["cuda_graphs"] and row["graph_note"]}),
        END,
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="a tiny model (smoke test)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/engine_h200.json"))
    parser.add_argument("--markdown", type=Path, default=Path("BENCHMARKS.md"))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: pass --device cpu (with --tiny) for a smoke run")
    with tempfile.TemporaryDirectory() as directory:
        print(f"writing a random {args.layers}-layer checkpoint ...", flush=True)
        save_random_checkpoint(qwen35_9b_shapes(args.layers, args.tiny), directory, seed=0)
        model = load_model(directory, device=args.device)
    rows = []
    for batch in args.batches:
        for drafter in ("none", "ngram"):
            for graphs in (False, True):
                rows.append(run_row(model, batch, drafter, graphs, args.new_tokens))
                print(json.dumps(rows[-1]), flush=True)
    result = {"command": " ".join(["--layers", str(args.layers), "--new-tokens", str(args.new_tokens)]
                                  + (["--tiny"] if args.tiny else [])),
              "date": datetime.date.today().isoformat(), "device": _device_name(args.device),
              "torch": torch.__version__, "layers": args.layers, "dtype": str(model.dtype).removeprefix("torch."),
              "new_tokens": args.new_tokens, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    replace_section(args.markdown, START, END, markdown_section(result))
    print("\n".join(table(rows)))


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "CPU"


if __name__ == "__main__":
    main()
