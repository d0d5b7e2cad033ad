"""Draft proposers behind one base class and a registry: n-gram (prompt lookup), a draft model of the target's
family, and heads fed with the target's features: its own MTP layer and EAGLE-3."""

from .base import DRAFTERS, Drafter, DraftRequest, TreeShape, make_drafter, register
from .draft_model import DraftModelDrafter
from .eagle3 import Eagle3Drafter
from .head import HeadDrafter
from .mtp import MtpDrafter
from .ngram import NgramDrafter

__all__ = [
    "DRAFTERS",
    "DraftModelDrafter",
    "DraftRequest",
    "Drafter",
    "Eagle3Drafter",
    "HeadDrafter",
    "MtpDrafter",
    "NgramDrafter",
    "TreeShape",
    "make_drafter",
    "register",
]
