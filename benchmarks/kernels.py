"""KVBuffer kernels on the GPU against the recurrent and intermediate-state kernels of today's engines.

    python -m benchmarks.kernels --sglang-wheel PATH/sglang-*.whl --out benchmarks/results/kernels_h200.json
    python -m benchmarks.report benchmarks/results/kernels_h200.json   # regenerates the table in BENCHMARKS.md

Checks the kernels against the torch references at full size first, then times (CUDA graphs, CUDA events,
medians, inputs rotated over >= 2 GiB, a device copy as the bandwidth ceiling, every baseline in the same run):
- GDN decode at Qwen3.5-9B shapes, amortised over L steps including the flush, vs fla (and SGLang) recurrent;
- GDN verify of a 4-chain, an 8-node and a 16-node tree vs SGLang's intermediate-state verify;
- Mamba2 decode at Nemotron-3-Nano shapes vs SGLang's selective_state_update;
- Mamba2 verify of a 5-chain and a 16-node tree vs the intermediate-state kernel (and SGLang's, when the wheel has it);
- the GDN fold on its own (a flush) and commits that fold no, some and every row.
Every row carries the bytes its op must move, so the report puts each figure against its bound at the copy bandwidth.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
from pathlib import Path

import torch

from benchmarks import checks, gdn, kernel_settings, mamba2
from benchmarks.baselines import carried_sglang_wheel, fla_recurrent_gdn, sglang_kernels
from benchmarks.timing import copy_bandwidth

DECODE_BATCHES = (1, 16, 64, 128, 256, 512)
VERIFY_BATCHES = (1, 16, 64, 128, 256)
FLUSH_LENGTHS = (8, 16, 32)
TREES = ("chain4", "chain5", "tree8", "tree16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sglang-wheel", type=Path, default=carried_sglang_wheel(),
                        help="an sglang wheel (or its kernels' subset: baselines.write_subset) to take baselines from "
                        "(default: the one a device call carries in .whl/, if any)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/kernels_h200.json"))
    parser.add_argument("--quick", action="store_true", help="batches 1 and 128 only (a smoke run)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the kernel benchmark needs a CUDA GPU")
    torch.manual_seed(0)
    decode_batches = (1, 128) if args.quick else DECODE_BATCHES
    verify_batches = (1, 128) if args.quick else VERIFY_BATCHES

    fla, fla_note = fla_recurrent_gdn()
    sglang_gdn, sglang_ssu, sglang_note = sglang_kernels(args.sglang_wheel)
    print(f"device: {torch.cuda.get_device_name()}; baselines: {fla_note}; {sglang_note}", flush=True)
    errors = checks.run_all()
    for name, error in errors.items():
        print(f"check {name}: max relative error {error:.2e}", flush=True)
    copy_bw = copy_bandwidth()
    print(f"device copy: {copy_bw / 1e12:.2f} TB/s", flush=True)

    rows = gdn.decode_rows(decode_batches, FLUSH_LENGTHS, fla, sglang_gdn, copy_bw)
    rows += gdn.verify_rows(verify_batches, TREES, sglang_gdn)
    rows += gdn.fold_rows(decode_batches)
    rows += mamba2.decode_rows(decode_batches, (16,), sglang_ssu)
    rows += mamba2.verify_rows(decode_batches, sglang_ssu)
    rows += mamba2.commit_rows(decode_batches)
    result = {
        "command": "python -m benchmarks.kernels" + (" --quick" if args.quick else "")
                   + (" --sglang-wheel " + args.sglang_wheel.name if args.sglang_wheel else ""),
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "software": {"torch": torch.__version__, "triton": _version("triton"), "fla": fla_note,
                     "sglang": sglang_note, "python": platform.python_version()},
        "copy_tbps": copy_bw / 1e12,
        "kernel_settings": kernel_settings.applied(),
        "checks": errors,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    from benchmarks.report import summary_lines

    print("\n".join(summary_lines(result)))


def _version(package: str) -> str:
    try:
        return __import__(package).__version__
    except ImportError:
        return "absent"


if __name__ == "__main__":
    main()
