"""load_model: a Hugging Face checkpoint (local directory or hub id) -> our runtime module, weights in place.

The model is built on the meta device and every tensor is read straight into its parameter, so a large model
is never allocated twice. Checkpoint names are mapped onto ours (which mirror transformers' names):
- Qwen3.5 multimodal checkpoints keep the text model under `model.language_model.`; vision tensors
  (`model.visual.`) are skipped;
- Nemotron-H checkpoints use `backbone.` for `model.`;
- MoE experts stored one tensor per expert are stacked into transformers' layout;
- `mtp.*` tensors (multi-token prediction) are kept in `model.mtp_weights` for the MTP drafter.
Under tensor parallelism (`tp`, specdec.parallel) the model is built with the rank's heads and each sharded
parameter is read as the rank's slice only (safetensors get_slice, the module's `tp_shards`).
Anything else that does not match a parameter, and any parameter left unfilled, is an error naming it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from accelerate import init_empty_weights
from torch import nn
from transformers import AutoConfig

from specdec.parallel import SINGLE, Shard, TensorParallel

from .base import HybridCausalLM
from .checkpoint import CheckpointError, iter_handles, read_config, resolve_checkpoint, tensor_names, weight_files
from .nemotron_h import NemotronHForCausalLM
from .qwen3_5 import Qwen35ForCausalLM


@dataclass(frozen=True)
class Family:
    build: Callable[..., HybridCausalLM]
    multimodal: bool  # the text config sits under text_config
    prefixes: tuple[tuple[str, str], ...]  # checkpoint prefix -> our prefix
    skip_prefixes: tuple[str, ...]  # tensors we do not serve (vision towers)
    experts: ExpertLayout | None  # MoE checkpoints may store one tensor per expert
    keep_fp32: tuple[str, ...] = ()  # parameter name suffixes kept in fp32 whatever the dtype


@dataclass(frozen=True)
class ExpertLayout:
    """One tensor per expert: `pattern` matches (experts module, expert index, projection) in a checkpoint name;
    `stacked` maps each projection to (our stacked parameter, its block along dim 1, number of blocks)."""

    pattern: re.Pattern
    stacked: dict[str, tuple[str, int, int]]

    def projections_of(self, parameter: str) -> list[str]:
        return [projection for projection, (target, _, _) in self.stacked.items() if target == parameter]


_QWEN_EXPERTS = ExpertLayout(
    re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$"),
    {"gate_proj": ("gate_up_proj", 0, 2), "up_proj": ("gate_up_proj", 1, 2), "down_proj": ("down_proj", 0, 1)},
)
_NEMOTRON_EXPERTS = ExpertLayout(
    re.compile(r"^(model\.layers\.\d+\.mixer\.experts)\.(\d+)\.(up_proj|down_proj)\.weight$"),
    {"up_proj": ("up_proj", 0, 1), "down_proj": ("down_proj", 0, 1)},
)
_QWEN_PREFIXES = (("model.language_model.", "model."),)
_QWEN_SKIP = ("model.visual.", "visual.")

FAMILIES: dict[str, Family] = {
    "qwen3_5": Family(Qwen35ForCausalLM, True, _QWEN_PREFIXES, _QWEN_SKIP, None),
    "qwen3_5_text": Family(Qwen35ForCausalLM, False, _QWEN_PREFIXES, _QWEN_SKIP, None),
    "qwen3_5_moe": Family(partial(Qwen35ForCausalLM, moe=True), True, _QWEN_PREFIXES, _QWEN_SKIP, _QWEN_EXPERTS),
    "qwen3_5_moe_text": Family(partial(Qwen35ForCausalLM, moe=True), False, _QWEN_PREFIXES, _QWEN_SKIP,
                               _QWEN_EXPERTS),
    "nemotron_h": Family(NemotronHForCausalLM, False, (("backbone.", "model."),), (), _NEMOTRON_EXPERTS,
                         keep_fp32=("gate.weight", "gate.e_score_correction_bias")),
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
MTP_PREFIX = "mtp."
# beside config.json instead of weights: a random:NAME target, drawn on the device (random_checkpoint.py)
RANDOM_WEIGHTS = "random_weights.json"


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_model(name_or_path: str | Path, device: str | torch.device | None = None,
               dtype: torch.dtype | str | None = None, tp: TensorParallel = SINGLE) -> HybridCausalLM:
    """Load a Qwen3.5 (dense / MoE, text or multimodal checkpoint) or Nemotron-H checkpoint for inference.

    device defaults to cuda when available, else cpu; dtype to bf16 on GPU and fp32 on CPU. tp: this process's
    rank of a tensor-parallel group; the rank's shards only are built and read.
    """
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = _parse_dtype(dtype) if dtype is not None else default_dtype(device)
    directory = resolve_checkpoint(name_or_path)
    raw = read_config(directory)
    model_type = raw.get("model_type")
    if model_type not in FAMILIES:
        raise CheckpointError(
            f"{directory}/config.json has model_type {model_type!r}, which specdec does not run; supported "
            f"model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    family = FAMILIES[model_type]
    hf_config = AutoConfig.from_pretrained(directory)
    build = partial(family.build, tp=tp)
    if family.multimodal:
        # Multimodal checkpoints tie the text model's head by the top-level flag, as transformers does.
        tied = hf_config.tie_word_embeddings
        hf_config = hf_config.get_text_config()
        hf_config.tie_word_embeddings = tied

    if (directory / RANDOM_WEIGHTS).is_file():
        return random_model(family, build, hf_config, directory / RANDOM_WEIGHTS, device, dtype)
    with init_empty_weights(include_buffers=False):
        model = build(hf_config)
    files = weight_files(directory)
    plan = _plan_loading(model, family, tensor_names(files), directory)
    _load(model, family, plan, files, device, dtype)
    model.to(device)  # buffers built outside the meta device (rotary frequencies)
    return model.merge_projections().eval()


def random_model(family: Family, build: Callable[..., HybridCausalLM], hf_config, spec: Path, device: torch.device,
                 dtype: torch.dtype) -> HybridCausalLM:
    """A model whose weights are drawn, not read: built (by `build`) on `device` straight in `dtype` (a 35B model
    never exists in fp32), then drawn by random_checkpoint.randomize with the seed in `spec`; dtypes and tying as
    _load leaves them. Under tensor parallelism each rank draws its own shards: a different model from tp 1's, the
    same per-rank work (for timing)."""
    import json

    from .random_checkpoint import randomize

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = build(hf_config)
    finally:
        torch.set_default_dtype(default)
    randomize(model, json.loads(spec.read_text())["seed"])
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_floating_point() and any(name.endswith(suffix) for suffix in family.keep_fp32):
            _assign(model, name, tensor.float())
    if getattr(hf_config, "tie_word_embeddings", False):
        model.lm_head.weight = (getattr(model.model, "embed_tokens", None) or model.model.embeddings).weight
    return model.merge_projections().eval()


def _parse_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
             "fp32": torch.float32, "float32": torch.float32}
    if dtype not in names:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(names)}")
    return names[dtype]


@dataclass
class _Plan:
    targets: dict[str, str]  # checkpoint name -> our parameter / buffer name
    experts: dict[str, tuple[str, int, int, int]]  # checkpoint name -> (stacked parameter, expert, block, blocks)
    mtp: dict[str, str]  # checkpoint name -> name inside mtp_weights
    tie_lm_head: bool


def _plan_loading(model: HybridCausalLM, family: Family, names: dict[str, Path], directory: Path) -> _Plan:
    """Map every checkpoint tensor name onto the model before reading any tensor, so that a mismatched
    checkpoint fails at once with the names at fault."""
    expected = dict(model.named_parameters())
    expected.update({name: buf for name, buf in model.named_buffers() if _is_persistent(model, name)})
    tie = bool(getattr(model.hf_config, "tie_word_embeddings", False))
    plan = _Plan({}, {}, {}, tie)
    unexpected, expert_parts = [], {}
    for name in names:
        mapped = _rename(name, family)
        if mapped is None:
            continue
        if mapped.startswith(MTP_PREFIX):
            plan.mtp[name] = mapped[len(MTP_PREFIX):]
        elif tie and mapped == "lm_head.weight":
            continue  # tied: the embedding is the head
        elif mapped in expected:
            plan.targets[name] = mapped
        elif family.experts is not None and (match := family.experts.pattern.match(mapped)):
            module, expert, projection = match.group(1), int(match.group(2)), match.group(3)
            leaf, block, blocks = family.experts.stacked[projection]
            stacked = f"{module}.{leaf}"
            if stacked not in expected or expert >= expected[stacked].shape[0]:
                unexpected.append(name)
                continue
            plan.experts[name] = (stacked, expert, block, blocks)
            expert_parts.setdefault(stacked, set()).add((expert, projection))
        else:
            unexpected.append(name)
    if unexpected:
        raise CheckpointError(
            f"{len(unexpected)} tensor(s) in {directory} match nothing in the {type(model).__name__} that "
            f"config.json describes, e.g. {sorted(unexpected)[:5]}; the checkpoint and its config disagree"
        )
    missing = sorted(set(expected) - set(plan.targets.values()) - set(expert_parts)
                     - ({"lm_head.weight"} if tie else set()))
    missing += _missing_experts(family.experts, expert_parts, expected)
    if missing:
        raise CheckpointError(
            f"{len(missing)} tensor(s) that config.json implies are not in {directory}, e.g. {missing[:5]}"
        )
    return plan


def _rename(name: str, family: Family) -> str | None:
    """Checkpoint name -> our naming, or None for tensors we skip (vision tower)."""
    if any(name.startswith(prefix) for prefix in family.skip_prefixes):
        return None
    for source, target in family.prefixes:
        if name.startswith(source):
            return target + name[len(source):]
    return name


def _missing_experts(layout: ExpertLayout | None, parts: dict[str, set], expected: dict) -> list[str]:
    """Per-expert tensors absent for a stacked parameter that the checkpoint fills expert by expert."""
    missing = []
    for stacked, have in parts.items():
        module, _, leaf = stacked.rpartition(".")
        for expert in range(expected[stacked].shape[0]):
            missing += [f"{module}.{expert}.{projection}.weight" for projection in layout.projections_of(leaf)
                        if (expert, projection) not in have]
    return missing


def _is_persistent(model: nn.Module, name: str) -> bool:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    return leaf not in module._non_persistent_buffers_set


def _load(model: HybridCausalLM, family: Family, plan: _Plan, files: list[Path], device: torch.device,
          dtype: torch.dtype) -> None:
    expected = dict(model.named_parameters())
    stacked: dict[str, torch.Tensor] = {}

    def cast(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_floating_point():
            return tensor.to(device)
        keep = any(name.endswith(suffix) for suffix in family.keep_fp32)
        return tensor.to(device=device, dtype=torch.float32 if keep else dtype)

    for name, handle in iter_handles(files, device):
        if name in plan.targets:
            target = plan.targets[name]
            _assign(model, target, cast(target, _read_target(model, name, target, handle)))
        elif name in plan.experts:
            target, expert, block, blocks = plan.experts[name]
            if target not in stacked:
                stacked[target] = torch.empty(expected[target].shape, device=device, dtype=dtype)
            size = stacked[target].shape[1] // blocks
            rows = slice(block * size, (block + 1) * size)
            tensor = _read_expert(model, name, target, block, stacked[target][expert, rows].shape, handle)
            stacked[target][expert, rows] = tensor.to(device=device, dtype=dtype)
        elif name in plan.mtp:
            model.mtp_weights[plan.mtp[name]] = cast(name, handle.get_tensor(name))
    for target, tensor in stacked.items():
        _assign(model, target, tensor)
    if plan.tie_lm_head:
        embedding = getattr(model.model, "embed_tokens", None) or model.model.embeddings
        model.lm_head.weight = embedding.weight


def _read_target(model: nn.Module, name: str, target: str, handle) -> torch.Tensor:
    """Checkpoint tensor `name` for our parameter `target`: whole, or the rank's slice where the parameter is
    sharded (only that slice is read from the file)."""
    return _read(handle, name, _shard_of(model, target), _expected_shape(model, target))


def _read_expert(model: nn.Module, name: str, target: str, block: int, want: torch.Size, handle) -> torch.Tensor:
    """One expert's tensor `name` (block `block` of stacked parameter `target`, e.g. gate_proj of gate_up_proj),
    whole or the rank's slice: the stacked parameter's Shard one dim down, on that block's part alone."""
    shard = _shard_of(model, target)
    if shard is not None:
        shard = Shard(shard.dim - 1, (shard.parts[block],), shard.pieces, shard.index)
    return _read(handle, name, shard, want)


