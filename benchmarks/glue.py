"""Layer glue on the GPU: the fused ops of verify_kernels/glue against the torch glue the models ran before (their
references, naive.py) and, where fla is installed, fla-core's nearest fused modules; per op, then per decoder layer.

    python -m benchmarks.glue --out benchmarks/results/glue_h200.json

Qwen3.5-9B and Nemotron-3-Nano widths, bf16, 1 / 64 / 256 / 512 tokens. bytes_moved counts what the fused op must
read and write, each input once and each output once; fused_x_copy is its rate against a device copy measured in
the same run. CUDA graphs, CUDA events, medians (benchmarks/timing.py); every timed graph cycles through enough input
sets to touch >= 256 MiB (more than the L2). The layer rows chain one decoder layer's glue: before = the torch code
(residual add apart from the norm), after = the fused ops, with the kernels each launches (torch profiler, once).
fla rows are timing only: fla rounds differently (see the kernels' docstrings) and has no zero-centred weight (given
1 + w instead).
"""

from __future__ import annotations

import argparse
import datetime
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch

from benchmarks.timing import copy_bandwidth, time_calls
from specdec.backend import GlueOps, glue_ops
from verify_kernels.fla_support import fla_available

TOKENS = (1, 64, 256, 512)
DEVICE = "cuda"  # tests/test_benchmark_glue.py runs the cases on the CPU
DTYPE = torch.bfloat16
EPS = 1e-6
ROTATION_BYTES = 256 * 2**20
MAX_ROTATIONS = 64
BF16, FP32 = 2, 4

# widths: hidden; GDN (H, K, HV, V); attention (H, HKV, D, R); Mamba2 (NH, P, NG, N); MLP / shared expert; experts
QWEN = dict(hidden=4096, gdn=(16, 128, 32, 128), attention=(16, 4, 256, 64), mlp=12288)
NEMOTRON = dict(hidden=2688, mamba=(64, 64, 8, 128), mlp=3712, experts=(1856, 6))


@dataclass(frozen=True)
class Case:
    """One op at one width: make(tokens) -> a dict of inputs; run(ops, inputs) calls the op; moved(tokens) its bytes;
    fla(inputs) the nearest fla-core path, if any."""

    name: str
    make: Callable[[int], dict]
    run: Callable[[GlueOps, dict], object]
    moved: Callable[[int], int]
    fla: Callable[[dict], object] | None = None


def randn(*shape: int, dtype=DTYPE, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE, dtype=torch.float32).mul_(scale).to(dtype)


# --- the ops, as the models call them ---------------------------------------------------------------------------


def add_norm_case(model: str, hidden: int, offset: bool) -> Case:
    weight = randn(hidden, scale=0.1)

    def fla(t):
        from fla.modules.layernorm import rms_norm
        return rms_norm(t["x"], weight + 1 if offset else weight, None, residual=t["residual"], eps=EPS, prenorm=True)

    return Case(f"{model} add+rms_norm", lambda n: {"x": randn(n, hidden), "residual": randn(n, hidden)},
                lambda ops, t: ops.add_rms_norm(t["x"], t["residual"], weight, EPS, offset),
                lambda n: 4 * n * hidden * BF16, fla)


def gdn_qkv_case(H: int, K: int, HV: int, V: int) -> Case:
    width = 2 * H * K + HV * V

    def fla(t):
        from fla.modules.l2norm import l2norm
        q, k, v = t["qkv"].split([H * K, H * K, HV * V], dim=-1)
        q = l2norm(q.unflatten(-1, (H, K)), output_dtype=torch.float32) * K**-0.5
        return q, l2norm(k.unflatten(-1, (H, K)), output_dtype=torch.float32), v.float()

    return Case("qwen3.5-9b gdn q/k/v", lambda n: {"qkv": randn(n, width)},
                lambda ops, t: ops.gdn_qkv(t["qkv"], H, K, HV, V, K**-0.5), lambda n: n * width * (BF16 + FP32), fla)


