"""Chunked prefill on the GPU through fla-core's chunk_simple_gla, behind mamba2_chunk_prefill_ref's signature.

Mamba2's SSD is a simple gated linear attention, a scalar log decay per head and token: with q = C, k = B (each
group's read by its heads), v = dt x and g = dt A, fla's state S [NH, P, N] (its state_v_first layout, ours) follows

    S_t = e^{g_t} S_{t-1} + v_t k_t^T,   o_t = S_t q_t   (scale 1),   y_t = o_t + D x_t

which is naive.py's recurrence. The reference carries the state across 64-token chunks in a Python loop (six small
launches a chunk and layer: ~9000 for a 4096-token prompt through Nemotron-3-Nano's 23 Mamba2 layers); fla does the
whole prompt in three kernels. Its products are in the model's half dtype (dt x rounded to it), so the runtime takes
it for bf16 / fp16 models only (specdec/backend.py chunk_prefill), as for GDN; fla is imported only when
called (verify_kernels/fla_support.py).
"""

import torch

from verify_kernels.kvbuffer import expand_heads


def mamba2_chunk_prefill_fla(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor, C: torch.Tensor,
                             D: torch.Tensor, initial_state: torch.Tensor | None = None,
                             dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """As mamba2_chunk_prefill_ref: x [B, T, NH, P]; dt [B, T, NH] (softplus'ed, 0 at padding tokens, which leave
    the state as it was); A, D [NH]; Bm, C [B, T, NG, N]; initial_state [B, NH, P, N] or None (zeros).
    dtype: the half dtype fla multiplies in (the model's). -> y [B, T, NH, P], final state [B, NH, P, N], float32."""
    from fla.ops.simple_gla import chunk_simple_gla

    batch, _, heads, head_dim = x.shape
    if initial_state is None:
        initial_state = torch.zeros(batch, heads, head_dim, Bm.shape[-1], dtype=torch.float32, device=x.device)
    dt = dt.float()
    o, final_state = chunk_simple_gla(
        expand_heads(C, heads).to(dtype).contiguous(), expand_heads(Bm, heads).to(dtype).contiguous(),
        (dt[..., None] * x.float()).to(dtype).contiguous(), g=(dt * A.float()).contiguous(), scale=1.0,
        initial_state=initial_state.float().contiguous(), output_final_state=True, state_v_first=True,
    )
    return o.float() + D.float()[:, None] * x.float(), final_state.float()
