"""Draft proposers behind one base class and a registry: n-gram (prompt lookup) and a draft model of the target's
family; MTP and EAGLE-3 heads plug into the same interface."""

from .base import DRAFTERS, Drafter, DraftRequest, TreeShape, make_drafter, register
from .draft_model import DraftModelDrafter
from .ngram import NgramDrafter

__all__ = [
    "DRAFTERS",
    "DraftModelDrafter",
    "DraftRequest",
    "Drafter",
    "NgramDrafter",
    "TreeShape",
    "make_drafter",
    "register",
]
