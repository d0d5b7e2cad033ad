"""The `mtp.*` tensors of a Qwen3.5 checkpoint directory: read them, or (re)write them in a shard of their own
listed in the shard index, and mark config.json (mtp_num_hidden_layers), without going through transformers
(which drops `mtp.*` on load and save)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

INDEX = "model.safetensors.index.json"
MTP_SHARD = "model-mtp.safetensors"


def read_mtp_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """name (with the mtp. prefix) -> tensor."""
    tensors = {}
    for file in sorted(Path(directory).glob("*.safetensors")):
        with safe_open(file, framework="pt") as handle:
            tensors.update({n: handle.get_tensor(n) for n in handle.keys() if n.startswith("mtp.")})
    return tensors


def write_mtp_tensors(directory: Path, layer: dict[str, torch.Tensor], config_fields: dict) -> None:
    """Replace the checkpoint's mtp.* tensors by `layer` (names without the prefix), cast to the dtype of the
    checkpoint's other tensors (Nemotron's e_score_correction_bias stays fp32, as its checkpoints hold it), and
    write `config_fields` (the family's MTP fields) into config.json; a single-file checkpoint becomes a sharded
    one with an index."""
    directory = Path(directory)
    index_file = directory / INDEX
    if index_file.is_file():
        weight_map = json.loads(index_file.read_text())["weight_map"]
    else:
        files = sorted(directory.glob("*.safetensors"))
        weight_map = {}
        for file in files:
            with safe_open(file, framework="pt") as handle:
                weight_map.update({name: file.name for name in handle.keys()})
    keep = {name: file for name, file in weight_map.items() if not name.startswith("mtp.")}
    for file in set(weight_map.values()) - set(keep.values()):  # shards that held mtp tensors only
        (directory / file).unlink(missing_ok=True)
    dtype = None
    for file in sorted(set(keep.values())):  # drop mtp tensors kept beside others
        with safe_open(directory / file, framework="pt") as handle:
            names = list(handle.keys())
            dtype = dtype or handle.get_tensor(names[0]).dtype
            if any(n.startswith("mtp.") for n in names):
                kept = {n: handle.get_tensor(n) for n in names if not n.startswith("mtp.")}
            else:
                continue
        save_file(kept, directory / file, metadata={"format": "pt"})
    tensors = {f"mtp.{name}": t.detach().to(t.dtype if name.endswith("e_score_correction_bias") else dtype or t.dtype)
               .cpu().contiguous() for name, t in layer.items()}
    save_file(tensors, directory / MTP_SHARD, metadata={"format": "pt"})
    keep.update({name: MTP_SHARD for name in tensors})
    index_file.write_text(json.dumps({"metadata": {}, "weight_map": dict(sorted(keep.items()))}, indent=1))
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text())
    config.update(config_fields)
    config_file.write_text(json.dumps(config, indent=2))
