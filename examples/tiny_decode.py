"""Greedy decoding on the KVBuffer cache with small random Qwen3.5 and Nemotron-H checkpoints, checked token for
token against transformers.

    python examples/tiny_decode.py [--family qwen3.5|nemotron-h|all] [--flush-length 16] [--max-new-tokens 48]

For each family: write a random-weight checkpoint with transformers' save_pretrained, load it with specdec's
loader, decode a batch of prompts of different lengths (short ones stay in the buffer with no committed state,
long ones are prefilled chunkwise), and compare with transformers' generate() on each prompt.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from transformers import NemotronHConfig, Qwen3_5TextConfig

from specdec import CacheConfig, load_model
from specdec.engine.engine import Engine, EngineConfig
from specdec.models.random_checkpoint import save_random_checkpoint
from specdec.speculation import SamplingParams

PROMPT_LENGTHS = (5, 12, 40, 90)


def small_config(family: str):
    if family == "qwen3.5":
        return Qwen3_5TextConfig(
            vocab_size=2048, hidden_size=256, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=2,
            head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32,
            linear_value_head_dim=32, intermediate_size=512, max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25,
                             "mrope_section": [4, 2, 2], "mrope_interleaved": True},
        )
    return NemotronHConfig(
        vocab_size=2048, hidden_size=256,
        layers_block_type=["linear_attention", "moe", "linear_attention", "full_attention", "linear_attention", "mlp"],
        mamba_num_heads=8, mamba_head_dim=32, n_groups=2, ssm_state_size=32, num_attention_heads=8,
        num_key_value_heads=2, head_dim=32, intermediate_size=512, n_routed_experts=8, num_experts_per_tok=2,
        moe_intermediate_size=128, moe_shared_expert_intermediate_size=256,
        # below any dt the random init produces: transformers clamps there only while prefilling
        time_step_min=1e-9, max_position_embeddings=1024,
    )


def transformers_greedy(hf_model, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False,
                                pad_token_id=0, eos_token_id=None)
    return out[0, len(prompt):].tolist()


def run_family(family: str, workdir: Path, flush_length: int, new_tokens: int) -> dict:
    directory = workdir / family
    hf_model = save_random_checkpoint(small_config(family), directory, seed=0)
    model = load_model(directory, device="cpu")
    generator = torch.Generator().manual_seed(0)
    vocab = model.hf_config.vocab_size
    prompts = [torch.randint(0, vocab, (length,), generator=generator).tolist() for length in PROMPT_LENGTHS]

    config = CacheConfig(max_requests=len(prompts), max_seq_len=max(PROMPT_LENGTHS) + new_tokens + 1,
                         flush_length=flush_length)
    engine = Engine(model, None, EngineConfig(cache=config))  # no drafter: plain decoding on the KVBuffer cache
    requests = [engine.add_request(prompt, SamplingParams(), new_tokens) for prompt in prompts]
    start = time.perf_counter()
    engine.run()
    seconds = time.perf_counter() - start
    reference = [transformers_greedy(hf_model, prompt, new_tokens) for prompt in prompts]
    return {
        "family": family,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "matches": sum(r.output == theirs for r, theirs in zip(requests, reference, strict=True)),
        "prompts": len(prompts),
        "tok_s": new_tokens * len(prompts) / seconds,
        "cache_mib": engine.runner.cache.nbytes() / 2**20,
        "sample": requests[0].output[:12],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=["qwen3.5", "nemotron-h", "all"], default="all")
    parser.add_argument("--flush-length", type=int, default=16, help="KVBuffer flush length L")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where to write the checkpoints (default: a temporary directory)")
    args = parser.parse_args()
    families = ["qwen3.5", "nemotron-h"] if args.family == "all" else [args.family]
    torch.set_num_threads(max(1, torch.get_num_threads()))

    with tempfile.TemporaryDirectory() as scratch:
        workdir = args.workdir or Path(scratch)
        start = time.perf_counter()
        rows = [run_family(family, workdir, args.flush_length, args.max_new_tokens) for family in families]
    print(f"\nprompts of {PROMPT_LENGTHS} tokens, {args.max_new_tokens} new tokens each, flush length "
          f"{args.flush_length}, CPU fp32 ({time.perf_counter() - start:.1f} s in all)")
    print(f"{'model':<12}{'params':>9}{'tokens/s':>10}{'cache MiB':>11}  same tokens as transformers")
    for row in rows:
        print(f"{row['family']:<12}{row['params_m']:>8.1f}M{row['tok_s']:>10.1f}{row['cache_mib']:>11.1f}  "
              f"{row['matches']}/{row['prompts']} prompts")
        print(f"{'':<12}first tokens of prompt 0: {row['sample']}")
    if any(row["matches"] != row["prompts"] for row in rows):
        raise SystemExit("specdec and transformers disagree")


if __name__ == "__main__":
    main()