def gdn_gates_case(HV: int) -> Case:
    A_log, dt_bias = randn(HV), randn(HV)
    return Case("qwen3.5-9b gdn gates", lambda n: {"a": randn(n, HV), "b": randn(n, HV)},
                lambda ops, t: ops.gdn_gates(t["a"], t["b"], A_log, dt_bias), lambda n: n * HV * 2 * (BF16 + FP32))


def gated_norm_case(model: str, width: int, group: int, norm_before_gate: bool, shared_weight: bool) -> Case:
    weight = randn(group if shared_weight else width)

    def fla(t):
        if norm_before_gate:  # per head: fla's FusedRMSNormGated function on [N HV, V] rows
            from fla.modules.fused_norm_gate import rms_norm_gated
            x, z = t["x"].to(DTYPE).view(-1, group), t["gate"].view(-1, group)
            return rms_norm_gated(x, z, weight, None, activation="swish", eps=EPS)
        from fla.modules.layernorm_gated import rmsnorm_fn
        return rmsnorm_fn(t["x"].to(DTYPE), weight, None, z=t["gate"], eps=EPS, group_size=group,
                          norm_before_gate=False)

    return Case(f"{model} gated norm", lambda n: {"x": randn(n, width, dtype=torch.float32), "gate": randn(n, width)},
                lambda ops, t: ops.rms_norm_gated(t["x"], t["gate"], weight, EPS, group, norm_before_gate),
                lambda n: n * width * (FP32 + 2 * BF16), fla)


