"""The intermediate-state baseline: linear layers run the way SGLang and vLLM run them (a tree walked token by token
from the committed state, one state written per node, the accepted node's state copied back), as torch references
(naive.py) and, where triton is installed, Triton kernels of the same signatures (kernels.py). The engine runs them
through specdec/cache/linear_state.py's IntermediateStates, to measure the KVBuffer against in the same engine."""

import importlib.util

from verify_kernels.intermediate.naive import (
    commit_node_states_ref,
    committed_states,
    gdn_intermediate_ref,
    mamba2_intermediate_ref,
)

__all__ = ["commit_node_states_ref", "committed_states", "gdn_intermediate_ref", "mamba2_intermediate_ref"]

if importlib.util.find_spec("triton") is not None:
    from verify_kernels.intermediate.kernels import commit_node_states, gdn_intermediate, mamba2_intermediate

    __all__ += ["commit_node_states", "gdn_intermediate", "mamba2_intermediate"]
