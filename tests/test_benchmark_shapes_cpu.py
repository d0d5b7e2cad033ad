"""benchmarks/shapes_cpu.py: the engines it alternates (trees where the drafter drafts them); the decode loop it
shares with benchmarks/adaptive_overhead.py: its figures, on the shipped Qwen3.5 pair."""

from __future__ import annotations

from benchmarks.adaptive_overhead import decode
from benchmarks.shapes_cpu import shapes
from specdec.api import LLM


def test_the_shapes_offered_follow_the_drafter():
    with_features, draft_model = shapes("mtp", batch=4), shapes("small", batch=1)
    assert "fixed dynamic tree, topk 4, 16 drafts" in with_features
    assert "fixed dynamic tree, topk 4, 16 drafts" not in draft_model  # (a draft model drafts static trees only)
    static = draft_model["fixed static tree, topk 2, 16 drafts"].shape
    assert (static.topk, static.budget, static.dynamic) == (2, 16, False)
    assert draft_model["fixed 4-chains"].shape.budget == 4
    assert with_features["adaptive (chains of 1, 2, 4 or none)"].speculation == "adaptive"
    offered_tree = draft_model["adaptive (chains, the static tree or none)"]
    assert offered_tree.speculation == "adaptive" and offered_tree.shape == static
    assert draft_model["plain decoding"] is None
    offered_dynamic = with_features["adaptive (chains, the dynamic tree or none)"]
    assert offered_dynamic.speculation == "adaptive"
    assert offered_dynamic.shape == with_features["fixed dynamic tree, topk 4, 16 drafts"].shape
    assert "adaptive (chains, the dynamic tree or none)" not in draft_model


def test_decode_counts_tokens_and_steps():
    config = shapes("small", batch=1)["fixed static tree, topk 2, 16 drafts"]
    rate, emitted, steps = decode(LLM("qwen3.5", "small", config=config), ["The river flows", "Once"], 12, batch=2)
    assert rate > 0 and steps >= 1
    assert steps <= emitted <= 2 * 11  # every step emits a token or more; the prefills give each prompt its first
