"""Small host-to-device copies that do not wait for the device: the values go into a pinned host tensor, copied with
non_blocking=True, ordered on the stream after the work already queued. (A copy from pageable memory makes the host
wait for the stream, which would end any overlap of host and device work.) A pinned tensor from PyTorch's caching
host allocator (to_device) is not handed out again before the copy from it has run; DeviceMirror keeps its own two,
each reused once an event says its copy is done."""

from __future__ import annotations

from array import array

import torch


class DeviceMirror:
    """Host-side int64 values (`values`: an array('q'), read and written element by element by Python as cheaply as a
    list) mirrored on the device (`device_values`) by sync(): one asynchronous copy. On CUDA it goes from one of two
    pinned staging tensors used in turn, each refilled only once the copy from it has run (an event, in practice
    long done: a step waits for the device in between). Why not torch.as_tensor(list).pin_memory(): ~16 us to
    convert 257 Python ints and a pinned allocation on every call (2-core CPU), on the path between a speculative
    step's acceptance read and the next launch; the array is copied as raw bytes (~1.5 us)."""

    def __init__(self, size: int, fill: int, device: torch.device):
        self.values = array("q", [fill]) * size
        self.device_values = torch.full((size,), fill, dtype=torch.long, device=device)
        cuda = self.device_values.is_cuda
        self._staging = [torch.empty(size, dtype=torch.long, pin_memory=True) for _ in range(2)] if cuda else []
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0

    def sync(self) -> None:
        """device_values = values, queued behind the device's work (the host does not wait for it)."""
        values = torch.frombuffer(self.values, dtype=torch.long)
        if not self._staging:
            self.device_values.copy_(values)
            return
        self._turn ^= 1
        staging, copied = self._staging[self._turn], self._copied[self._turn]
        if copied is not None:
            copied.synchronize()  # (the copy queued from it two syncs ago)
        staging.copy_(values)
        self.device_values.copy_(staging, non_blocking=True)
        if copied is None:
            copied = self._copied[self._turn] = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(self.device_values.device))  # (the stream the copy went to)


def to_device(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor's copy on `device`, queued behind the device's work instead of waiting for it (pinned first
    where the device is CUDA)."""
    if torch.device(device).type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


class HostBuffer:
    """A [size] host tensor for device-to-host copies that do not wait: pinned where the device is CUDA. The caller
    reads it once the copy has run (an event) and does not send into it again before it has read it (alternate two
    across steps)."""

    def __init__(self, size: int, dtype: torch.dtype, device: torch.device):
        self.host = torch.zeros(size, dtype=dtype, pin_memory=torch.device(device).type == "cuda")
