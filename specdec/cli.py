"""`specdec run`: speculative generation from the command line (and the training commands of
specdec/training/cli.py).

    specdec run                      # the shipped Qwen3.5 pair, an example prompt
    specdec run --target qwen3.5 --draft small --prompt "The capital of France is"
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from specdec.eval import cli as eval_cli
from specdec.models.checkpoint import CheckpointError
from specdec.presets import DEFAULT_TARGET
from specdec.serve import cli as serve_cli
from specdec.training import cli as training_cli

DEFAULT_PROMPT = "Tell me about the history of Rome."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="KVBuffer speculative decoding for hybrid "
                                     "linear-attention LLMs (Qwen3.5, Nemotron-3).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="generate text for one or more prompts",
                              description="Generate with a target model and a drafter; streams a single prompt, "
                              "shows progress for several, and ends with a stats line.")
    models = run.add_argument_group("models")
    models.add_argument("--target", default=None,
                        help="family alias (qwen3.5, qwen3.5:9b, nemotron-3; see configs/models.json), hub id or "
                        f"local directory (default: {DEFAULT_TARGET}, the small trained Qwen3.5 shipped with specdec)")
    models.add_argument("--draft", default=None,
                        help="'small' (the draft paired with the target, else the smallest model of its family), "
                        "'ngram' (prompt lookup), 'mtp' (the target's multi-token-prediction layer), 'eagle3' (the "
                        "EAGLE-3 head listed for the target) or 'eagle3:PATH', an alias, hub id or directory of a "
                        "draft model, or 'none' for plain decoding (default: small with the default target, else "
                        "none)")
    models.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    models.add_argument("--dtype", default=None, help="bf16, fp16 or fp32 (default: bf16 on GPU, fp32 on CPU)")
    inputs = run.add_argument_group("prompts")
    source = inputs.add_mutually_exclusive_group()
    source.add_argument("--prompt", help=f"one prompt (default: {DEFAULT_PROMPT!r} in the chat template)")
    source.add_argument("--prompts-file", type=Path,
                        help="a text file with one prompt per line, or a JSONL file with a 'prompt' field per line")
    inputs.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template")
    sampling = run.add_argument_group("sampling")
    sampling.add_argument("--max-new-tokens", type=int, default=128)
    sampling.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    sampling.add_argument("--top-p", type=float, default=1.0)
    sampling.add_argument("--top-k", type=int, default=0)
    sampling.add_argument("--seed", type=int, default=None)
    sampling.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    speculation = run.add_argument_group("speculation (SGLang's flag names work too)")
    speculation.add_argument("--num-steps", "--speculative-num-steps", dest="num_steps", type=int, default=4,
                             help="draft depth per step (default 4)")
    speculation.add_argument("--topk", "--speculative-eagle-topk", dest="topk", type=int, default=1,
                             help="children per draft node: 1 = a chain (default), more = a static tree")
    speculation.add_argument("--num-draft-tokens", "--speculative-num-draft-tokens", dest="num_draft_tokens",
                             type=int, default=None, help="cap on drafted tokens per step")
    speculation.add_argument("--dynamic-tree", action="store_true",
                             help="EAGLE-2 dynamic tree (mtp / eagle3 drafters): expand the --topk best nodes of each "
                             "level by cumulative draft probability, keep the --num-draft-tokens best")
    engine = run.add_argument_group("engine")
    engine.add_argument("--flush-length", type=int, default=16, help="KVBuffer flush length L (default 16)")
    engine.add_argument("--max-batch", type=int, default=8, help="requests decoded together (default 8)")
    engine.add_argument("--max-seq-len", type=int, default=4096, help="tokens per request (default 4096)")
    engine.add_argument("--state-memory-gb", type=float, default=None,
                        help="memory for the KVBuffer pools in GiB: as many committed states as fit; requests wait "
                        "for one rather than fail (default: one state slot per request)")
    engine.add_argument("--disable-cuda-graph", action="store_true",
                        help="run decode / verify steps eagerly on a GPU (default: replay them from CUDA graphs)")
    serve_cli.add_command(commands, run)
    eval_cli.add_commands(commands)
    training_cli.add_commands(commands)
    return parser


def read_prompts(args) -> list[str]:
    if args.prompt is None and args.prompts_file is None:
        args.chat = True
        print(f"[specdec] no --prompt given: asking {DEFAULT_PROMPT!r}", file=sys.stderr)
        return [DEFAULT_PROMPT]
    if args.prompt is not None:
        return [args.prompt]
    if not args.prompts_file.is_file():
        raise ValueError(f"--prompts-file {args.prompts_file} does not exist")
    lines = [line for line in args.prompts_file.read_text().splitlines() if line.strip()]
    if args.prompts_file.suffix == ".jsonl":
        return [json.loads(line)["prompt"] for line in lines]
    return lines


def run(args) -> None:
    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig
    from specdec.presets import drafter_asked

    prompts = read_prompts(args)
    config = EngineConfig.from_flags(
        max_batch=args.max_batch, max_seq_len=args.max_seq_len, flush_length=args.flush_length,
        num_steps=args.num_steps, topk=args.topk, num_draft_tokens=args.num_draft_tokens,
        dynamic_tree=args.dynamic_tree, cuda_graphs=not args.disable_cuda_graph)
    llm = LLM(args.target or DEFAULT_TARGET, drafter_asked(args.target, args.draft), device=args.device,
              dtype=args.dtype, config=config, state_memory_gb=args.state_memory_gb)
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                   top_k=args.top_k, seed=args.seed, chat=args.chat, stop=args.stop)
    start = time.perf_counter()
    if len(prompts) == 1 and llm.tokenizer is not None:
        for piece in llm.stream(prompts[0], **options):
            print(piece, end="", flush=True)
        print()
        outputs = [llm.last_stream]
    else:
        outputs = []
        for prompt in tqdm(prompts, desc="prompts", unit="prompt", disable=len(prompts) == 1):
            outputs += llm.generate(prompt, **options)
        for out in outputs:
            print(out.text if out.text is not None else " ".join(map(str, out.token_ids)))
    print_stats(outputs, time.perf_counter() - start)


def print_stats(outputs, seconds: float) -> None:
    tokens = sum(len(out.token_ids) for out in outputs)
    steps = sum(out.stats.steps for out in outputs)
    emitted = sum(sum(out.stats.emitted_per_step) for out in outputs)
    drafted = sum(sum(out.stats.drafted_per_step) for out in outputs)
    accepted = emitted - steps
    rate = f"{accepted / drafted:.1%}" if drafted else "n/a (no drafts)"
    print(f"[specdec] {tokens} tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tokens/s); mean accepted "
          f"length {emitted / max(steps, 1):.2f} (incl. bonus); acceptance rate {rate}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            run(args)
        elif args.command == "serve":
            serve_cli.serve(args)
        elif args.command in ("eval", "bench"):
            eval_cli.dispatch(args)
        else:
            training_cli.dispatch(args)
    except (ValueError, CheckpointError, FileNotFoundError) as error:
        print(f"specdec: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
