"""verify_kernels.mamba2.naive against the plain Mamba2 scan: transformers' NemotronH scans are the outside
oracle for our recurrence; the chunked prefill and every KVBuffer path (decode, tree verify, commit, flush)
must equal our recurrence run along the same tokens from the same committed state
(tests.reference_checks.MixerChecks)."""

import pytest
import torch
from transformers.models.nemotron_h.modeling_nemotron_h import (
    mamba2_chunk_scan,
    mamba2_selective_state_update,
)

from tests.reference_checks import Mixer, MixerChecks, RefOps, assert_close
from verify_kernels.mamba2 import (
    mamba2_chunk_prefill_ref,
    mamba2_commit_ref,
    mamba2_decode_ref,
    mamba2_flush_ref,
    mamba2_recurrent_ref,
    mamba2_verify_ref,
)

P, N = 6, 5
# (NH, NG) by heads per group
HEADS = {1: (2, 2), 2: (2, 1), 3: (6, 2)}


class Mamba2(Mixer):
    """Layer weights A [NH] with dt A >= -max_decay for dt <= 1, and D [NH], drawn first. tokens: x [B, T, NH, P],
    dt [B, T, NH] in (0, 1] (already softplus'ed), Bm and C [B, T, NG, N]."""

    ops = RefOps(mamba2_recurrent_ref, mamba2_chunk_prefill_ref, mamba2_decode_ref, mamba2_verify_ref,
                 mamba2_commit_ref, mamba2_flush_ref)

    def __init__(self, gen: torch.Generator, ratio: int, max_decay: float = 2.0):
        self.NH, self.NG = HEADS[ratio]
        self.max_decay = max_decay
        self.state_shape = (self.NH, P, N)
        self.entry_shapes = ((self.NG, N), (self.NH, P), (self.NH,))
        self.A = -max_decay * (0.1 + 0.9 * torch.rand(self.NH, generator=gen))
        self.D = torch.randn(self.NH, generator=gen)

    def tokens(self, gen, B, T):
        x = torch.randn(B, T, self.NH, P, generator=gen)
        dt = 1.0 - torch.rand(B, T, self.NH, generator=gen)
        return [x, dt, torch.randn(B, T, self.NG, N, generator=gen), torch.randn(B, T, self.NG, N, generator=gen)]

    def args(self, tokens):
        """x, dt, A, Bm, C, D."""
        x, dt, Bm, C = tokens
        return x, dt, self.A, Bm, C, self.D

    def key(self, tokens):
        return tokens[2]                                                    # Bm

    def log_decay(self, tokens):
        return tokens[1] * self.A

    def value(self, state, token):
        """xdt = dt x: independent of the state."""
        return token[1][..., None] * token[0]

    def pad_right(self, tokens, T):
        tokens[1][:, T:] = 0.0                                              # dt = 0

    def hit_max_decay(self, tokens, step):
        self.A[0] = -self.max_decay                                         # dt = 1 gives a = -max_decay exactly
        tokens[1][:, ::step] = 1.0


class TestMamba2(MixerChecks):
    def mixer(self, gen, ratio, max_decay=2.0):
        return Mamba2(gen, ratio, max_decay)


@pytest.mark.parametrize("initial", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("ratio", HEADS, ids=lambda r: f"g{r}")
def test_recurrent_matches_transformers_chunk_scan(ratio, initial):
    gen = torch.Generator().manual_seed(0)
    mamba2 = Mamba2(gen, ratio)
    x, dt, A, Bm, C, D = mamba2.args(mamba2.tokens(gen, 2, 37))
    s0 = mamba2.random_state(gen, 2) if initial else None
    # dt is already processed: no dt_bias, no softplus, and the default clamp (0, inf) keeps it as it is
    y_hf, s_hf = mamba2_chunk_scan(x, dt, A, Bm, C, chunk_size=16, D=D, initial_states=s0,
                                   return_final_states=True)
    y, s = mamba2_recurrent_ref(x, dt, A, Bm, C, D, s0)
    assert_close(y, y_hf)
    assert_close(s, s_hf)


@pytest.mark.parametrize("ratio", HEADS, ids=lambda r: f"g{r}")
def test_recurrent_matches_transformers_state_update(ratio):
    gen = torch.Generator().manual_seed(1)
    mamba2 = Mamba2(gen, ratio)
    NH = mamba2.NH
    x, dt, A, Bm, C, D = mamba2.args(mamba2.tokens(gen, 2, 9))
    s0 = mamba2.random_state(gen, 2)
    # the decode-time shapes of NemotronHMamba2Mixer: dt [B, NH, P], A [NH, P, N], D [NH, P]
    state, y_hf = s0.clone(), []
    for t in range(x.shape[1]):
        y_hf.append(mamba2_selective_state_update(state, x[:, t], dt[:, t, :, None].expand(-1, -1, P),
                                                  A[:, None, None].expand(NH, P, N), Bm[:, t], C[:, t],
                                                  D[:, None].expand(NH, P)))
    y, s = mamba2_recurrent_ref(x, dt, A, Bm, C, D, s0)
    assert_close(y, torch.stack(y_hf, 1))
    assert_close(s, state)
