"""A prompt's length must not reach a Triton kernel as a compile-time argument: on a GPU each new value compiles the
kernel again, seconds of a request's prefill (the GPU eval of 2026-12-06: 3-7 s for each new prompt length of 41-76
tokens, when the tree conv kernels took the node count as a constexpr). Nor as a class: Triton also specialises a
runtime integer on being 1 or a multiple of 16, unless the kernel exempts it (do_not_specialize), and after `specdec
serve`'s warm-up a 4000-token prompt compiled the MoE router and the attention again, a 2100-token one the MoE layout
(H100, benchmarks/results/first_use_h200_2026-12-06.md). Here every kernel launched while prompts of several lengths
are prefilled, on the Triton backend in its CPU interpreter (natively on a GPU), is recorded with its constexpr
arguments and the classes of its runtime integers, and every length must launch the same set. (Block sizes follow the
rows in powers of two: a bounded number of compiles, which is why the lengths compared lie in one such bucket. A
tensor's strides are left out: at real shapes they are multiples of 16 whatever the length, the tiny models' are
not.)"""

from __future__ import annotations

import inspect

import pytest
import torch

from specdec import CacheConfig, ModelRunner, load_model
from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny

# (one power-of-two bucket, 62 tokens apart: a block size bucketed by powers of two is the same for all, while a count
# of 16-row blocks or the length itself is not; 80 a multiple of 16, 100 of 4, whose square, the prefill's ancestor
# matrix's batch stride, is one of 16)
LENGTHS = (65, 80, 100, 127)
# (a prompt the buffer holds is scored by the linear state's verify kernels, whose node counts keep their classes: they
# are the speculative steps' hot kernels, captured per step width, and a prompt of 16 tokens would compile them again)
BUFFERED_LENGTHS = (9, 12, 13)

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="records launches in Triton's interpreter")


def constexpr_names(fn) -> tuple[str, ...]:
    return tuple(name for name, parameter in inspect.signature(fn).parameters.items()
                 if "constexpr" in str(parameter.annotation))


def integer_classes(function, bound: dict) -> tuple[tuple[str, str], ...]:
    """How Triton specialises a launch's runtime integers (on a GPU each class compiles apart): '1' for one, 'D' for a
    multiple of 16, 'i' else, for every one the kernel does not exempt (do_not_specialize) but strides (stride_*,
    s_*: the module docstring says why)."""
    exempt = set(function.kwargs.get("do_not_specialize") or ()) | set(constexpr_names(function.fn))
    return tuple((name, "1" if value == 1 else "D" if value % 16 == 0 else "i") for name, value in bound.items()
                 if name in function.arg_names and name not in exempt  # (not the launch's options: num_warps ...)
                 and not name.startswith(("stride", "s_")) and isinstance(value, int) and not isinstance(value, bool))


@pytest.fixture
def launches(monkeypatch):
    """-> the list that each interpreted kernel launch appends (kernel name, its constexpr arguments, the classes of
    its runtime integers but strides) to."""
    from triton.runtime.interpreter import InterpretedFunction

    recorded, run = [], InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        bound = dict(zip(self.arg_names, args, strict=False)) | kwargs
        constants = tuple((name, repr(bound.get(name))) for name in constexpr_names(self.fn))
        recorded.append((self.fn.__name__, constants, integer_classes(self, bound)))
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", recording_run)
    return recorded


def tiny_runner(family: str, directory, monkeypatch, max_requests: int, flush_length: int = 4) -> ModelRunner:
    """A tiny model of the family on the Triton backend (head dims of 16: the smallest the kernels take)."""
    if family.startswith("qwen3_5"):
        config = qwen35_text_config(linear_key_head_dim=16, linear_value_head_dim=16, moe=family.endswith("moe"))
    else:
        config = nemotron_h_config(mamba_head_dim=16, ssm_state_size=16)
    save_tiny(config, directory, seed=9)
    model = load_model(directory, device="cpu", dtype=torch.float32)
    monkeypatch.setenv("SPECDEC_BACKEND", "triton")
    return ModelRunner.create(model, CacheConfig(max_requests=max_requests, max_seq_len=160,
                                                 flush_length=flush_length))


