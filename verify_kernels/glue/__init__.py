"""The layer glue between the GEMMs and the mixers: RMS norms with the residual add, gated norms, the GDN's q / k
l2norm and gates, the Mamba2 inputs, activations, the attention q / k norm with rotary. Torch references (naive.py,
the models' own code) and, where triton is installed, Triton kernels of the same signatures that read each
activation once and write it once (norm.py, gated_norm.py, gdn_inputs.py, mamba2_inputs.py, activation.py,
qk_norm_rotary.py)."""

import importlib.util

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

# triton is a Linux-only dependency (pyproject.toml); the references work everywhere
if importlib.util.find_spec("triton") is not None:
    from verify_kernels.glue.activation import act_mul, relu2
    from verify_kernels.glue.gated_norm import rms_norm_gated
    from verify_kernels.glue.gdn_inputs import gdn_gates, gdn_qkv
    from verify_kernels.glue.mamba2_inputs import mamba2_inputs
    from verify_kernels.glue.norm import add_rms_norm, rms_norm
    from verify_kernels.glue.qk_norm_rotary import qk_norm_rotary

    __all__ += ["act_mul", "add_rms_norm", "gdn_gates", "gdn_qkv", "mamba2_inputs", "qk_norm_rotary", "relu2",
                "rms_norm", "rms_norm_gated"]
