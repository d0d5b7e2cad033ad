"""The layer-glue Triton kernels (verify_kernels/glue) against their torch references (naive.py): RMS norms with and
without the residual add, gated norms of both families, the GDN's q / k / v split and gates, activations and the
attention q / k norm with rotary, in fp32, bf16 and fp16, at widths that are not powers of two and on strided
inputs (splits and chunks of a projection's output, as the models pass them). Without a GPU the kernels run in
Triton's interpreter (tests/conftest.py) at small widths; the `gpu` cases use the real models' widths.

Outputs are NaN-poisoned (torch.empty returns NaN here), so an element a kernel does not write fails. The kernels
round where the references round, so bf16 / fp16 results differ only where an fp32 reduction's order moves a
value across a rounding boundary: a few elements by one unit in the last place. (Triton's interpreter rounds fp32 to
bf16 toward zero, the GPU to nearest even, so on the CPU bf16 results may differ by a unit everywhere.)"""

import pytest
import torch

from verify_kernels.glue import (
    act_mul,
    act_mul_ref,
    add_rms_norm,
    add_rms_norm_ref,
    gdn_gates,
    gdn_gates_ref,
    gdn_qkv,
    gdn_qkv_ref,
    mamba2_inputs,
    mamba2_inputs_ref,
    qk_norm_rotary,
    qk_norm_rotary_ref,
    relu2,
    relu2_ref,
    rms_norm,
    rms_norm_gated,
    rms_norm_gated_ref,
    rms_norm_ref,
)

pytestmark = pytest.mark.usefixtures("nan_empty")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
DTYPE_IDS = ["fp32", "bf16", "fp16"]
ULP = {torch.float32: 1e-5, torch.bfloat16: 2.0**-6, torch.float16: 2.0**-9}  # a few units in the last place
EPS = 1e-6
ROUNDS_TO_NEAREST = {torch.float32: True, torch.float16: True, torch.bfloat16: DEVICE == "cuda"}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, rounded_to: torch.dtype | None = None,
                 scale: float = 1.0) -> None:
    """Same dtype and shape, finite, and within a few units in the last place of `rounded_to` (the dtype the values
    were last rounded to; by default their own) of the larger of the value and `scale`."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    assert torch.isfinite(actual).all(), "non-finite values in the output"
    tol = ULP[rounded_to or actual.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol * scale, rtol=tol)


def randn(gen: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(DEVICE, dtype)


def strided(gen: torch.Generator, *shape: int, dtype, extra: int = 5) -> torch.Tensor:
    """A [..., D] view whose rows are strided: the first D channels of a [..., D + extra] tensor (a split)."""
    return randn(gen, *shape[:-1], shape[-1] + extra, dtype=dtype)[..., : shape[-1]]


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("width", [7, 64, 300])
@pytest.mark.parametrize("offset", [True, False], ids=["offset", "plain"])
def test_rms_norm_matches_reference(dtype, width, offset):
    """Width 300: two rows a program, the last program half masked."""
    gen = torch.Generator().manual_seed(width)
    x = strided(gen, 2, 3, width, dtype=dtype)
    weight = randn(gen, width, dtype=dtype, scale=0.5)
    assert_close(rms_norm(x, weight, EPS, offset), rms_norm_ref(x, weight, EPS, offset))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("width", [7, 100])
@pytest.mark.parametrize("offset", [True, False], ids=["offset", "plain"])
def test_add_rms_norm_matches_reference(dtype, width, offset):
    """The sum is the residual stream: it must equal x + residual in the dtype exactly, and the norm is of it."""
    gen = torch.Generator().manual_seed(width + 1)
    x = strided(gen, 2, 3, width, dtype=dtype)
    residual = randn(gen, 2, 3, width, dtype=dtype, scale=4.0)
    weight = randn(gen, width, dtype=dtype, scale=0.5)
    out, total = add_rms_norm(x, residual, weight, EPS, offset)
    ref_out, ref_total = add_rms_norm_ref(x, residual, weight, EPS, offset)
    if ROUNDS_TO_NEAREST[dtype]:
        assert torch.equal(total, ref_total)
    assert_close(total, ref_total)
    assert_close(out, ref_out)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("heads", "head_dim"), [(3, 12), (4, 16), (1, 7)])
def test_gdn_gated_norm_matches_reference(dtype, heads, head_dim):
    """Qwen3.5: per value head, norm then * silu(z); x is the mixer's fp32 output, weight [V] shared by heads."""
    gen = torch.Generator().manual_seed(heads * head_dim)
    x = randn(gen, 2, 3, heads * head_dim, scale=3.0)
    gate = randn(gen, 2, 3, heads * head_dim, dtype=dtype, scale=2.0)
    weight = randn(gen, head_dim, dtype=dtype)
    args = (x, gate, weight, EPS, head_dim, True)
    assert_close(rms_norm_gated(*args), rms_norm_gated_ref(*args))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("width", "group_size"), [(24, 12), (24, 8), (30, 30), (1536, 96)])
