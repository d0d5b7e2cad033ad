"""Adaptive speculation (issue 17): per step, the chain length, the configured tree or no drafting that
maximises expected emitted tokens per second, from each request's running acceptance per draft position (and, for the
tree, a pooled sibling acceptance) and a step cost model corrected by measured step times. The engine asks
AdaptivePolicy.plan before proposing and tells it a step's outcome once the next step's verify is launched
(Engine.hold_outcome), while the device runs it."""

from .acceptance_stats import RunningAcceptance
from .config import AdaptiveConfig
from .plan import PlannedStep, StepPlan
from .policy import AdaptivePolicy
from .step_cost import StepCost, StepCostPrior, StepRows, flat_prior, unpadded
from .tree_yield import SiblingAcceptance, TreeLayout, rank_outcome

__all__ = ["AdaptiveConfig", "AdaptivePolicy", "PlannedStep", "RunningAcceptance", "StepCost", "StepCostPrior",
           "SiblingAcceptance", "StepPlan", "StepRows", "TreeLayout", "flat_prior", "rank_outcome", "unpadded"]
