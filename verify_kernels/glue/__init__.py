"""The layer glue between the GEMMs and the mixers: RMS norms with the residual add, gated norms, the GDN's q / k l2norm
and gates, the Mamba2 inputs, activations, the attention q / k norm with rotary. Torch references (naive.py, the models'
own code) and Triton kernels of the same signatures that read each activation once and write it once (norm.py,
gated_norm.py, gdn_inputs.py, mamba2_inputs.py, activation.py, qk_norm_rotary.py)."""

from verify_kernels.glue.naive import (
    act_mul_ref,
    add_rms_norm_ref,
    apply_rotary_ref,
    gdn_gates_ref,
    gdn_qkv_ref,
    l2_normalize_ref,
    mamba2_inputs_ref,
    qk_norm_rotary_ref,
    relu2_ref,
    rms_norm_gated_ref,
    rms_norm_ref,
)
from verify_kernels.lazy import kernels_on_first_use

__all__ = [
    "act_mul_ref",
    "add_rms_norm_ref",
    "apply_rotary_ref",
    "gdn_gates_ref",
    "gdn_qkv_ref",
    "l2_normalize_ref",
    "mamba2_inputs_ref",
    "qk_norm_rotary_ref",
    "relu2_ref",
    "rms_norm_gated_ref",
    "rms_norm_ref",
]

_KERNELS = {  # the Triton kernels (imported on first use: they need triton) -> their modules
    "act_mul": "verify_kernels.glue.activation",
    "add_rms_norm": "verify_kernels.glue.norm",
    "gdn_gates": "verify_kernels.glue.gdn_inputs",
    "gdn_qkv": "verify_kernels.glue.gdn_inputs",
    "mamba2_inputs": "verify_kernels.glue.mamba2_inputs",
    "qk_norm_rotary": "verify_kernels.glue.qk_norm_rotary",
    "relu2": "verify_kernels.glue.activation",
    "rms_norm": "verify_kernels.glue.norm",
    "rms_norm_gated": "verify_kernels.glue.gated_norm",
}
__all__ += sorted(_KERNELS)

__getattr__ = kernels_on_first_use(globals(), _KERNELS)