def assert_same_kernels(signatures: list[set], what: str, values: tuple) -> None:
    assert signatures[0], "no Triton kernel ran: the test would prove nothing"
    for value, signature in zip(values[1:], signatures[1:], strict=True):
        only_first, only_this = signatures[0] - signature, signature - signatures[0]
        assert not only_first and not only_this, (f"kernels compiled for one {what} only, {values[0]} / {value}: "
                                                  f"{sorted(only_first)} / {sorted(only_this)}")


def prompt(length: int) -> list[int]:
    return [(7 * i + length) % 50 + 3 for i in range(length)]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "nemotron_h"])
@pytest.mark.parametrize(("flush_length", "lengths"), [(4, LENGTHS), (32, BUFFERED_LENGTHS)],
                         ids=["chunked", "buffered"])
def test_prompt_lengths_launch_the_same_kernels(family, flush_length, lengths, tmp_path, monkeypatch, launches):
    """chunked: prompts longer than the buffer (the chunked prefill); buffered: prompts the buffer holds (scored as
    chains through the linear state's verify kernels; 9-13 tokens: one power-of-two bucket)."""
    runner = tiny_runner(family, tmp_path, monkeypatch, max_requests=2, flush_length=flush_length)
    signatures = []
    for length in lengths:
        slot = runner.cache.allocate_request()
        launches.clear()
        runner.prefill([slot], [prompt(length)])
        signatures.append(set(launches))
        runner.cache.release_request(slot)
    assert_same_kernels(signatures, "prompt length", lengths)


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_batch_sizes_of_one_bucket_decode_on_the_same_kernels(family, tmp_path, monkeypatch, launches):
    """Steps that run eagerly (--disable-cuda-graph, or a model whose steps cannot be captured) take the batch as it
    is: decode steps of 5 and 7 requests (one power-of-two bucket) must launch the same compiled kernels."""
    runner = tiny_runner(family, tmp_path, monkeypatch, max_requests=7)
    slots = [runner.cache.allocate_request() for _ in range(7)]
    runner.prefill(slots, [prompt(9 + row) for row in range(7)])
    signatures = []
    for batch in (5, 7):
        launches.clear()
        runner.decode(slots[:batch], [11] * batch)
        signatures.append(set(launches))
    assert_same_kernels(signatures, "batch size", (5, 7))


def test_the_moe_layout_compiles_once_for_every_token_count(launches):
    """The MoE layout's launches (verify_kernels/moe/routing.py) take the step's assignments R = N k, their chunks P
    and the layout's blocks NB as integers, which Triton would specialise on being multiples of 16: on the H100 a
    2100-token Nemotron-3-Nano prompt (R = 12600) compiled expert_slots_kernel again after serve's warm-up, whose long
    prompts were then 3000 and 3008 tokens, with R = 18000 and 18048 (benchmarks/results/first_use_h200_2026-12-06.md).
    Token counts whose R, P and NB fall in every class must launch the same compiled kernels."""
    from verify_kernels.moe.routing import expert_layout, num_blocks

    experts, top_k, block_m, chunk = 16, 2, 16, 256  # (chunk: the layout's for 16 experts and R >= 256)
    counts = (2048, 2050, 2056, 2176)  # R 4096 / 4100 / 4112 / 4352, P 16 / 17 / 17 / 17, NB 271 / 271 / 272 / 287
    classes = {(rows % 16 == 0, -(-rows // chunk) % 16 == 0, num_blocks(rows, experts, block_m) % 16 == 0)
               for rows in (n * top_k for n in counts)}
    assert len(classes) == 4, "the counts must cover the classes the test is about"
    signatures = []
    for tokens in counts:
        top_index = torch.randint(0, experts, (tokens, top_k), generator=torch.Generator().manual_seed(tokens))
        launches.clear()
        expert_layout(top_index, experts, block_m)
        signatures.append(set(launches))
    assert_same_kernels(signatures, "token count", counts)
