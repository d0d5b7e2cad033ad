"""Draft proposers behind one base class and a registry: n-gram (prompt lookup), a draft model of the target's
family, and the target's own MTP layer; EAGLE-3 heads plug into the same interface."""

from .base import DRAFTERS, Drafter, DraftRequest, TreeShape, make_drafter, register
from .draft_model import DraftModelDrafter
from .mtp import MtpDrafter
from .ngram import NgramDrafter

__all__ = [
    "DRAFTERS",
    "DraftModelDrafter",
    "DraftRequest",
    "Drafter",
    "MtpDrafter",
    "NgramDrafter",
    "TreeShape",
    "make_drafter",
    "register",
]
