"""Test-session set-up. Without a GPU, Triton kernels run in Triton's CPU interpreter; this must be decided before
any module that defines a kernel is imported, which is why it lives here."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
