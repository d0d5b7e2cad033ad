"""What speculation is made of, below both the engine and the drafters: sampling parameters and the target
distribution they define, draft trees and the shapes drafters are asked for, and lossless acceptance."""

from .acceptance import Acceptance, TargetAcceptance, accept_batch, accept_greedy, accept_path
from .sampling import SamplingParams, sample, target_distribution
from .tree import DraftTree, TreeShape

__all__ = [
    "Acceptance",
    "DraftTree",
    "SamplingParams",
    "TargetAcceptance",
    "TreeShape",
    "accept_batch",
    "accept_greedy",
    "accept_path",
    "sample",
    "target_distribution",
]