def test_group_gated_norm_matches_reference(dtype, width, group_size):
    """Nemotron-H: x * silu(z), then a norm per group; the gate is a split of in_proj's output (strided rows);
    the last case has more groups than one program takes."""
    gen = torch.Generator().manual_seed(width + group_size)
    x = randn(gen, 2, 2, width)
    gate = strided(gen, 2, 2, width, dtype=dtype, extra=11)
    weight = randn(gen, width, dtype=dtype)
    args = (x.to(dtype), gate, weight, EPS, group_size, False)
    assert_close(rms_norm_gated(*args), rms_norm_gated_ref(*args))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("H", "K", "HV", "V"), [(2, 12, 3, 10), (2, 16, 4, 16), (1, 5, 1, 7), (4, 300, 5, 200)])
def test_gdn_qkv_matches_reference(dtype, H, K, HV, V):
    """q / k l2-normalised (q scaled), in fp32 or the model's dtype, v cast, from a strided conv output; the last case
    spreads q / k and v over several programs, the last of them partly masked."""
    gen = torch.Generator().manual_seed(H * K + HV * V)
    qkv = strided(gen, 2, 3, 2 * H * K + HV * V, dtype=dtype)
    args = (qkv, H, K, HV, V, K**-0.5)
    # (the model's dtype: the KVBuffer's q and k, specdec/cache/linear_state.py; stored in fp32 for its decode)
    for qk_dtype, qk_storage in ((None, None), (dtype, None), (dtype, torch.float32)):
        outputs = gdn_qkv(*args, qk_dtype=qk_dtype, qk_storage=qk_storage)
        assert [t.dtype for t in outputs] == [qk_storage or qk_dtype or torch.float32] * 2 + [torch.float32]
        expected = gdn_qkv_ref(*args, qk_dtype=qk_dtype, qk_storage=qk_storage)
        assert all(t.is_contiguous() for t in outputs)
        for ours, reference in zip(outputs[:2], expected[:2], strict=True):  # q, k: rounded to qk_dtype
            assert_close(ours, reference, rounded_to=qk_dtype)
            assert torch.equal(ours, ours.to(qk_dtype or torch.float32).to(ours.dtype))  # exactly its values
        assert_close(outputs[2], expected[2])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_gdn_gates_match_reference(dtype):
    """Both sides of softplus's threshold (a + dt_bias > 20 and very negative), rows of a strided projection."""
    gen = torch.Generator().manual_seed(5)
    a = strided(gen, 3, 7, 5, dtype=dtype, extra=2)
    a[0, 0] = torch.tensor([25.0, -30.0, 19.5, 0.0, -8.0])
    b = randn(gen, 3, 7, 5, dtype=dtype, scale=3.0)
    A_log, dt_bias = randn(gen, 5, dtype=dtype), randn(gen, 5, dtype=dtype)
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    g_ref, beta_ref = gdn_gates_ref(a, b, A_log, dt_bias)
    torch.testing.assert_close(g, g_ref, atol=1e-6, rtol=1e-5)
    assert_close(beta, beta_ref, rounded_to=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("NH", "P", "NG", "N", "limit"), [(3, 5, 2, 6, (0.0, float("inf"))),
                                                           (6, 64, 2, 154, (0.05, 3.0))])
