"""The Python heap under decoding. A full garbage collection (generation 2) walks every object the process holds: the
model's modules and parameters, transformers', Triton's and the tokenizer's own. On this project's 2-core CPU machine
that is 355k objects and 130-155 ms for the shipped tiny Qwen3.5 pair (2026-12-04), and a full-size model on the
H200's host holds more on a CPU half as fast (benchmarks.host_step: 1.34 ms of the speculative step's host work there
against 0.64 here). Such a collection comes whenever enough objects have survived since the last one: the H200 study
of 2026-12-04 saw single steps of 376 and 389 ms among steps of 22-32 ms, in an adaptive row whose ~40 steps it
slowed by ~15%. Servers freeze the heap once they have warmed up (vLLM and SGLang do, after their graph captures):
what exists then moves to a permanent generation that collections no longer walk, and a collection walks only what
was allocated since. `freeze_heap` does that (the engine's prepare_steps calls it after its captures), and
`GcPauses` measures the collector's time over a stretch of steps (the benchmark's rows report it)."""

from __future__ import annotations

import atexit
import gc
import time


def freeze_heap() -> None:
    """Collect what is garbage now (cycles frozen would never be freed), then move every surviving object to the
    permanent generation. Calling it again moves what was allocated since. At exit the heap is unfrozen again, so
    that the interpreter's last collection frees it (else extension types warn of leaks: Triton's nanobind ones)."""
    gc.collect()
    gc.freeze()
    atexit.unregister(gc.unfreeze)  # (once, however often it is frozen)
    atexit.register(gc.unfreeze)


class GcPauses:
    """Time the garbage collector ran while this is entered: seconds in all collections, and the full collections
    (generation 2) alone, with their count."""

    def __init__(self):
        self.seconds = 0.0
        self.full_seconds = 0.0
        self.full = 0
        self._start: float | None = None

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            pause = time.perf_counter() - self._start
            self._start = None
            self.seconds += pause
            if info["generation"] == 2:
                self.full += 1
                self.full_seconds += pause

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._on_collection)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._on_collection)
