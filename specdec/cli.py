"""`specdec run`: speculative generation from the command line; the parser of every subcommand (eval and bench in
specdec/eval/cli.py, the training commands in specdec/training/cli.py).

    specdec run                      # the shipped Qwen3.5 pair, an example prompt
    specdec run --target qwen3.5 --draft small --prompt "The capital of France is"
    specdec run --prompts-file prompts.jsonl --max-batch 16 --output answers.jsonl

Start-up stays light: this module imports neither torch nor transformers, every flag is checked while parsing (an
error is one line, well under a second), and what needs torch (the device, the drafter's name, the tree size) is
checked before any model loads. A subcommand registers itself with `add_...(commands)` and `set_defaults(handler=)`;
specdec/options.py holds the flag types and `run`'s option groups that other commands take too (add_model_arguments,
add_speculation_arguments, add_engine_arguments).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from specdec.eval import cli as eval_cli
from specdec.options import (
    add_engine_arguments,
    add_model_arguments,
    add_speculation_arguments,
    add_speculation_mode_argument,
    add_tp_argument,
    check_tp,
    check_tree,
    int_at_least,
    non_empty,
    not_utf8,
    number,
)
from specdec.presets import DEFAULT_TARGET
from specdec.serve import cli as serve_cli
from specdec.training import cli as training_cli

DEFAULT_PROMPT = "Tell me about the history of Rome."
INTERRUPTED = 130  # the exit status of a command stopped by Ctrl-C (128 + SIGINT)


def add_run_command(commands) -> None:
    run_parser = commands.add_parser(
        "run", help="generate text for one or more prompts",
        description="Generate with a target model and a drafter. One prompt streams; a prompts file is decoded "
        "--max-batch prompts at a time, each answer shown under its prompt. Ends with a stats line. Prompts go "
        "through the tokenizer's chat template when it has one (--no-chat sends the text as it is).")
    add_model_arguments(run_parser)
    inputs = run_parser.add_argument_group("prompts")
    source = inputs.add_mutually_exclusive_group()
    source.add_argument("--prompt", type=non_empty, help=f"one prompt (default: {DEFAULT_PROMPT!r})")
    source.add_argument("--prompts-file", type=Path,
                        help="a UTF-8 text file with one prompt per line, or a .jsonl file with a 'prompt' field "
                        "per line")
    inputs.add_argument("--chat", action=argparse.BooleanOptionalAction, default=None,
                        help="apply the tokenizer's chat template (default: whenever the tokenizer has one; "
                        "--no-chat sends the prompt text as it is)")
    inputs.add_argument("--output", type=Path, default=None,
                        help="write one JSON record per prompt to this .jsonl file (prompt, text, new tokens, mean "
                        "accepted length), each as its answer finishes")
    sampling = run_parser.add_argument_group("sampling")
    sampling.add_argument("--max-new-tokens", type=int_at_least(1), default=128)
    sampling.add_argument("--temperature", type=number(0, note=" (0 = greedy)"), default=0.0,
                          help="0 = greedy (default)")
    sampling.add_argument("--top-p", type=number(0, above=True, high=1), default=1.0)
    sampling.add_argument("--top-k", type=int_at_least(0), default=0, help="0 = off (default)")
    sampling.add_argument("--seed", type=int_at_least(0), default=None)
    sampling.add_argument("--stop", type=non_empty, action="append", default=[], help="a stop string (repeatable)")
    add_speculation_arguments(run_parser)
    add_speculation_mode_argument(run_parser)
    add_engine_arguments(run_parser)
    add_tp_argument(run_parser)
    run_parser.set_defaults(handler=run, launch_check=check_run)


class Parser(argparse.ArgumentParser):
    """Errors as one line that points at --help, instead of the whole usage block (subcommands inherit it)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists the options)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specdec", description="KVBuffer speculative decoding for hybrid "
                                     "linear-attention LLMs (Qwen3.5, Nemotron-3).")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_command(commands)
    serve_cli.add_command(commands)
    eval_cli.add_commands(commands)
    training_cli.add_commands(commands)
    for command in commands.choices.values():  # the training commands run through their module's dispatch
        if command.get_default("handler") is None:
            command.set_defaults(handler=training_cli.dispatch)
    return parser


