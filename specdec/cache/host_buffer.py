"""Small host-to-device copies that do not wait for the device: the values go into a pinned host tensor, copied with
non_blocking=True, ordered on the stream after the work already queued. (A copy from pageable memory makes the host
wait for the stream, which would end any overlap of host and device work.) The pinned tensor comes from PyTorch's
caching host allocator, which does not hand its memory out again before the copy from it has run, so sends may
follow each other without the caller waiting."""

from __future__ import annotations

import torch


def send(values, target: torch.Tensor) -> None:
    """target[:len(values)] = values (a list, or a CPU tensor), asynchronously where target is on CUDA."""
    host = torch.as_tensor(values, dtype=target.dtype)
    count = host.shape[0]
    if target.is_cuda:
        target[:count].copy_(host.pin_memory(), non_blocking=True)
    else:
        target[:count].copy_(host)


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
