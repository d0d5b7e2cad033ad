"""Adaptive speculation (issue 17): per step, the chain length (or none) that maximises expected emitted tokens per
second, from each request's running acceptance per draft position and a step cost model corrected by measured step
times. The engine asks AdaptivePolicy.plan before proposing and tells it a step's outcome once the next step's verify is
launched (Engine.hold_outcome), while the device runs it."""

from .acceptance_stats import RunningAcceptance
from .policy import AdaptiveConfig, AdaptivePolicy, PlannedStep, StepPlan
from .step_cost import StepCost, StepCostPrior, StepRows, flat_prior, unpadded

__all__ = ["AdaptiveConfig", "AdaptivePolicy", "PlannedStep", "RunningAcceptance", "StepCost", "StepCostPrior",
           "StepPlan", "StepRows", "flat_prior", "unpadded"]
