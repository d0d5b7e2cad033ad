"""The engine's settings (EngineConfig), one to one with the flags of `specdec run / eval / bench` (from_flags)."""

from __future__ import annotations

from dataclasses import dataclass

from specdec.cache.spec import CacheConfig
from specdec.speculation import TreeShape
from specdec.speculation.adaptive import AdaptiveConfig

SPECULATION = ("fixed", "adaptive")


@dataclass(frozen=True)
class EngineConfig:
    """cache: the target's pools; shape: what the drafter proposes per step; cuda_graphs: replay the decode /
    verify steps from CUDA graphs on a GPU where the model allows it (runner.graph_note says why not otherwise);
    speculation: "fixed" (every step drafts `shape`) or "adaptive" (each step a chain of up to shape's depth in
    drafts, `shape` itself where it is a tree, or none, chosen by specdec/speculation/adaptive; adaptive: its
    settings, max_steps and tree taken from shape);
    max_prefill_tokens: the padded prompt tokens one prefill forward takes (admitted requests prefill in groups of
    at most that many, a longer prompt alone in pieces of that many): bounds the prefill's activations, which grow
    with the tokens (the H200 study of 2026-12-05: Nemotron-3-Nano at batch 512 ran out of memory prefilling 65536
    tokens at once)."""

    cache: CacheConfig = CacheConfig()
    shape: TreeShape = TreeShape()
    cuda_graphs: bool = True
    speculation: str = "adaptive"
    adaptive: AdaptiveConfig = AdaptiveConfig()
    max_prefill_tokens: int = 16384

    def __post_init__(self):
        if self.speculation not in SPECULATION:
            raise ValueError(f"speculation must be one of {SPECULATION}, got {self.speculation!r}")
        if self.max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1, got {self.max_prefill_tokens}")

    @classmethod
    def from_flags(cls, *, max_batch: int = 8, max_seq_len: int = 4096, flush_length: int = 16,
                   num_state_slots: int | None = None, linear_state: str = "kvbuffer", num_steps: int = 4,
                   topk: int = 1, num_draft_tokens: int | None = None, dynamic_tree: bool = False,
                   cuda_graphs: bool = True, speculation: str = "adaptive",
                   adaptive: AdaptiveConfig | None = None, max_prefill_tokens: int = 16384) -> EngineConfig:
        """From the flags of `specdec run / eval / bench`, one to one (adaptive: --acceptance-prior's,
        specdec/eval/acceptance_prior.py adaptive_settings). Intermediate states keep no buffer: their
        cache runs with flush length 1 whatever flush_length says."""
        cache = CacheConfig(max_requests=max_batch, max_seq_len=max_seq_len, num_state_slots=num_state_slots,
                            flush_length=1 if linear_state == "intermediate" else flush_length,
                            linear_state=linear_state)
        shape = TreeShape(steps=num_steps, topk=topk, max_tokens=num_draft_tokens, dynamic=dynamic_tree)
        return cls(cache, shape, cuda_graphs, speculation, adaptive or AdaptiveConfig(), max_prefill_tokens)

