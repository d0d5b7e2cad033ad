"""benchmarks/glue.py's cases on the CPU (Triton's interpreter, 2 tokens): every op and layer case runs on both op
sets, the fused ops agree with the references, and each case counts bytes, so a GPU run does not fail on plumbing.
(bf16: the interpreter rounds toward zero, hence the tolerance; tests/test_glue_kernels.py checks the rounding.)"""

import pytest

import benchmarks.glue as glue_bench


@pytest.fixture
def on_cpu(monkeypatch):
    monkeypatch.setattr(glue_bench, "DEVICE", "cpu")


@pytest.mark.usefixtures("on_cpu")
def test_every_case_runs_and_agrees():
    before, after = glue_bench.glue_ops("reference"), glue_bench.glue_ops("triton")
    cases = glue_bench.op_cases() + glue_bench.layer_cases()
    assert len({case.name for case in cases}) == len(cases)
    for case in cases:
        assert glue_bench.largest_error(case, before, after, 2) < 3e-2, case.name
        assert case.moved(2) == 2 * case.moved(1) > 0, case.name