def test_mamba2_inputs_match_reference(dtype, NH, P, NG, N, limit):
    """x, B, C from a strided conv output, dt from a split of in_proj's output (both sides of softplus's threshold,
    clamped or not), A and D; the second case takes several channel blocks and rows a program. B and C keep the conv
    output's dtype (its values, exact in TF32 for the verify's products when bf16 / fp16) or take the one asked for,
    the rest is fp32."""
    gen = torch.Generator().manual_seed(NH * P)
    xbc = strided(gen, 2, 3, NH * P + 2 * NG * N, dtype=dtype)
    dt = strided(gen, 2, 3, NH, dtype=dtype, extra=7).mul_(4.0)
    assert not dt.is_contiguous()
    dt[0, 0, :3] = torch.tensor([25.0, -30.0, 19.5])
    vectors = [randn(gen, NH, dtype=dtype) for _ in range(3)]  # dt_bias, A_log, D
    args = (xbc, dt, *vectors, NH, P, NG, N, limit)
    for bc_dtype in (None, torch.float32):  # (fp32: the intermediate-state backend's, IntermediateStates)
        outputs = mamba2_inputs(*args, bc_dtype=bc_dtype)
        bc = bc_dtype or dtype
        assert [t.dtype for t in outputs] == [torch.float32, torch.float32, bc, bc, torch.float32, torch.float32]
        for ours, expected in zip(outputs, mamba2_inputs_ref(*args, bc_dtype=bc_dtype), strict=True):
            assert ours.is_contiguous()
            torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("act", ["silu", "sigmoid"])
