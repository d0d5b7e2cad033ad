"""The roofline model (specdec/eval/roofline.py) against small cases computed by hand, op by op; its reading of the
real configs against the models they build; and where it puts Qwen3.5-9B against the issue's rough figures."""

from __future__ import annotations

import pytest
import torch
from transformers import NemotronHConfig, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

from specdec.eval.peaks import Peaks, measure_peaks
from specdec.eval.roofline import Workload, expected_experts, roofline, run_roofline, weight_elements

# ms = bytes: 1 kB/s and a GEMM peak no op reaches; ms = FLOPs: the other way round
BYTES = Peaks(1e3, 1e30, "test: time is bytes")
FLOPS = Peaks(1e30, 1e3, "test: time is FLOPs")


def tiny_qwen(moe: bool = False):
    """Hidden 8; one Gated DeltaNet layer (1 key head, 2 value heads of 2, conv 4) and one gated attention layer
    (2 heads, 1 KV head of 4); an MLP of 16 (or 4 experts of 4, 2 active, and a shared expert of 6); vocabulary 10."""
    fields = dict(vocab_size=10, hidden_size=8, num_hidden_layers=2,
                  layer_types=["linear_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
                  head_dim=4, linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=2,
                  linear_value_head_dim=2, linear_conv_kernel_dim=4)
    if moe:
        return Qwen3_5MoeTextConfig(**fields, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=4,
                                    shared_expert_intermediate_size=6)
    return Qwen3_5TextConfig(**fields, intermediate_size=16)


PLAIN = dict(batch=2, nodes=1, accepted=1.0, flush_length=4, context=6, dtype_bytes=2)
SPEC = dict(batch=2, nodes=3, accepted=2.0, flush_length=4, context=6, dtype_bytes=2)


def parts(config, backend: str, peaks: Peaks = BYTES, **work) -> dict[str, float]:
    return {part: pytest.approx(ms) for part, ms in roofline(config, Workload(backend=backend, **work),
                                                              peaks).ms_by_part().items()}


def test_tiny_dense_plain_bytes_by_hand():
    # N = 2 tokens; a GEMM moves its weight (bf16) and N rows in and out
    # GDN: qkv 8->8: 128 + 64; z 8->4: 64 + 48; b, a 8->2: 32 + 40 each; out 4->8: 64 + 48          = 560
    # attention: q 8->16 (query and gate): 256 + 96; k, v 8->4: 64 + 48 each; o 8->8: 128 + 64        = 768
    # MLP per layer: gate, up 8->16 and down 16->8: (256 + 96) each, two layers                       = 2112
    weights = 560 + 768 + 2112
    # state: 2 heads x 2 x 2 fp32 = 32 B; entry: key 2 + value 4 + decay 2 = 8 fp32 = 32 B; L = 4; a = 1
    # S0 read 2 x 32; buffer 2 rows x (4 - 1) / 2 entries x 32; one entry written per row 2 x 32;
    # fold: 2 x 1/4 rows x (32 read + 32 written + 4 entries x 32)
    kvbuffer_state = 64 + 96 + 64 + 96
    # conv: 2 rows x 3 window columns x conv_dim 8 x bf16, read and written
    conv = 2 * 2 * 3 * 8 * 2
    # KV: K and V of one token 2 x 4 x bf16 = 16 B; 2 rows x 6 context tokens read, 2 nodes written
    kv = 2 * 6 * 16 + 2 * 16
    # LM head 8->10: 160 + 72; logits read once 2 x 10 x bf16
    lm_head = 160 + 72 + 40
    embedding = 2 * 2 * 8 * 2
    expected = {"weights": weights, "linear state": kvbuffer_state, "conv": conv, "attention KV": kv,
                "LM head": lm_head, "embedding": embedding}
    assert parts(tiny_qwen(), "kvbuffer", **PLAIN) == expected
    # the baseline decodes in place: the state read and written, 2 rows x 2 x 32
    assert parts(tiny_qwen(), "recurrent", **PLAIN) == {**expected, "linear state": 128}
    assert roofline(tiny_qwen(), Workload(**PLAIN), BYTES).ms_per_step == pytest.approx(4512)


def test_tiny_dense_speculative_bytes_by_hand():
    # N = 6 tokens (2 rows x 3 nodes), 2 kept per row
    # GDN: 128 + 192, 64 + 144, 2 x (32 + 120), 64 + 144 = 1040; attention: 256 + 288, 2 x (64 + 144), 128 + 192
    # = 1280; MLPs: 2 layers x 3 x (256 + 288) = 3264
    weights = 1040 + 1280 + 3264
    # KVBuffer: S0 read 64; buffer 2 rows x (4 - 2) / 2 entries x 32 = 64; entries: 6 nodes written (192), the
    # 4 kept gathered into the buffer, read and written (256); fold: 2 x 2/4 rows x (64 + 4 x 32) = 192
    kvbuffer_state = 64 + 64 + 192 + 256 + 192
    # intermediate states: S read (64), one state per node written (6 x 32), the kept one copied back (2 x 2 x 32)
    intermediate = 64 + 192 + 128
    # KV: context read 2 x 6 x 16, 6 nodes written x 16, 4 kept moved (read + written) 2 x 4 x 16
    kv = 192 + 96 + 128
    lm_head = 160 + 6 * 18 * 2 + 6 * 10 * 2
    expected = {"weights": weights, "linear state": kvbuffer_state, "conv": 192, "attention KV": kv,
                "LM head": lm_head, "embedding": 2 * 6 * 8 * 2}
    assert parts(tiny_qwen(), "kvbuffer", **SPEC) == expected
    assert parts(tiny_qwen(), "recurrent", **SPEC) == {**expected, "linear state": intermediate}


def test_tiny_dense_flops_by_hand():
    # GEMM weights per token: GDN 64 + 32 + 16 + 16 + 32, attention 128 + 32 + 32 + 64, MLPs 2 x 3 x 128 = 1184;
    # 2 FLOPs each for N = 2 tokens
    # state: S0 products 2 rows x 4 x 8 elements x 1 node; fold 2 x 1/4 rows x 2 x 4 entries x 8 elements
    # attention: 4 x 2 rows x 1 node x 2 heads x 4 x (6 + 1) keys; LM head 2 x 2 x 8 x 10
    expected = {"weights": 4 * 1184, "linear state": 64 + 32, "conv": 0, "attention KV": 448, "LM head": 320,
                "embedding": 0}
    assert parts(tiny_qwen(), "kvbuffer", FLOPS, **PLAIN) == expected


def test_tiny_moe_by_hand():
    # 2 tokens routed to 2 of 4 experts touch 4 (1 - (1 - 2/4)^2) = 3 experts in expectation
    assert expected_experts(4, 2, 2) == pytest.approx(3.0)
    assert expected_experts(128, 6, 10**6) == pytest.approx(128.0)  # enough tokens touch every expert
    # experts: gate_up 8->8 (2 x 4): 3 x 64 x bf16 + 2 tokens x 2 experts x (8 + 8) x bf16; down 4->8: 3 x 32 x 2
    # + 2 x 2 x (4 + 8) x 2
    experts = (384 + 128) + (192 + 96)
    # per MoE layer: router 8->4: 64 + 48; shared expert gate, up 8->6: 96 + 56 each, down 6->8: 96 + 56; its
    # sigmoid gate 8->1: 16 + 36; two layers; GDN and attention GEMMs as in the dense case
    weights = 560 + 768 + 2 * (112 + 3 * 152 + 52)
    by_part = parts(tiny_qwen(moe=True), "kvbuffer", **PLAIN)
    assert by_part["MoE experts"] == 2 * experts and by_part["weights"] == weights


def test_tiny_mamba2_state_and_router_by_hand():
    config = NemotronHConfig(vocab_size=10, hidden_size=8, layers_block_type=["linear_attention", "moe"],
                             mamba_num_heads=2, mamba_head_dim=2, n_groups=1, ssm_state_size=4, conv_kernel=4,
                             num_attention_heads=2, num_key_value_heads=1, head_dim=4, n_routed_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=4, moe_shared_expert_intermediate_size=6)
    # state 2 heads x 2 x 4 fp32 = 64 B; entry: B 4 + dt x 4 + decay 2 = 10 fp32 = 40 B
    # S0 read 2 x 64; buffer 2 x 1.5 x 40; entries 2 x 40; fold 0.5 x (128 + 4 x 40)
    assert parts(config, "kvbuffer", **PLAIN)["linear state"] == 128 + 120 + 80 + 144
    assert parts(config, "recurrent", **PLAIN)["linear state"] == 2 * 2 * 64
    # conv: 2 rows x 3 x (x 4 + B 4 + C 4) x bf16 x 2; the router's weight is fp32: 8 x 4 x 4 + 2 x 12 x 2
    assert parts(config, "kvbuffer", **PLAIN)["conv"] == 2 * 2 * 3 * 12 * 2
    ops = roofline(config, Workload(**PLAIN), BYTES).ms_by_op()
    assert ops["weights: moe router (fp32)"] == pytest.approx(128 + 48)


def test_a_request_that_never_folded_reads_no_state():
    young = dict(PLAIN, context=3)  # fewer tokens than the buffer holds: S0 = 0, nothing to read
    ops = roofline(tiny_qwen(), Workload(**young), BYTES).ms_by_op()
    assert "linear state: gdn S0 read" not in ops
    assert ops["linear state: gdn fold (amortised)"] == pytest.approx(0.5 * (32 + 4 * 32))


def test_a_run_is_the_mean_of_its_steps():
    steps = [Workload(**PLAIN), Workload(**dict(PLAIN, batch=1, context=7))]
    ms, by_part = run_roofline(tiny_qwen(), steps, BYTES, divide_by=2)
    each = [roofline(tiny_qwen(), work, BYTES).ms_per_step for work in steps]
    assert ms == pytest.approx(sum(each) / 2) and sum(by_part.values()) == pytest.approx(ms)


def test_a_multimodal_config_is_read_for_its_text_model():
    from tests.tiny_models import qwen35_multimodal_config, qwen35_text_config

    work = Workload(**SPEC)
    assert roofline(qwen35_multimodal_config(), work, BYTES).ms_by_op() == roofline(qwen35_text_config(), work,
                                                                                     BYTES).ms_by_op()


def test_workloads_are_checked():
    with pytest.raises(ValueError, match="accepted must be in"):
        Workload(batch=1, nodes=2, accepted=3.0)
    with pytest.raises(ValueError, match="backend must be one of"):
        Workload(batch=1, backend="fla")


@pytest.mark.parametrize("name", ["qwen3.5-9b", "qwen3.5-35b-a3b", "nemotron-3-nano"])
def test_the_roofline_reads_every_weight_the_model_builds(name):
    """Its GEMM weights (all experts, embedding and LM head) are the model's parameters less norms, conv kernels
    and per-head vectors: the config is read as the model is built (on the meta device: no memory)."""
    from accelerate import init_empty_weights

    from specdec.models.loading import FAMILIES
    from specdec.models.real_shapes import SHAPES

    config = SHAPES[name][0]()
    with init_empty_weights():
        model = FAMILIES[config.model_type].build(config)
    matrices = sum(p.numel() for n, p in model.named_parameters() if p.ndim >= 2 and "conv1d" not in n)
    assert weight_elements(config) == matrices


def test_qwen35_9b_lands_near_the_issues_rough_roofline():
    """Issue 14: Qwen3.5-9B plain B=256 ~9 ms per step (GEMMs at ~790 TFLOP/s or their weight bytes, state, buffer
    and KV bytes at 4.27 TB/s); KVBuffer / recurrent roofline ratio ~1.25 there and ~1.6 speculative B=128 (4-token
    chains, accepted at 2.72)."""
    from specdec.models.real_shapes import qwen35_9b

    h200 = Peaks(4.27e12, 790e12, "issue 14")
    config = qwen35_9b()

    def ms(backend, **work):
        return roofline(config, Workload(backend=backend, context=160, **work), h200).ms_per_step

    plain = dict(batch=256)
    spec = dict(batch=128, nodes=5, accepted=2.72)
    assert 8.5 < ms("kvbuffer", **plain) < 10.0
    assert ms("recurrent", **plain) / ms("kvbuffer", **plain) == pytest.approx(1.25, abs=0.03)
    assert ms("recurrent", **spec) / ms("kvbuffer", **spec) == pytest.approx(1.6, abs=0.05)


def test_peaks_are_measured_on_the_cpu():
    peaks = measure_peaks("cpu", torch.float32)
    assert peaks.copy_bytes_per_second > 0 and peaks.gemm_flops_per_second > 0
    assert "the CPU (float32)" in peaks.source
    with pytest.raises(ValueError, match="positive"):
        Peaks(0.0, 1.0, "none")