# ---- prompts and output: read and checked before any model loads ----------------------------------------------
def read_prompts(args) -> list[str]:
    if args.prompts_file is not None:
        return read_prompts_file(args.prompts_file)
    return [DEFAULT_PROMPT if args.prompt is None else args.prompt]


def read_prompts_file(path: Path) -> list[str]:
    """The prompts of a .jsonl file (a 'prompt' field per line, as `specdec eval` reads them) or of a text file
    (one per non-blank line); errors name the file and the line."""
    if not path.is_file():
        raise ValueError(f"--prompts-file {path} does not exist" if not path.exists() else
                         f"--prompts-file {path} is not a file")
    if path.suffix == ".jsonl":
        from specdec.eval.datasets import load_prompts

        try:
            return [prompt.text for prompt in load_prompts(str(path))]
        except UnicodeDecodeError as error:
            raise not_utf8(path, error) from None
    try:
        prompts = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except UnicodeDecodeError as error:
        raise not_utf8(path, error) from None
    if not prompts:
        raise ValueError(f"--prompts-file {path} holds no prompts (every line is blank)")
    return prompts


def check_output(path: Path | None) -> None:
    if path is None:
        return
    if path.is_dir():
        raise ValueError(f"--output {path} is a directory; give a file name such as {path / 'answers.jsonl'}")
    if not path.parent.is_dir():
        raise ValueError(f"--output {path}: the folder {path.parent} does not exist")


# ---- specdec run ------------------------------------------------------------------------------------------------
def check_run(args) -> None:
    from specdec.eval.acceptance_prior import adaptive_settings

    read_prompts(args)
    check_output(args.output)
    check_tree(args)
    adaptive_settings(args)


def run(args) -> None:
    prompts = read_prompts(args)
    check_output(args.output)
    check_tree(args)
    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig
    from specdec.eval.acceptance_prior import adaptive_settings
    from specdec.eval.step_cost import with_device_prior
    from specdec.presets import drafter_asked

    config = EngineConfig.from_flags(
        max_batch=args.max_batch, max_seq_len=args.max_seq_len, flush_length=args.flush_length,
        num_steps=args.num_steps, topk=args.topk, num_draft_tokens=args.num_draft_tokens,
        dynamic_tree=args.dynamic_tree, cuda_graphs=not args.disable_cuda_graph, speculation=args.speculation,
        adaptive=adaptive_settings(args), max_prefill_tokens=args.max_prefill_tokens)
    llm = LLM(args.target or DEFAULT_TARGET, drafter_asked(args.target, args.draft), device=args.device,
              dtype=args.dtype, config=config, state_memory_gb=args.state_memory_gb, tp=args.tp)
    with_device_prior(llm)
    chat = llm.has_chat_template if args.chat is None else args.chat
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                   top_k=args.top_k, seed=args.seed, chat=chat, stop=args.stop)
    if args.prompt is None and args.prompts_file is None:
        print(f"[specdec] no --prompt given: asking {DEFAULT_PROMPT!r}", file=sys.stderr)
    start = time.perf_counter()
    with Answers(prompts, args.output if primary_rank() else None) as answers:
        if len(prompts) == 1 and args.prompts_file is None and llm.tokenizer is not None:
            for piece in llm.stream(prompts[0], **options):
                print(piece, end="", flush=True)
            print()
            answers.add(0, llm.last_stream, show=False)
        else:
            for index, output in llm.generate_each(prompts, **options):
                answers.add(index, output)
    if primary_rank():
        print_stats(answers.outputs, time.perf_counter() - start)


