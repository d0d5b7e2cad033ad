"""specdec/models/expert_traffic.py: the distinct experts a model's MoE layers read, counted on the device, equal
those its routers chose; the roofline scales its expert reads by measured / uniform; `specdec bench` reports the
factor for a MoE target and none for a dense one, and lets go of an engine's model (its counters included) before it
builds the next."""

from __future__ import annotations

import pytest
import torch

from specdec.api import LLM
from specdec.engine.engine import EngineConfig
from specdec.eval.bench import BenchSettings, markdown_table, run_bench
from specdec.eval.peaks import Peaks
from specdec.eval.roofline import Workload, roofline
from specdec.models.expert_traffic import ExpertTraffic
from specdec.models.random_checkpoint import random_target
from specdec.models.real_shapes import nemotron3_nano
from tests.tiny_models import nemotron_h_config, qwen35_text_config

CONFIGS = {"qwen3.5-moe": lambda: qwen35_text_config(moe=True), "nemotron-h": nemotron_h_config}
PEAKS = Peaks(20e9, 0.5e12, "given")


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_the_counts_are_the_experts_the_routers_chose(family, tmp_path):
    random_target(CONFIGS[family](), tmp_path, seed=3)
    llm = LLM(str(tmp_path), device="cpu", config=EngineConfig.from_flags(max_batch=2, max_seq_len=64))
    chosen = []  # each router call's top_index [N, k]
    routers = [m.gate for m in llm.model.modules() if hasattr(m, "gate") and hasattr(m, "experts")]
    hooks = [r.register_forward_hook(lambda _, __, out: chosen.append(out[0])) for r in routers]
    traffic = ExpertTraffic(llm.model)
    assert traffic.any and len(traffic.experts) == len(routers)
    llm.generate([[3, 4, 5, 6], [7, 8]], max_new_tokens=5)
    for hook in hooks:
        hook.remove()
    assert traffic.read() == (sum(index.unique().numel() for index in chosen), len(chosen))
    traffic.reset()
    assert traffic.read() == (0, 0)
    traffic.detach()
    llm.generate([[3, 4]], max_new_tokens=2)
    assert traffic.read() == (0, 0)


def test_a_dense_model_has_nothing_to_count(tmp_path):
    random_target(qwen35_text_config(), tmp_path, seed=3)
    llm = LLM(str(tmp_path), device="cpu", config=EngineConfig.from_flags(max_batch=1, max_seq_len=32))
    assert not ExpertTraffic(llm.model).any


def test_the_roofline_scales_the_expert_reads_by_the_measured_factor():
    config = nemotron3_nano(layers=4)

    def experts_ms(factor: float, batch: int) -> float:
        ops = roofline(config, Workload(batch=batch, expert_factor=factor), PEAKS).ops
        return sum(op.seconds(PEAKS) for op in ops if op.part == "MoE experts")

    # batch 4, 6 of 128 experts per token: ~23 experts touched, their weight bytes dominate the part
    assert experts_ms(0.5, 4) == pytest.approx(0.5 * experts_ms(1.0, 4), rel=0.05)
    # a factor above 1 cannot read more experts than there are (batch 256 touches all 128 already)
    assert experts_ms(2.0, 256) == pytest.approx(experts_ms(1.0, 256), rel=1e-3)


def test_bench_reports_the_factor_for_a_moe_target(tmp_path):
    random_target(CONFIGS["nemotron-h"](), tmp_path, seed=5)
    settings = BenchSettings(target=str(tmp_path), batch_sizes=(2,), max_new_tokens=6, prompt_tokens=8,
                             device="cpu", dtype="fp32", peak_copy_gbs=20, peak_gemm_tflops=0.5)
    (row,) = run_bench(settings, PEAKS)
    assert row.experts_vs_uniform is not None and 0 < row.experts_vs_uniform <= 4 / 2.7  # <= E / uniform(2 tokens)
    assert "experts read / uniform routing" in markdown_table([row], 1.0)
    dense = tmp_path / "dense"
    random_target(qwen35_text_config(), dense, seed=5)
    (row,) = run_bench(BenchSettings(**{**settings.__dict__, "target": str(dense)}), PEAKS)
    assert row.experts_vs_uniform is None and "experts read" not in markdown_table([row], 1.0)


def test_counting_needs_no_host_sync():
    """The count is device ops only (captured in CUDA graphs): no .item(), no data-dependent shape."""
    from specdec.models.expert_traffic import count_touched

    counts = torch.zeros(2, dtype=torch.long)
    count_touched(counts, torch.tensor([[0, 3], [3, 1], [0, 1]]), 8)
    count_touched(counts, torch.tensor([[5, 5]]), 8)
    assert counts.tolist() == [3 + 1, 2]