def _shard_of(model: nn.Module, name: str) -> Shard | None:
    module_name, _, leaf = name.rpartition(".")
    return getattr(model.get_submodule(module_name), "tp_shards", {}).get(leaf)


def _read(handle, name: str, shard: Shard | None, want: torch.Size) -> torch.Tensor:
    """Tensor `name` of an open safetensors file, checked against the shape the model wants: whole, or (shard) only
    the rank's slice read."""
    if shard is None:
        tensor = handle.get_tensor(name)
        _check_shape(name, tensor.shape, want)
        return tensor
    lazy = handle.get_slice(name)
    _check_shape(name, torch.Size(lazy.get_shape()), shard.full_shape(tuple(want)))
    return shard.read(lazy)


def _expected_shape(model: nn.Module, name: str) -> torch.Size:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    return getattr(module, leaf).shape


def _check_shape(name: str, got: torch.Size, want: torch.Size) -> None:
    if tuple(got) != tuple(want):
        raise CheckpointError(
            f"tensor {name} has shape {tuple(got)} in the checkpoint but the model built from config.json "
            f"expects {tuple(want)}; the checkpoint and its config disagree"
        )


def _assign(model: nn.Module, name: str, tensor: torch.Tensor) -> None:
    module_name, _, leaf = name.rpartition(".")
    module = model.get_submodule(module_name)
    if leaf in module._parameters:
        module._parameters[leaf] = nn.Parameter(tensor, requires_grad=False)
    else:
        module._buffers[leaf] = tensor