class Answers:
    """Shows each prompt with its answer in the prompts' order, and writes their records to --output, each as soon
    as the answers before it are in (an interrupted run leaves a valid JSONL of the first answers)."""

    def __init__(self, prompts: list[str], output: Path | None):
        self.prompts = prompts
        self.pending: dict[int, object] = {}
        self.outputs: list = []
        self.output_path = output
        self.file = None
        self.progress = None

    def __enter__(self) -> Answers:
        if self.output_path is not None:
            self.file = open(self.output_path, "w", encoding="utf-8")
        if len(self.prompts) > 1:
            from tqdm.auto import tqdm

            self.progress = tqdm(total=len(self.prompts), desc="prompts", unit="prompt", leave=False,
                                 disable=None)  # a terminal only, not logs
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if self.progress is not None:
            self.progress.close()
        if self.file is not None:
            self.file.close()
        if kind is KeyboardInterrupt:
            where = f"; the first {len(self.outputs)} answers are in {self.output_path}" if self.file else ""
            raise KeyboardInterrupt(f"{len(self.outputs)} of {len(self.prompts)} prompts answered{where}") from None

    def add(self, index: int, output, show: bool = True) -> None:
        self.pending[index] = output
        if self.progress is not None:
            self.progress.update(1)
        while len(self.outputs) in self.pending:
            number = len(self.outputs)
            self.outputs.append(self.pending.pop(number))
            self.record(number, self.outputs[-1], show)

    def record(self, index: int, output, show: bool) -> None:
        text = output.text if output.text is not None else " ".join(map(str, output.token_ids))
        if show:
            header = f"=== prompt {index + 1} of {len(self.prompts)} "
            if self.progress is not None:
                self.progress.clear()
            print(f"{header}{'=' * max(3, 60 - len(header))}\n{self.prompts[index]}\n--- answer "
                  f"({len(output.token_ids)} tokens, {output.finish_reason}) ---\n{text}\n", flush=True)
        if self.file is not None:
            self.file.write(json.dumps({
                "index": index, "prompt": self.prompts[index], "text": output.text,
                "new_tokens": len(output.token_ids), "mean_accepted_length": round(
                    output.stats.mean_accepted_length, 4), "finish_reason": output.finish_reason,
                "token_ids": output.token_ids}) + "\n")
            self.file.flush()


def print_stats(outputs, seconds: float) -> None:
    tokens = sum(len(out.token_ids) for out in outputs)
    steps = sum(out.stats.steps for out in outputs)
    emitted = sum(sum(out.stats.emitted_per_step) for out in outputs)
    drafted = sum(sum(out.stats.drafted_per_step) for out in outputs)
    accepted = emitted - steps
    rate = f"{accepted / drafted:.1%}" if drafted else "n/a (no drafts)"
    print(f"[specdec] {tokens} tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tokens/s); mean accepted "
          f"length {emitted / max(steps, 1):.2f} (incl. bonus); acceptance rate {rate}", file=sys.stderr)


def primary_rank() -> bool:
    """Rank 0 of a --tp run (torchrun sets RANK), or a process of no group: the one that prints and writes."""
    return os.environ.get("RANK", "0") == "0"


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status: 0, 2 for a bad argument or input (one line on stderr, no
    traceback), 130 for Ctrl-C."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help (0) or an argparse error (2), already printed
        return exit_.code if isinstance(exit_.code, int) else 2
    if getattr(args, "tp", 1) > 1 and "WORLD_SIZE" not in os.environ:
        from specdec.parallel import relaunch

        try:
            check_tp(args)  # before the ranks start: GPUs, heads, and the command's own checks
        except (ValueError, FileNotFoundError) as error:
            print(f"specdec: error: {error}", file=sys.stderr)
            return 2
        try:
            return relaunch(args.tp, sys.argv[1:] if argv is None else argv)  # this command again, as args.tp ranks
        except KeyboardInterrupt:
            return INTERRUPTED
    if not primary_rank():
        sys.stdout = open(os.devnull, "w")  # every rank runs the command; rank 0 alone prints
    try:
        args.handler(args)
    except KeyboardInterrupt as interrupt:
        note = f": {interrupt}" if str(interrupt) else ""
        print(f"\nspecdec: interrupted{note}", file=sys.stderr)
        return INTERRUPTED
    except (ValueError, FileNotFoundError) as error:  # CheckpointError is a ValueError
        print(f"specdec: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
