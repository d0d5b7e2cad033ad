"""Draft proposers behind one base class and a registry: n-gram (prompt lookup), a draft model of the target's
family, and heads fed with the target's features: its own MTP layer and EAGLE-3; and a synthetic drafter for
throughput benchmarks on random weights."""

from .base import DRAFTERS, Drafter, DraftRequest, TreeShape, make_drafter, register
from .draft_model import DraftModelDrafter
from .eagle3 import Eagle3Drafter
from .head import HeadDrafter
from .mtp import MtpDrafter
from .ngram import NgramDrafter
from .synthetic import SyntheticDrafter

__all__ = [
    "DRAFTERS",
    "DraftModelDrafter",
    "DraftRequest",
    "Drafter",
    "Eagle3Drafter",
    "HeadDrafter",
    "MtpDrafter",
    "NgramDrafter",
    "SyntheticDrafter",
    "TreeShape",
    "make_drafter",
    "register",
]
