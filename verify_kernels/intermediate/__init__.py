"""The intermediate-state baseline: linear layers run the way SGLang and vLLM run them (a tree walked token by token
from the committed state, one state written per node, the accepted node's state copied back), as torch references
(naive.py) and Triton kernels of the same signatures (kernels.py). The engine runs them through
specdec/cache/linear_state.py's IntermediateStates, to measure the KVBuffer against in the same engine."""

from verify_kernels.intermediate.naive import (
    commit_node_states_ref,
    committed_states,
    gdn_intermediate_ref,
    mamba2_intermediate_ref,
)
from verify_kernels.lazy import kernels_on_first_use

__all__ = ["commit_node_states_ref", "committed_states", "gdn_intermediate_ref", "mamba2_intermediate_ref"]

_KERNELS = {  # the Triton kernels (imported on first use: they need triton) -> their modules
    "commit_node_states": "verify_kernels.intermediate.kernels",
    "gdn_intermediate": "verify_kernels.intermediate.kernels",
    "mamba2_intermediate": "verify_kernels.intermediate.kernels",
}
__all__ += sorted(_KERNELS)

__getattr__ = kernels_on_first_use(globals(), _KERNELS)
