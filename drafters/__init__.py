"""Draft proposers behind one base class (base.py) and a registry by name (registry.py): n-gram (prompt lookup), a
draft model of the target's family, and heads fed with the target's features: its own MTP layer and EAGLE-3."""

from .base import Drafter, DraftRequest
from .draft_model import DraftModelDrafter
from .eagle3 import Eagle3Drafter
from .head import HeadDrafter
from .mtp import MtpDrafter
from .ngram import NgramDrafter
from .registry import DRAFTERS, DraftContext, make_drafter, parse_draft

__all__ = [
    "DRAFTERS",
    "DraftContext",
    "DraftModelDrafter",
    "DraftRequest",
    "Drafter",
    "Eagle3Drafter",
    "HeadDrafter",
    "MtpDrafter",
    "NgramDrafter",
    "make_drafter",
    "parse_draft",
]