def qk_norm_rotary_case(H: int, HKV: int, D: int, R: int) -> Case:
    q_weight, k_weight = randn(D, scale=0.1), randn(D, scale=0.1)

    def make(n):
        angles = torch.rand(1, n, R // 2, device=DEVICE) * 1000.0
        return {"q": randn(1, n, H, 2 * D).chunk(2, dim=-1)[0], "k": randn(1, n, HKV, D),
                "cos": torch.cat((angles.cos(), angles.cos()), dim=-1).to(DTYPE),
                "sin": torch.cat((angles.sin(), angles.sin()), dim=-1).to(DTYPE)}

    return Case("qwen3.5-9b q/k norm+rotary", make,
                lambda ops, t: ops.qk_norm_rotary(t["q"], t["k"], q_weight, k_weight, t["cos"], t["sin"], EPS),
                lambda n: n * ((H + HKV) * D * 2 + 2 * R) * BF16)


def act_mul_case(model: str, what: str, width: int, act: str, heads: int = 1) -> Case:
    def make(n):
        if act == "sigmoid":  # the attention gate: a chunk of q_proj's output, times the attention output
            return {"gate": randn(n, heads, 2 * width).chunk(2, dim=-1)[0], "up": randn(n, heads, width)}
        return {"gate": randn(n, width), "up": randn(n, width)}

    def fla(t):
        from fla.modules.activations import swiglu_fwd
        return swiglu_fwd(t["gate"], t["up"])

    return Case(f"{model} {what}", make, lambda ops, t: ops.act_mul(t["gate"], t["up"], act),
                lambda n: 3 * n * heads * width * BF16, fla if act == "silu" else None)


def relu2_case(model: str, what: str, width: int, per_token: int = 1) -> Case:
    return Case(f"{model} {what}", lambda n: {"x": randn(n * per_token, width)}, lambda ops, t: ops.relu2(t["x"]),
                lambda n: 2 * n * per_token * width * BF16)


def mamba2_inputs_case(NH: int, P: int, NG: int, N: int) -> Case:
    width = NH * P + 2 * NG * N
    vectors = [randn(NH) for _ in range(3)]

    def make(n):  # dt is a split of in_proj's output (gate, xBC, dt)
        return {"xbc": randn(n, width), "dt": randn(n, NH * P + width + NH)[:, -NH:]}

    return Case("nemotron-3-nano mamba2 inputs", make,
                lambda ops, t: ops.mamba2_inputs(t["xbc"], t["dt"], *vectors, NH, P, NG, N, (0.0, float("inf"))),
                lambda n: n * (width + NH) * (BF16 + FP32))


def op_cases() -> list[Case]:
    H, K, HV, V = QWEN["gdn"]
    AH, AKV, AD, AR = QWEN["attention"]
    NH, P, NG, N = NEMOTRON["mamba"]
    experts, top_k = NEMOTRON["experts"]
    return [
        add_norm_case("qwen3.5-9b", QWEN["hidden"], offset=True),
        gdn_qkv_case(H, K, HV, V),
        gdn_gates_case(HV),
        gated_norm_case("qwen3.5-9b", HV * V, V, norm_before_gate=True, shared_weight=True),
        qk_norm_rotary_case(AH, AKV, AD, AR),
        act_mul_case("qwen3.5-9b", "attention gate", AD, "sigmoid", heads=AH),
        act_mul_case("qwen3.5-9b", "mlp silu*up", QWEN["mlp"], "silu"),
        add_norm_case("nemotron-3-nano", NEMOTRON["hidden"], offset=False),
        mamba2_inputs_case(NH, P, NG, N),
        gated_norm_case("nemotron-3-nano", NH * P, NH * P // NG, norm_before_gate=False, shared_weight=False),
        relu2_case("nemotron-3-nano", "shared expert relu2", NEMOTRON["mlp"]),
        relu2_case("nemotron-3-nano", "experts relu2", experts, per_token=top_k),
    ]


# --- whole decoder layers: the glue of one layer, chained ----------------------------------------------------------


def layer_cases() -> list[Case]:
    """One decoder layer's glue each (the mixers and GEMMs left out): the cases' ops in the order a layer runs them,
    each on inputs of its own."""
    cases = {c.name: c for c in op_cases()}

    def chain(name: str, parts: list[str]) -> Case:
        steps = [cases[p] for p in parts]

        def make(n):
            return [step.make(n) for step in steps]

        def run(ops, inputs):
            return [step.run(ops, t) for step, t in zip(steps, inputs, strict=True)]

        return Case(name, make, run, lambda n: sum(step.moved(n) for step in steps))

    return [
        chain("qwen3.5-9b GDN layer glue", ["qwen3.5-9b add+rms_norm", "qwen3.5-9b gdn q/k/v", "qwen3.5-9b gdn gates",
                                            "qwen3.5-9b gated norm", "qwen3.5-9b add+rms_norm",
                                            "qwen3.5-9b mlp silu*up"]),
        chain("qwen3.5-9b attention layer glue", ["qwen3.5-9b add+rms_norm", "qwen3.5-9b q/k norm+rotary",
                                                  "qwen3.5-9b attention gate", "qwen3.5-9b add+rms_norm",
                                                  "qwen3.5-9b mlp silu*up"]),
        chain("nemotron-3-nano Mamba2 block glue", ["nemotron-3-nano add+rms_norm", "nemotron-3-nano mamba2 inputs",
                                                    "nemotron-3-nano gated norm"]),
        chain("nemotron-3-nano MoE block glue", ["nemotron-3-nano add+rms_norm", "nemotron-3-nano shared expert relu2",
                                                 "nemotron-3-nano experts relu2"]),
    ]


# --- timing -------------------------------------------------------------------------------------------------------


def rotations(moved: int) -> int:
    return max(4, min(MAX_ROTATIONS, -(-ROTATION_BYTES // max(moved, 1))))


def time_case(fn: Callable[[dict], object], inputs: list) -> float:
    """Median microseconds per call, the calls cycling through the input sets in one CUDA graph."""
    return time_calls([partial(fn, t) for t in inputs]) * 1e6


def count_kernels(fn: Callable[[], object]) -> int:
    """Kernels one call launches (torch profiler; outside any graph)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA)


def largest_error(case: Case, before: GlueOps, after: GlueOps, tokens: int) -> float:
    """Largest |fused - reference| over the largest |reference|, over the outputs of one call."""
    t = case.make(tokens)
    flat = []
    for out in (case.run(before, t), case.run(after, t)):
        items = out if isinstance(out, (tuple, list)) else [out]
        flat.append([x for item in items for x in (item if isinstance(item, (tuple, list)) else [item])])
    return max(((a.float() - b.float()).abs().max() / b.float().abs().max().clamp(min=1e-30)).item()
               for a, b in zip(flat[1], flat[0], strict=True))


def case_row(case: Case, tokens: int, copy_bw: float, before: GlueOps, after: GlueOps, with_fla: bool,
             kernels: bool) -> dict:
    moved = case.moved(tokens)
    inputs = [case.make(tokens) for _ in range(rotations(moved))]
    row = {"case": case.name, "tokens": tokens, "bytes_moved": moved, "rotations": len(inputs)}
    row["torch_us"] = time_case(partial(case.run, before), inputs)
    row["fused_us"] = time_case(partial(case.run, after), inputs)
    row["speedup"] = row["torch_us"] / row["fused_us"]
    row["fused_x_copy"] = moved / (row["fused_us"] * 1e-6) / copy_bw
    row["copy_bound_us"] = moved / copy_bw * 1e6
    if with_fla and case.fla is not None:
        try:
            row["fla_us"] = time_case(case.fla, inputs)
        except Exception as error:  # an fla release without this function or signature: say so, keep going
            row["fla_error"] = f"{type(error).__name__}: {error}"[:200]
    if kernels:
        row["torch_kernels"] = count_kernels(partial(case.run, before, inputs[0]))
        row["fused_kernels"] = count_kernels(partial(case.run, after, inputs[0]))
    del inputs
    return row


HEADER = (f"{'case':36} {'tokens':>6} {'MB':>7} {'torch us':>9} {'fused us':>9} {'x':>6} {'x copy':>6} "
          f"{'bound us':>8} {'fla us':>7} {'kernels':>9}")


def _line(row: dict) -> str:
    fla = f"{row['fla_us']:>7.1f}" if "fla_us" in row else f"{'-':>7}"
    kernels = f"{row['torch_kernels']:>4}>{row['fused_kernels']:<4}" if "torch_kernels" in row else f"{'':9}"
    return (f"{row['case']:36} {row['tokens']:>6} {row['bytes_moved'] / 1e6:>7.2f} {row['torch_us']:>9.1f} "
            f"{row['fused_us']:>9.1f} {row['speedup']:>6.2f} {row['fused_x_copy']:>6.2f} {row['copy_bound_us']:>8.1f} "
            f"{fla} {kernels}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    parser.add_argument("--no-fla", action="store_true", help="leave out the fla-core rows")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("the glue benchmark needs a CUDA GPU")
    torch.manual_seed(0)
    before, after = glue_ops("reference"), glue_ops("triton")
    with_fla = fla_available() and not args.no_fla
    print(f"device: {torch.cuda.get_device_name()}; fla: {'yes' if with_fla else 'no'}", flush=True)
    copy_bw = copy_bandwidth()
    cases, layers = op_cases(), layer_cases()
    checks = {case.name: largest_error(case, before, after, 256) for case in cases}
    for name, error in checks.items():
        print(f"check {name}: largest error / largest output {error:.2e}", flush=True)
    print(f"device copy: {copy_bw / 1e12:.2f} TB/s\n{HEADER}", flush=True)
    rows = []
    with torch.no_grad():
        for group, fla in ((cases, with_fla), (layers, False)):
            for case in group:
                for tokens in TOKENS:
                    rows.append(case_row(case, tokens, copy_bw, before, after, fla, kernels=tokens == 256))
                    print(_line(rows[-1]), flush=True)
                torch.cuda.empty_cache()
    if args.out is not None:
        result = {"command": "python -m benchmarks.glue" + (" --no-fla" if args.no_fla else ""),
                  "date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name(),
                  "software": {"torch": torch.__version__, "triton": __import__("triton").__version__},
                  "copy_tbps": copy_bw / 1e12, "checks": checks, "rows": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
