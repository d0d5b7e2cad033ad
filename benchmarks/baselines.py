"""The engines' kernels we measure against, loaded from their published packages (never copied into specdec).

- fla-core (`pip install fla-core`, our `bench` extra): `fused_recurrent_gated_delta_rule`, the recurrent GDN
  decode that reads and writes each request's state every token.
- SGLang's wheel: `fused_sigmoid_gating_delta_rule_update` (GDN decode, and verify with an intermediate-state
  buffer: one state written per draft token) and `selective_state_update` (Mamba2, the same two modes). Importing
  sglang as a package pulls in its whole server; these two files need only a couple of environment probes, so we
  read them straight out of the wheel and give them those probes.
"""

from __future__ import annotations

import importlib.util
import io
import sys
import tarfile
import types
import zipfile
from pathlib import Path

import torch

# where each kernel file sits in a wheel: 0.5.2x's layout, then 0.5.1x's (the newest on PyPI reachable here, 2026-12)
SGLANG_GDN = ("sglang/kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py",
              "sglang/srt/layers/attention/fla/fused_sigmoid_gating_recurrent.py")
SGLANG_SSU = ("sglang/kernels/ops/mamba/triton_ops/mamba_ssm.py",
              "sglang/srt/layers/attention/mamba/ops/mamba_ssm.py")
# fla-core's op packages the benchmarks use (gated_delta_rule) and those it imports; its modules (the glue
# benchmark's norms) and utils stay whole
FLA_OPS_KEPT = ("gated_delta_rule", "utils", "common", "cp")
FLA_OPS_INIT = ("# specdec's trimmed copy for its GPU benchmarks: the gated delta rule's ops alone\n"
                "from .gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule\n")


def fla_recurrent_gdn():
    """fla's fused_recurrent_gated_delta_rule, or None with the reason when fla is not installed."""
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    except ImportError as error:
        return None, f"fla-core not importable ({error}); install the bench extra"
    return fused_recurrent_gated_delta_rule, "fla-core"


def _install_sglang_probes() -> None:
    """The few sglang helpers the two kernel files import, answered for this machine (NVIDIA, no PDL)."""
    major, minor = torch.cuda.get_device_capability()
    probes = {
        "sglang.kernels.jit.utils": {"is_arch_support_pdl": lambda: False},
        "sglang.srt.utils": {
            "get_device_sm": lambda: major * 10 + minor,
            "is_cuda": lambda: True,
            "is_hip": lambda: False,
            "is_gfx95_supported": lambda: False,
            "is_sm90_supported": lambda: (major, minor) == (9, 0),
        },
    }
    for name in ("sglang", "sglang.kernels", "sglang.kernels.jit", "sglang.srt"):
        sys.modules.setdefault(name, types.ModuleType(name))
    for name, attributes in probes.items():
        module = sys.modules.setdefault(name, types.ModuleType(name))
        for attribute, value in attributes.items():
            setattr(module, attribute, value)


def _inner_path(archive: zipfile.ZipFile, candidates: tuple[str, ...]) -> str:
    """The first of a kernel file's known places that the wheel (or subset) holds."""
    names = set(archive.namelist())
    found = next((path for path in candidates if path in names), None)
    if found is None:
        raise FileNotFoundError(f"none of {', '.join(candidates)} in {archive.filename}")
    return found


def _module_from_wheel(wheel: Path, candidates: tuple[str, ...], name: str) -> types.ModuleType:
    with zipfile.ZipFile(wheel) as archive:
        inner_path = _inner_path(archive, candidates)
        source = archive.read(inner_path).decode()
    # Triton's JIT reads kernel source through `inspect`, so the code needs a real file behind it.
    target = Path("/tmp/specdec_baselines") / inner_path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source)
    spec = importlib.util.spec_from_file_location(name, target)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def carried_sglang_wheel(folder: Path = Path(".whl")) -> Path | None:
    """The sglang wheel or kernels' subset that a device call carries (benchmarks/device_call.sh: .whl/), or None:
    the kernel table's SGLang columns come from it, so a run that forgets --sglang-wheel still fills them."""
    found = sorted(folder.glob("sglang*.whl")) + sorted(folder.glob("sglang*.zip"))
    return found[0] if found else None


def sglang_kernels(wheel: Path | None):
    """(gdn_update, selective_state_update, note) from an sglang wheel; (None, None, reason) when unavailable."""
    if wheel is None or not Path(wheel).is_file():
        return None, None, f"no sglang wheel at {wheel}"
    try:
        _install_sglang_probes()
        gdn = _module_from_wheel(Path(wheel), SGLANG_GDN, "sglang_gdn_recurrent")
        ssu = _module_from_wheel(Path(wheel), SGLANG_SSU, "sglang_mamba_ssm")
    except Exception as error:  # a newer wheel with other imports: report it, measure the rest
        return None, None, f"sglang kernels not loadable from {Path(wheel).name}: {type(error).__name__}: {error}"
    return gdn.fused_sigmoid_gating_delta_rule_update, ssu.selective_state_update, Path(wheel).name


def write_subset(wheel: Path, out: Path) -> None:
    """The two kernel files of an sglang wheel (6 MB) in a zip of their own (~50 KB), at the same inner paths, to
    carry to a GPU machine whose working tree has a size limit; sglang_kernels reads either."""
    with zipfile.ZipFile(wheel) as archive, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as subset:
        for candidates in (SGLANG_GDN, SGLANG_SSU):
            inner_path = _inner_path(archive, candidates)
            subset.writestr(inner_path, archive.read(inner_path))


def write_fla_subset(wheel: Path, out: Path) -> None:
    """fla-core's wheel (1 MB zipped, 5 MB unpacked) trimmed to what the benchmarks import (FLA_OPS_KEPT, modules,
    utils; its metadata and licence), its ops package's __init__ importing those alone, as a .tar.xz of ~170 KB that
    benchmarks/device_call.sh unpacks onto the steps' PYTHONPATH (the working tree a GPU call carries is limited to
    64 MiB, and the tracked tree is most of it)."""
    with zipfile.ZipFile(wheel) as archive, tarfile.open(out, "w:xz") as subset:
        for member in archive.infolist():
            parts = member.filename.split("/")
            # (its dist-info stays, with the MIT licence; its RECORD would list the files dropped)
            if member.is_dir() or not (parts[0] == "fla" or parts[0].endswith(".dist-info")) or parts[-1] == "RECORD":
                continue
            data = archive.read(member)
            if parts[:2] == ["fla", "ops"] and len(parts) > 3 and parts[2] not in FLA_OPS_KEPT:
                continue
            if parts == ["fla", "ops", "__init__.py"]:
                data = FLA_OPS_INIT.encode()
            info = tarfile.TarInfo(member.filename)
            info.size = len(data)
            subset.addfile(info, io.BytesIO(data))


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="write the subset of an sglang wheel (OUT.zip) or of fla-core's "
                                                 "(OUT.tar.xz) that the GPU benchmarks read: python -m "
                                                 "benchmarks.baselines WHEEL OUT")
    parser.add_argument("wheel", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args()
    (write_fla_subset if args.wheel.name.startswith("fla_core") else write_subset)(args.wheel, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
