"""The command line's shared options: flag types that refuse a bad value while parsing (one line, no torch), the
option groups of `specdec run` that other commands take too (eval, bench, serve), and the checks that need several
flags. Nothing here imports torch at module level; specdec/cli.py and specdec/eval/cli.py both build on it.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from specdec.presets import DEFAULT_TARGET

# The verify kernels take trees of up to 64 nodes (verify_kernels/{gdn,mamba2}/verify.py MAX_NODES): the root and at
# most 63 drafted tokens per request and step, on every device.
MAX_DRAFT_TOKENS = 63
DTYPES = ("bf16", "fp16", "fp32", "bfloat16", "float16", "float32")  # specdec/models/loading.py _parse_dtype


# ---- flag types: each rejects a bad value while parsing, with the rule in the message ---------------------------
def int_at_least(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            limits = f">= {low}" if high is None else f"between {low} and {high}"
            raise argparse.ArgumentTypeError(f"must be {limits}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def number(low: float, *, above: bool = False, high: float | None = None, note: str = ""):
    """A float >= low (> low with above; <= high with high)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (value > low if above else value >= low) or (high is not None and not value <= high):
            rule = (f"in ({low:g}, {high:g}]" if above else f"in [{low:g}, {high:g}]") if high is not None \
                else (f"> {low:g}" if above else f">= {low:g}")
            raise argparse.ArgumentTypeError(f"must be {rule}{note}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def device_name(text: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:\d+)?", text):
        raise argparse.ArgumentTypeError(f"expected cpu, cuda or cuda:N, got {text!r}")
    return text


