"""A target's `mtp.*` tensors (model.mtp_weights, names without the prefix) into an MTP model: per-expert tensors
stacked as our MoE blocks hold them, then every name and shape checked before loading. Shared by Qwen3.5's and
Nemotron-3's MTP layers (specdec/models/mtp.py, nemotron_mtp.py)."""

from __future__ import annotations

import re

import torch
from torch import nn


class MissingMtpError(ValueError):
    pass


def require_mtp(target) -> dict[str, torch.Tensor]:
    if not target.mtp_weights:
        raise MissingMtpError("the target checkpoint has no mtp.* tensors (no multi-token-prediction layer): "
                              "use --draft small or --draft ngram, or a checkpoint trained with its MTP layer")
    return target.mtp_weights


def stack_experts(weights: dict[str, torch.Tensor], pattern: re.Pattern,
                  stacked: dict[str, tuple[str, ...]]) -> dict[str, torch.Tensor]:
    """Checkpoints may store experts one tensor per expert and projection; `pattern` matches those names as
    (experts module, expert index, projection) and `stacked` says which projections, concatenated in order, make
    each of our stacked tensors [E, ...]. Other weights (stacked ones included) pass through."""
    out, parts = {}, {}
    for name, tensor in weights.items():
        match = pattern.match(name)
        if match is None:
            out[name] = tensor
        else:
            parts.setdefault(match.group(1), {})[int(match.group(2)), match.group(3)] = tensor
    projections = [p for group in stacked.values() for p in group]
    for module, have in parts.items():
        count = max(expert for expert, _ in have) + 1
        missing = [f"mtp.{module}.{e}.{p}.weight" for e in range(count) for p in projections if (e, p) not in have]
        if missing:
            raise ValueError(f"the checkpoint's MTP experts are incomplete: {len(missing)} tensors missing, e.g. "
                             f"{missing[:3]}")
        for leaf, group in stacked.items():
            out[f"{module}.{leaf}"] = torch.stack([torch.cat([have[e, p] for p in group]) for e in range(count)])
    return out


def load_checked(module: nn.Module, weights: dict[str, torch.Tensor], what: str) -> None:
    """Load `weights` into `module` if they are exactly its tensors, else a ValueError naming what differs."""
    expected = module.state_dict()
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ValueError(f"the checkpoint's mtp.* tensors do not form {what}: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    for name, tensor in weights.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"mtp.{name} has shape {tuple(tensor.shape)}, expected {tuple(expected[name].shape)} "
                             "for this target")
    module.load_state_dict(weights)