def test_the_study_section_says_the_measured_factor():
    from benchmarks.study_report import experts_line

    rows = [{"backend": "kvbuffer", "mode": "plain", "batch_size": 64, "experts_vs_uniform": 0.62},
            {"backend": "recurrent", "mode": "plain", "batch_size": 64, "experts_vs_uniform": 0.6}]
    assert "kvbuffer plain 64: 0.62; recurrent plain 64: 0.60" in experts_line({"rows": rows})
    assert experts_line({"rows": [{"backend": "kvbuffer", "mode": "plain", "batch_size": 1}]}) == ""


def test_bench_frees_each_engine_before_it_builds_the_next(tmp_path, monkeypatch):
    """The counters hold a MoE model's expert layers: kept past an engine's run, they held the KVBuffer engine's
    experts in memory while the baseline's engine was built (on the H200 at Nemotron-3-Nano shapes, tens of GiB)."""
    import gc
    import weakref

    import specdec.eval.bench as bench

    random_target(nemotron_h_config(), tmp_path, seed=3)
    alive, built, load_llm = [], [], bench.load_llm

    def load_after_the_last_is_gone(*args):
        gc.collect()
        alive.append([module() is not None for module in built])
        llm = load_llm(*args)
        built.append(weakref.ref(ExpertTraffic(llm.model).experts[0]))  # a MoE layer of this engine's model
        return llm

    monkeypatch.setattr(bench, "load_llm", load_after_the_last_is_gone)
    rows = run_bench(BenchSettings(target=str(tmp_path), batch_sizes=(1,), baseline=True, max_new_tokens=4,
                                   prompt_tokens=8, device="cpu"), PEAKS)
    assert len(rows) == 2 and rows[0].experts_vs_uniform is not None
    assert alive == [[], [False]]  # the second engine was built with the first one's experts freed


def test_the_step_profile_scales_its_expert_reads_as_the_bench_does(tmp_path):
    """benchmarks/profile_step's roofline by op: a MoE model's expert reads scaled by the counted experts / uniform
    routing's, the rest unchanged (it had read uniform routing's: Nemotron-3-Nano speculative batch 128 on the H200,
    17.5 ms against the study's 13.9 for the same steps)."""
    from benchmarks.profile_step import roofline_by_op
    from specdec.eval.bench import bench_prompts, experts_vs_uniform, load_llm, step_workloads, warm_up_and_prefill

    random_target(nemotron_h_config(), tmp_path, seed=5)
    settings = BenchSettings(target=str(tmp_path), batch_sizes=(3,), max_new_tokens=6, prompt_tokens=8,
                             device="cpu", dtype="fp32")
    llm = load_llm(settings, "kvbuffer", "plain")
    traffic = ExpertTraffic(llm.model)
    requests = warm_up_and_prefill(llm, bench_prompts(llm, settings, 3), 3, settings)
    traffic.reset()
    llm.engine.run()
    steps = max(r.stats.steps for r in requests)
    peaks = Peaks(20e9, 1e18, "given")  # the expert ops bound by their bytes alone: their FLOPs do not scale
    counted = roofline_by_op(llm, requests, settings, "kvbuffer", 8, peaks, steps, traffic)
    work = step_workloads(requests, llm, settings, "kvbuffer", 8)
    assert counted[1] == experts_vs_uniform(traffic, llm.model.hf_config, work)
    uniform, no_factor = roofline_by_op(llm, requests, settings, "kvbuffer", 8, peaks, steps)
    assert no_factor is None
    distinct, calls = traffic.read()
    scaled = []  # the roofline at the counted factor / 2 and / 4 (each call's distinct experts halved, then again)
    for divide in (2, 4):
        traffic.counts.copy_(torch.tensor([distinct, divide * calls]))
        ops, factor = roofline_by_op(llm, requests, settings, "kvbuffer", 8, peaks, steps, traffic)
        assert factor == pytest.approx(counted[1] / divide)
        scaled.append(ops)
    half, quarter = scaled
    moe = [name for name in uniform if name.startswith("MoE experts")]
    assert moe and all(half[name] == uniform[name] for name in uniform if name not in moe)
    for name in moe:  # weight bytes linear in the factor (plus the tokens' activations, which are not)
        assert quarter[name] < half[name] < counted[0][name]
        assert counted[0][name] - half[name] == pytest.approx(2 * (half[name] - quarter[name]))
