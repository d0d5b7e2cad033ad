"""The training subcommands of `specdec`: train-tokenizer, train and train-drafter (the shipped models are made
with them)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_commands(commands) -> None:
    tokenizer = commands.add_parser(
        "train-tokenizer", help="train the byte-level BPE tokenizer of the shipped models",
        description="Train a byte-level BPE tokenizer (digits split, chat template) on a folder of *.txt, *.txt.gz or "
        "*.txt.xz files (default: the corpus shipped in specdec/training/corpus) and save it in the Hugging Face "
        "layout.")
    tokenizer.add_argument("--data", type=Path, default=None, help="folder of text files (default: shipped corpus)")
    tokenizer.add_argument("--vocab-size", type=int, default=8192)
    tokenizer.add_argument("--out", type=Path, required=True, help="directory to write tokenizer.json etc. into")

    train = commands.add_parser(
        "train", help="train a small model of a preset in configs/shipped_models.json",
        description="Train a preset (transformers' model classes; the Qwen3.5 target with its MTP layer) on a folder "
        "of text files and save it in the Hugging Face layout with the tokenizer; prints the held-out perplexity.")
    train.add_argument("--preset", required=True, help="a name in configs/shipped_models.json, e.g. qwen3.5-tiny")
    train.add_argument("--tokenizer", type=Path, required=True, help="directory of a tokenizer (train-tokenizer)")
    train.add_argument("--out", type=Path, required=True)
    train.add_argument("--data", type=Path, default=None, help="folder of text files (default: shipped corpus)")
    train.add_argument("--steps", type=int, default=3000)
    train.add_argument("--batch-size", type=int, default=64)
    train.add_argument("--seq-len", type=int, default=512)
    train.add_argument("--lr", type=float, default=3e-3)
    train.add_argument("--eval-tokens", type=int, default=2**17, help="held-out tokens per corpus file")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--max-minutes", type=float, default=None,
                       help="run fewer steps if --steps would take longer (timed over the first steps)")
    train.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")

    drafter = commands.add_parser(
        "train-drafter", help="train an EAGLE-3 head or the MTP layer of a target checkpoint",
        description="Train a draft head for a target on a folder of text files, running the target on the fly: "
        "'eagle3' writes an EAGLE-3 head (SpecForge format) to --out; 'mtp' trains the target's MTP layer with the "
        "target frozen and writes a copy of the target with it to --out.")
    drafter.add_argument("--target", type=Path, required=True, help="the target checkpoint directory")
    drafter.add_argument("--method", required=True, choices=["eagle3", "mtp"])
    drafter.add_argument("--out", type=Path, required=True)
    drafter.add_argument("--data", type=Path, default=None, help="folder of text files (default: shipped corpus)")
    drafter.add_argument("--steps", type=int, default=2000)
    drafter.add_argument("--batch-size", type=int, default=32)
    drafter.add_argument("--seq-len", type=int, default=512)
    drafter.add_argument("--lr", type=float, default=1e-3)
    drafter.add_argument("--draft-vocab-size", type=int, default=2048, help="EAGLE-3: tokens the head can draft")
    drafter.add_argument("--seed", type=int, default=0)
    drafter.add_argument("--max-minutes", type=float, default=None,
                         help="run fewer steps if --steps would take longer (timed over the first steps)")
    drafter.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")


def dispatch(args: argparse.Namespace) -> None:
    if args.command == "train-tokenizer":
        from specdec.training.tokenizer import train_corpus_tokenizer

        tokenizer = train_corpus_tokenizer(args.data or _corpus(), args.out, args.vocab_size)
        print(f"[specdec] tokenizer of {len(tokenizer)} tokens written to {args.out}")
    elif args.command == "train":
        import torch

        from specdec.training.lm import TrainConfig, train_lm

        cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                          eval_tokens=args.eval_tokens, seed=args.seed, max_minutes=args.max_minutes)
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        record = train_lm(args.preset, args.tokenizer, args.out, cfg, data=args.data, device=device)
        summary = {k: record[k] for k in ("preset", "parameters", "final_loss", "held_out_perplexity", "seconds")}
        print(json.dumps(summary, indent=1))
    elif args.command == "train-drafter":
        if not (args.target / "config.json").is_file():
            raise ValueError(f"--target {args.target} is not a checkpoint directory (a folder holding config.json); "
                             "give the folder `specdec train` wrote, or a downloaded Hugging Face checkpoint")
        import torch

        from specdec.training.drafter import train_drafter
        from specdec.training.lm import TrainConfig

        cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                          seed=args.seed, warmup=min(100, max(1, args.steps // 10)), grad_clip=0.5,
                          max_minutes=args.max_minutes)
        device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        record = train_drafter(args.target, args.method, args.out, cfg, data=args.data, device=device,
                               draft_vocab_size=args.draft_vocab_size)
        print(json.dumps({"method": record["method"], "seconds": record["seconds"], "last": record["curve"][-1]},
                         indent=1))


def _corpus() -> Path:
    from specdec.training.corpus import CORPUS_DIR

    return CORPUS_DIR
