"""Write a small random-weight Qwen3.5 target and a smaller draft of the same family, each with a word-level
tokenizer, so that `specdec run` can be tried end to end on a CPU with no hub access:

    python examples/tiny_pair.py tiny
    specdec run --target tiny/target --draft tiny/draft --prompt "aa ab ac aa ab ac"

The weights are random, so the text is word salad; the pipeline (loading, KVBuffer verification of drafts,
lossless acceptance, streaming, stats) is the real one. Trained checkpoints come with a later milestone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from transformers import Qwen3_5TextConfig

from specdec.models.random_checkpoint import save_random_checkpoint, save_word_tokenizer

VOCAB = 512
ROPE = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25, "mrope_section": [4, 2, 2],
        "mrope_interleaved": True}


def config(hidden: int, layers: int) -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(
        vocab_size=VOCAB, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
        linear_value_head_dim=32, intermediate_size=2 * hidden, max_position_embeddings=4096, rope_parameters=ROPE,
        eos_token_id=1, tie_word_embeddings=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where to write target/ and draft/")
    args = parser.parse_args()
    for name, hidden, layers, seed in (("target", 256, 8, 0), ("draft", 128, 4, 0)):
        path = args.directory / name
        save_random_checkpoint(config(hidden, layers), path, seed=seed)
        save_word_tokenizer(path, VOCAB)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
