"""Adaptive speculation (issue 17): per step, the chain length (or none) that maximises expected emitted tokens per
second, from each request's running acceptance per draft position and a step cost model corrected by measured step
times. The engine asks AdaptivePolicy.plan before proposing and tells it the outcome after emitting."""

from .acceptance_stats import RunningAcceptance
from .policy import AdaptiveConfig, AdaptivePolicy, StepPlan
from .step_cost import StepCost, StepCostPrior, StepRows, flat_prior, unpadded

__all__ = ["AdaptiveConfig", "AdaptivePolicy", "RunningAcceptance", "StepCost", "StepCostPrior", "StepPlan", "StepRows",
           "flat_prior", "unpadded"]