@pytest.mark.parametrize("width", [37, 1500])
def test_act_mul_matches_reference(dtype, act, width):
    """gate and up are the two chunks of one projection's output (strided rows); 1500 takes two column blocks."""
    gen = torch.Generator().manual_seed(width)
    gate, up = randn(gen, 2, 3, 2 * width, dtype=dtype, scale=3.0).chunk(2, dim=-1)
    assert_close(act_mul(gate, up, act), act_mul_ref(gate, up, act))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_relu2_matches_reference(dtype):
    gen = torch.Generator().manual_seed(2)
    x = strided(gen, 4, 37, dtype=dtype)
    assert_close(relu2(x), relu2_ref(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("H", "HKV", "D", "R"), [(3, 1, 24, 6), (2, 2, 16, 16), (4, 2, 10, 0), (6, 3, 256, 64)])
def test_qk_norm_rotary_matches_reference(dtype, H, HKV, D, R):
    """Partial, full and no rotary; the query is a chunk of q_proj's [query, gate] heads (strided); the last case
    spreads query and key heads over several programs, the last of them partly masked. A rotated channel is the sum
    of two rounded products that may cancel: its error is in units of the head's largest value."""
    gen = torch.Generator().manual_seed(H * D + R)
    B, T = 2, 3
    query = randn(gen, B, T, H, 2 * D, dtype=dtype).chunk(2, dim=-1)[0]
    key = randn(gen, B, T, HKV, D, dtype=dtype)
    q_weight, k_weight = randn(gen, D, dtype=dtype, scale=0.3), randn(gen, D, dtype=dtype, scale=0.3)
    angles = torch.rand(B, T, R // 2, generator=gen) * 6.0
    cos, sin = (torch.cat((f(angles), f(angles)), dim=-1).to(DEVICE, dtype) for f in (torch.cos, torch.sin))
    args = (query, key, q_weight, k_weight, cos, sin, EPS)
    for ours, expected in zip(qk_norm_rotary(*args), qk_norm_rotary_ref(*args), strict=True):
        assert_close(ours, expected, scale=expected.abs().amax().item())


def test_launchers_reject_what_they_cannot_read():
    x = torch.randn(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(7, device=DEVICE), EPS, True)
    with pytest.raises(ValueError, match="unit stride"):
        rms_norm(x.t(), torch.ones(2, device=DEVICE), EPS, True)
    with pytest.raises(ValueError, match="multiple of group_size"):
        rms_norm_gated(x, x, torch.ones(8, device=DEVICE), EPS, 3, False)
    with pytest.raises(ValueError, match="channels"):
        gdn_qkv(x, 1, 2, 1, 2, 1.0)


GPU_CASES = {  # name: (hidden, GDN (H, K, HV, V), attention (H, HKV, D, R), Mamba2 (NH, P, NG, N), MLP width)
    "qwen3.5-9b": (4096, (16, 128, 32, 128), (16, 4, 256, 64), None, 12288),
    "nemotron-3-nano": (2688, None, None, (64, 64, 8, 128), 1856),
}


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE == "cpu", reason="needs a CUDA device")
@pytest.mark.parametrize("model", sorted(GPU_CASES))
def test_real_widths_match_reference(model):
    """Every op at the model's widths, bf16, 256 tokens."""
    hidden, gdn, attention, mamba, mlp = GPU_CASES[model]
    gen = torch.Generator().manual_seed(0)
    dtype, N = torch.bfloat16, 256
    x, residual = randn(gen, N, hidden, dtype=dtype), randn(gen, N, hidden, dtype=dtype, scale=4.0)
    weight = randn(gen, hidden, dtype=dtype, scale=0.3)
    for ours, expected in zip(add_rms_norm(x, residual, weight, EPS, True),
                              add_rms_norm_ref(x, residual, weight, EPS, True), strict=True):
        assert_close(ours, expected)
    gate, up = randn(gen, N, 2 * mlp, dtype=dtype, scale=3.0).chunk(2, dim=-1)
    assert_close(act_mul(gate, up, "silu"), act_mul_ref(gate, up, "silu"))
    assert_close(relu2(gate), relu2_ref(gate))
    if gdn is not None:
        H, K, HV, V = gdn
        qkv = randn(gen, N, 2 * H * K + HV * V, dtype=dtype)
        for ours, expected in zip(gdn_qkv(qkv, *gdn, K**-0.5), gdn_qkv_ref(qkv, *gdn, K**-0.5), strict=True):
            assert_close(ours, expected)
        args = (randn(gen, N, HV * V), randn(gen, N, HV * V, dtype=dtype), randn(gen, V, dtype=dtype), EPS, V, True)
        assert_close(rms_norm_gated(*args), rms_norm_gated_ref(*args))
    if attention is not None:
        H, HKV, D, R = attention
        query = randn(gen, 1, N, H, 2 * D, dtype=dtype).chunk(2, dim=-1)[0]
        key = randn(gen, 1, N, HKV, D, dtype=dtype)
        angles = torch.rand(1, N, R // 2, generator=gen) * 100.0
        cos, sin = (torch.cat((f(angles), f(angles)), dim=-1).to(DEVICE, dtype) for f in (torch.cos, torch.sin))
        args = (query, key, randn(gen, D, dtype=dtype), randn(gen, D, dtype=dtype), cos, sin, EPS)
        for ours, expected in zip(qk_norm_rotary(*args), qk_norm_rotary_ref(*args), strict=True):
            assert_close(ours, expected, scale=expected.abs().amax().item())
    if mamba is not None:
        NH, P, NG, S = mamba
        xbc, dt = randn(gen, N, NH * P + 2 * NG * S, dtype=dtype), randn(gen, N, NH, dtype=dtype)
        args = (xbc, dt, *(randn(gen, NH, dtype=dtype) for _ in range(3)), NH, P, NG, S, (0.0, float("inf")))
        for ours, expected in zip(mamba2_inputs(*args), mamba2_inputs_ref(*args), strict=True):
            torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-5)
        width = NH * P
        args = (randn(gen, N, width), randn(gen, N, width, dtype=dtype), randn(gen, width, dtype=dtype), EPS,
                width // NG, False)
        assert_close(rms_norm_gated(*args), rms_norm_gated_ref(*args))
