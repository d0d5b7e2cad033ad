"""Adaptive speculation's prior from a drafter's eval figures (`--acceptance-prior EVAL [EVAL]`).

The policy starts every request, and the acceptance it pools over requests, from a prior: a conditional acceptance
per draft position, and for trees a sibling acceptance q (specdec/speculation/adaptive). Its defaults (0.75 a
position, q = 0.3) are the shipped Qwen3.5 drafters' on MT-bench; a pair whose drafts keep 0.9, or 0.5, is priced
wrong until each request's own steps outweigh them (two pseudo-observations a position, so a few steps), and a
short request never gets there. `specdec eval` of the pair measures the figures this reads back from its
summary.json:

- a fixed chain's run (--topk 1): the share of drafting steps that kept >= k drafts, a[k] (position_acceptance),
  gives p[0] = a[1] and p[k] = a[k+1] / a[k];
- a fixed static tree's run (--topk > 1), beside a chain's: the tokens a tree step emitted, which the rank model
  (specdec/speculation/adaptive/tree_yield.py) prices from p and q, solved for q by bisection (the tree's yield
  grows with q). A tree's own position_acceptance mixes both figures, so a tree's eval alone cannot give p.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from specdec.speculation import TreeShape
from specdec.speculation.adaptive import AdaptiveConfig, TreeLayout

SUMMARY = "summary.json"  # (specdec/eval/run.py writes it into the eval's output folder)


@dataclass(frozen=True)
class AcceptancePrior:
    """acceptance: P(draft k+1 kept | drafts 1..k kept) per position k (the last repeats); sibling: a later-ranked
    sibling's acceptance, None where no tree was evaluated (the policy's default stays)."""

    acceptance: tuple[float, ...]
    sibling: float | None = None

    def applied(self, config: AdaptiveConfig) -> AdaptiveConfig:
        sibling = config.sibling_prior if self.sibling is None else self.sibling
        return replace(config, prior_acceptance=self.acceptance, sibling_prior=sibling)


def adaptive_settings(args) -> AdaptiveConfig:
    """Adaptive speculation's settings from the flags of `specdec run / serve / eval / bench`: the policy's defaults,
    or with --acceptance-prior the prior read from those evals. A ValueError naming the fix for a prior without
    --speculation adaptive, or an eval folder it cannot read."""
    paths = getattr(args, "acceptance_prior", None) or ()
    speculation = args.speculation
    if paths and "adaptive" not in ([speculation] if isinstance(speculation, str) else speculation):  # eval: a list
        raise ValueError("--acceptance-prior is where adaptive speculation's acceptance starts; add --speculation "
                         "adaptive, or leave it out")
    return adaptive_config(paths)


def adaptive_config(paths: Sequence[str | Path]) -> AdaptiveConfig:
    """The adaptive policy's settings with the prior of these evals (the defaults where none are given)."""
    return read_acceptance_prior(paths).applied(AdaptiveConfig()) if paths else AdaptiveConfig()


def read_acceptance_prior(paths: Sequence[str | Path]) -> AcceptancePrior:
    """The prior of one chain's eval, or of a chain's and a static tree's (in either order): eval output folders or
    their summary.json. ValueError, naming the file and the fix, for anything else."""
    if not 1 <= len(paths) <= 2:
        raise ValueError(f"--acceptance-prior takes a chain's eval folder and optionally a static tree's, got "
                         f"{len(paths)} paths")
    evals = [_read_summary(Path(path)) for path in paths]
    chains = [e for e in evals if e[1].topk == 1]
    trees = [e for e in evals if e[1].topk > 1]
    if len(chains) != 1 or len(trees) > 1:
        kinds = ", ".join(f"{path} ({'a chain' if shape.topk == 1 else 'a tree'})" for path, shape, _ in evals)
        raise ValueError(f"--acceptance-prior needs one eval of a chain (--topk 1), and at most one of a static tree "
                         f"beside it (a tree's figures mix the chain's acceptance with its siblings'); got {kinds}")
    path, _, run = chains[0]
    acceptance = conditional_acceptance(run["position_acceptance"])
    if not acceptance or acceptance[0] == 0.0:
        raise ValueError(f"--acceptance-prior {path}: its speculative run kept no draft at any position, so every "
                         f"request would start with speculation off; evaluate the pair with more prompts or tokens")
    sibling = None
    if trees:
        _, tree_shape, tree_run = trees[0]
        sibling = fit_sibling(acceptance, TreeLayout.of(tree_shape), tree_run["mean_accepted_length"])
    return AcceptancePrior(acceptance, sibling)


def conditional_acceptance(at_least: Sequence[float]) -> tuple[float, ...]:
    """p[k] = a[k+1] / a[k] (a[0] = 1) from a[k] = the share of drafting steps that kept >= k drafts, k = 1..depth;
    it ends at the first position no step reached (0 / 0: the last figure repeats there)."""
    figures, reached = [], 1.0
    for share in at_least:
        if reached <= 0.0:
            break
        figures.append(min(1.0, max(0.0, share / reached)))
        reached = share
    return tuple(figures)


def fit_sibling(acceptance: Sequence[float], layout: TreeLayout, tokens_per_step: float) -> float:
    """The q at which the rank model's tokens per step of `layout`, at chain acceptance `acceptance` (the last
    figure repeats below its depth), equals the measured `tokens_per_step`; clipped to [0, 1] where the measured
    figure lies outside what any q gives (a chain acceptance measured at other prompts, or noise)."""
    p = [acceptance[min(k, len(acceptance) - 1)] for k in range(layout.depth)]
    low, high = 0.0, 1.0
    if layout.expected_tokens(p, low) >= tokens_per_step:
        return low
    if layout.expected_tokens(p, high) <= tokens_per_step:
        return high
    for _ in range(40):  # (2^-40: far below any eval's noise)
        middle = (low + high) / 2
        low, high = (middle, high) if layout.expected_tokens(p, middle) < tokens_per_step else (low, middle)
    return (low + high) / 2


def _read_summary(path: Path) -> tuple[Path, TreeShape, dict]:
    """(the summary's path, the shape its drafts had, its fixed speculative run at the largest batch: a greedy
    eval's runs keep the same drafts at every batch size)."""
    file = path / SUMMARY if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"--acceptance-prior {path}: no {SUMMARY} there; give the output folder of a "
                         f"`specdec eval` of the pair (its --output)")
    try:
        summary = json.loads(file.read_text())
        settings = summary["settings"]
        runs = [run for run in summary["runs"] if run["mode"] == "speculative" and run["position_acceptance"]]
        shape = TreeShape(settings["num_steps"], settings["topk"], settings["num_draft_tokens"],
                          settings["dynamic_tree"])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"--acceptance-prior {file}: not a summary `specdec eval` wrote ({error!r}); give the "
                         f"output folder of a `specdec eval` of the pair") from None
    if shape.dynamic:
        raise ValueError(f"--acceptance-prior {file}: an eval of dynamic trees, whose shape changes each step; give "
                         f"the eval of a chain (--topk 1) or of a static tree")
    if not runs:
        raise ValueError(f"--acceptance-prior {file}: no fixed speculative run in it; evaluate the pair with "
                         f"--speculation fixed")
    return file, shape, max(runs, key=lambda run: run["batch_size"])
