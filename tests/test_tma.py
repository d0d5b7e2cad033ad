"""verify_kernels/tma.py: TMA tiles only where the device has them (compute capability >= 9) and Triton has host
descriptors; CPU tensors (the interpreter) always, meta tensors never."""

import pytest
import torch

from verify_kernels import tma


def test_cpu_tensors_use_tma_in_the_interpreter():
    assert tma.tma_usable(torch.empty(1)) == tma.host_descriptors()


def test_meta_tensors_never_use_tma():
    assert not tma.tma_usable(torch.empty(1, device="meta"))


@pytest.mark.parametrize(("major", "usable"), [(8, False), (9, True), (10, True)])
def test_cuda_tensors_use_tma_from_hopper_on(monkeypatch, major, usable):
    """A100 (8.0) falls back to pointer loads; H100/H200 (9.0) and Blackwell (10.0) use TMA."""
    tma._device_has_tma.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (major, 0))
    fake_cuda = type("FakeTensor", (), {"device": torch.device("cuda", 0)})()
    try:
        assert tma.tma_usable(fake_cuda) == (usable and tma.host_descriptors())
    finally:
        tma._device_has_tma.cache_clear()


def test_without_host_descriptors_nothing_uses_tma(monkeypatch):
    monkeypatch.setattr(tma, "host_descriptors", lambda: False)
    assert not tma.tma_usable(torch.empty(1))
