"""Chunked prefill on the GPU through fla-core's chunk_gated_delta_rule, a dependency (the `bench` extra, or any
install of fla-core >= 0.6), behind gdn_chunk_prefill_ref's signature. fla multiplies in TF32 (about 1e-3
relative), so the runtime takes it for bf16 / fp16 models only (specdec/backend.py) and keeps fp32 models exact.

fla is imported only when called (verify_kernels/fla_support.py says why and whether it is installed).
"""

import torch


def gdn_chunk_prefill_fla(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """As gdn_chunk_prefill_ref: q, k [B, T, H, K] (q already scaled, k normalised); v [B, T, HV, V]; g (log
    decays), beta [B, T, HV]; initial_state [B, HV, K, V] fp32 or None. -> o [B, T, HV, V], final state
    [B, HV, K, V], float32. fla takes HV > H itself (grouped value heads)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    batch, _, value_heads, value_dim = v.shape
    if initial_state is None:
        initial_state = torch.zeros(batch, value_heads, k.shape[-1], value_dim, dtype=torch.float32, device=v.device)
    o, final_state = chunk_gated_delta_rule(  # (q and k in v's dtype: bf16 q and k widen exactly)
        q.to(v.dtype).contiguous(), k.to(v.dtype).contiguous(), v.contiguous(), g.float().contiguous(),
        beta.contiguous(), scale=1.0,
        initial_state=initial_state.float().contiguous(), output_final_state=True,
    )
    return o.float(), final_state.float()
