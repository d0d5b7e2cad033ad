"""What the adaptive policy hands the engine for a step (StepPlan), and what it keeps of that plan until the step's
outcome is told (PlannedStep)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepPlan:
    """steps: drafts per row (0: nobody drafts); drafting[i]: whether row i drafts (every row of a drafting step:
    the policy's plans; the engine takes any mask); tree: the drafts are the configured tree's, not a chain."""

    steps: int
    drafting: tuple[bool, ...]
    tree: bool = False

    @property
    def label(self) -> str:
        return "plain" if self.steps == 0 else f"tree-{self.steps}" if self.tree else f"chain-{self.steps}"


@dataclass(frozen=True)
class PlannedStep:
    """A plan awaiting its outcome: the batch and mean context it was priced at, the plan, the drafter's backlog
    then, and its entry for the trace (when tracing)."""

    batch: int
    context: float
    plan: StepPlan
    backlog: int
    decision: dict | None = None
