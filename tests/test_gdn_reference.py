"""verify_kernels.gdn.naive against the plain gated delta rule: transformers' recurrence is the outside oracle
for ours; the chunked prefill and every KVBuffer path (decode, tree verify, commit, flush) must equal our
recurrence run along the same tokens from the same committed state (tests.reference_checks.MixerChecks)."""

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import l2norm, torch_recurrent_gated_delta_rule

from tests.reference_checks import Mixer, MixerChecks, RefOps, assert_close
from verify_kernels.gdn import (
    gdn_chunk_prefill_ref,
    gdn_commit_ref,
    gdn_decode_ref,
    gdn_flush_ref,
    gdn_recurrent_ref,
    gdn_verify_ref,
)

K, V = 8, 6
# (H, HV) by value heads per key head
HEADS = {1: (2, 2), 2: (1, 2), 3: (2, 6)}


class Gdn(Mixer):
    """tokens: q, k [B, T, H, K] l2-normalised (q scaled by K**-0.5), v [B, T, HV, V], g [B, T, HV] in
    [-max_decay, 0], beta [B, T, HV] in (0, 1)."""

    ops = RefOps(gdn_recurrent_ref, gdn_chunk_prefill_ref, gdn_decode_ref, gdn_verify_ref, gdn_commit_ref,
                 gdn_flush_ref)

    def __init__(self, ratio: int, max_decay: float = 2.0):
        self.H, self.HV = HEADS[ratio]
        self.max_decay = max_decay
        self.state_shape = (self.HV, K, V)
        self.entry_shapes = ((self.H, K), (self.HV, V), (self.HV,))

    def tokens(self, gen, B, T):
        q = l2norm(torch.randn(B, T, self.H, K, generator=gen)) * K**-0.5
        k = l2norm(torch.randn(B, T, self.H, K, generator=gen))
        v = torch.randn(B, T, self.HV, V, generator=gen)
        g = -self.max_decay * torch.rand(B, T, self.HV, generator=gen)
        beta = torch.rand(B, T, self.HV, generator=gen)
        return [q, k, v, g, beta]

    def key(self, tokens):
        return tokens[1]

    def log_decay(self, tokens):
        return tokens[3]

    def value(self, state, token):
        """The u one recurrence step writes: beta (v - e^g S^T k)."""
        _, k, v, g, beta = token
        k = k.repeat_interleave(self.HV // self.H, dim=-2)
        return beta[..., None] * (v - g.exp()[..., None] * torch.einsum("bhkv,bhk->bhv", state, k))

    def pad_right(self, tokens, T):
        tokens[3][:, T:], tokens[4][:, T:] = 0.0, 0.0                       # g = 0, beta = 0

    def hit_max_decay(self, tokens, step):
        tokens[3][:, ::step] = -self.max_decay


class TestGdn(MixerChecks):
    def mixer(self, gen, ratio, max_decay=2.0):
        return Gdn(ratio, max_decay)


@pytest.mark.parametrize("initial", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("ratio", HEADS, ids=lambda r: f"hv{r}")
def test_recurrent_matches_transformers(ratio, initial):
    gdn = Gdn(ratio)
    gen = torch.Generator().manual_seed(0)
    B, T = 2, 20
    q_raw, k_raw = torch.randn(B, T, gdn.H, K, generator=gen), torch.randn(B, T, gdn.H, K, generator=gen)
    _, _, v, g, beta = gdn.tokens(gen, B, T)
    s0 = gdn.random_state(gen, B) if initial else None
    # transformers l2-normalises q, k itself and always scales q by K**-0.5; we take both done. It gets the key
    # heads already repeated to the value heads: some releases (5.17) do not group heads in this function.
    q_hf, k_hf = (x.repeat_interleave(gdn.HV // gdn.H, dim=2) for x in (q_raw, k_raw))
    o_hf, s_hf = torch_recurrent_gated_delta_rule(q_hf, k_hf, v, g, beta, initial_state=s0,
                                                  output_final_state=True, use_qk_l2norm_in_kernel=True)
    o, s = gdn_recurrent_ref(l2norm(q_raw) * K**-0.5, l2norm(k_raw), v, g, beta, s0)
    assert_close(o, o_hf)
    assert_close(s, s_hf)