def non_empty(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("must not be empty")
    return text


# ---- option groups ------------------------------------------------------------------------
def add_model_arguments(parser) -> None:
    """--target, --draft, --device, --dtype."""
    group = parser.add_argument_group("models")
    group.add_argument("--target", default=None,
                       help="family alias (qwen3.5, qwen3.5:9b, nemotron-3; see configs/models.json), hub id or "
                       f"local directory (default: {DEFAULT_TARGET}, the small trained Qwen3.5 shipped with specdec)")
    group.add_argument("--draft", default=None,
                       help="'small' (the draft paired with the target, else the smallest model of its family), "
                       "'ngram' (prompt lookup), 'mtp' (the target's multi-token-prediction layer), 'eagle3' (the "
                       "EAGLE-3 head listed for the target) or 'eagle3:PATH', an alias, hub id or directory of a "
                       "draft model, or 'none' for plain decoding (default: small with the default target, else "
                       "none)")
    group.add_argument("--device", type=device_name, default=None,
                       help="cpu, cuda or cuda:N (default: cuda when available)")
    group.add_argument("--dtype", choices=DTYPES, default=None,
                       help="bf16, fp16 or fp32 (default: bf16 on GPU, fp32 on CPU)")


def add_speculation_arguments(parser) -> None:
    """The draft shape and the KVBuffer flush length (SGLang's flag names work too)."""
    group = parser.add_argument_group("speculation (SGLang's flag names work too)")
    group.add_argument("--num-steps", "--speculative-num-steps", dest="num_steps", type=int_at_least(1), default=4,
                       help="draft depth per step (default 4)")
    group.add_argument("--topk", "--speculative-eagle-topk", dest="topk", type=int_at_least(1), default=1,
                       help="children per draft node: 1 = a chain (default), more = a static tree")
    group.add_argument("--num-draft-tokens", "--speculative-num-draft-tokens", dest="num_draft_tokens",
                       type=int_at_least(1, MAX_DRAFT_TOKENS), default=None,
                       help=f"cap on drafted tokens per request and step, at most {MAX_DRAFT_TOKENS} (the verify "
                       "kernels take trees of 64 nodes); a tree of --num-steps and --topk must fit it")
    group.add_argument("--dynamic-tree", action="store_true",
                       help="EAGLE-2 dynamic tree (mtp / eagle3 drafters): expand the --topk best nodes of each "
                       "level by cumulative draft probability, keep the --num-draft-tokens best")
    group.add_argument("--flush-length", type=int_at_least(1), default=16, help="KVBuffer flush length L (default 16)")


def add_speculation_mode_argument(parser, several: bool = False) -> None:
    """--speculation adaptive | fixed (run and serve: adaptive by default, issue 17: at or above plain decoding and
    within 0.95x of the best fixed shape wherever measured); several: eval and bench take both, one run each, fixed
    by default (they measure a drafter's acceptance at its shape)."""
    parser.add_argument("--speculation", choices=("fixed", "adaptive"), default=["fixed"] if several else "adaptive",
                        nargs="+" if several else None,
                        help="adaptive: each step a chain of up to --num-steps drafts, the tree of --topk > 1 (static "
                        "or --dynamic-tree) if given, or none, chosen from the running acceptance and the measured "
                        "step time" + ("" if several else " (default)") + "; fixed: every step drafts the --num-steps "
                        "/ --topk shape" + (" (default); both: one run of each, side by side" if several else ""))
    parser.add_argument("--acceptance-prior", type=Path, nargs="+", default=None, metavar="EVAL",
                        help="with --speculation adaptive: start each request's acceptance from this pair's figures, "
                        "the output folder of a `specdec eval` of a chain (--topk 1), and optionally of a static "
                        "tree's beside it for the sibling acceptance (default: 0.75 a position and 0.3, the shipped "
                        "Qwen3.5 drafters' on MT-bench)")


def add_engine_arguments(parser) -> None:
    """Batch, lengths, state memory and CUDA graphs."""
    group = parser.add_argument_group("engine")
    group.add_argument("--max-batch", type=int_at_least(1), default=8, help="requests decoded together (default 8)")
    group.add_argument("--max-seq-len", type=int_at_least(2), default=4096, help="tokens per request (default 4096)")
    add_prefill_argument(group)
    group.add_argument("--state-memory-gb", type=number(0, above=True), default=None,
                       help="memory for the KVBuffer pools in GiB: as many committed states as fit; requests wait "
                       "for one rather than fail (default: one state slot per request)")
    group.add_argument("--disable-cuda-graph", action="store_true",
                       help="run decode / verify steps eagerly on a GPU (default: replay them from CUDA graphs)")


def add_prefill_argument(parser) -> None:
    """--max-prefill-tokens (SGLang's name): the prefill's forwards, bounded (specdec/engine/prefill.py)."""
    parser.add_argument("--max-prefill-tokens", type=int_at_least(1), default=16384,
                        help="padded prompt tokens per prefill forward: admitted requests prefill in groups of at "
                        "most this many, a longer prompt in pieces of this many, one forward a step between the "
                        "running requests' steps (default 16384; lower it if a prefill runs out of GPU memory)")


def add_tp_argument(parser) -> None:
    """--tp: the command runs as that many ranks under torchrun (specdec/parallel), the target sharded over them."""
    parser.add_argument("--tp", type=int_at_least(1), default=1,
                        help="tensor-parallel ranks: shard the target over this many GPUs of this host; the command "
                        "runs once per rank and rank 0 prints and writes (default 1)")


# ---- checks of several flags, or of files
def check_tree(args) -> None:
    """The draft tree that --num-steps / --topk / --num-draft-tokens describe fits the verify kernels."""
    if args.draft == "none" or (args.draft is None and args.target is not None):
        return  # plain decoding drafts nothing
    from specdec.speculation import TreeShape

    budget = TreeShape(args.num_steps, args.topk, args.num_draft_tokens, args.dynamic_tree).budget
    if budget > MAX_DRAFT_TOKENS:
        raise ValueError(f"--num-steps {args.num_steps} --topk {args.topk} drafts {budget} tokens per step, more than "
                         f"the {MAX_DRAFT_TOKENS} a step verifies; cap it with --num-draft-tokens {MAX_DRAFT_TOKENS} "
                         "or fewer, or lower --num-steps / --topk")


def check_tp(args) -> None:
    """--tp N, before N ranks start (seconds of imports each): a GPU per rank (on a host with GPUs), and a target
    whose heads, groups and channels N ranks can split. First the command's own checks (args.launch_check); then the
    target is built on the meta device as rank 0 of N (no weights read), so the sharded layers' own rules speak."""
    size = args.tp
    if size == 1:
        return
    if getattr(args, "launch_check", None) is not None:  # the command's own, cheap checks first
        args.launch_check(args)
    import torch

    from specdec.parallel import TensorParallel

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if device.startswith("cuda") and ":" in device:
        raise ValueError(f"--tp {size} gives rank r the GPU cuda:r; leave --device out or give 'cuda', not {device!r}")
    if device.startswith("cuda") and gpus < size:
        raise ValueError(f"--tp {size} needs {size} GPUs (one per rank), but torch sees {gpus} on this machine; "
                         + (f"use --tp {gpus} or fewer" if gpus > 1 else "--device cpu runs the ranks on the CPU"))
    from transformers import AutoConfig

    from specdec.models.checkpoint import read_config, resolve_checkpoint
    from specdec.models.loading import FAMILIES
    from specdec.presets import resolve

    target = args.target or DEFAULT_TARGET
    directory = resolve_checkpoint(resolve(target))
    family = FAMILIES.get(read_config(directory).get("model_type"))
    if family is not None:  # else the loading fails, with the list of the model types specdec runs
        config = AutoConfig.from_pretrained(directory)
        try:
            with torch.device("meta"):
                family.build(config.get_text_config() if family.multimodal else config, tp=TensorParallel(0, size))
        except ValueError as error:
            raise ValueError(f"--tp {size} cannot shard {target}: {error}") from None


def check_writable(path: Path, flag: str, folder: bool = False) -> None:
    """Before any work: `path` (a file, or with `folder` a folder, its parents made as needed) can be written where
    it names. A file that is a folder, a folder that is a file, or a place nothing can be written into (a read-only
    file system, /proc) fails here in one line instead of after the run it was to record."""
    import tempfile

    if path.exists() and path.is_dir() != folder:
        kind = "a directory; give a file name" if not folder else "a file; give a folder"
        raise ValueError(f"{flag} {path} is {kind}")
    ancestor = path if folder and path.is_dir() else path.parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ValueError(f"{flag} {path}: {ancestor} is a file, not a folder")
    try:
        with tempfile.TemporaryFile(dir=ancestor):
            pass
    except OSError as error:
        raise ValueError(f"{flag} {path}: nothing can be written in {ancestor} ({error.strerror}); give another "
                         "place") from None


def not_utf8(path: Path | str, error: UnicodeDecodeError) -> ValueError:
    """A file that is not UTF-8, with the line and the byte at fault."""
    line = error.object[:error.start].count(b"\n") + 1
    return ValueError(f"{path}:{line} is not UTF-8 text (byte {error.object[error.start]:#04x}); save the file as "
                      "UTF-8")
