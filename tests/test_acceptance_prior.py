"""Adaptive speculation's prior from a pair's eval figures (--acceptance-prior, specdec/eval/acceptance_prior.py):
the conditional acceptance from a chain's eval, the sibling acceptance solved from a static tree's beside it, both
read back from real `specdec eval` folders of the shipped pair into the engine's policy; bad folders and flags are
refused in one line before any model loads."""

from __future__ import annotations

import json

import pytest

import specdec.api
from specdec.api import LLM
from specdec.cli import main
from specdec.engine.config import EngineConfig
from specdec.eval.acceptance_prior import adaptive_config, conditional_acceptance, fit_sibling, read_acceptance_prior
from specdec.speculation import TreeShape
from specdec.speculation.adaptive import AdaptiveConfig, TreeLayout

EVAL = ["eval", "--target", "qwen3.5", "--draft", "mtp", "--dataset", "mt-bench", "--num-prompts", "3",
        "--max-new-tokens", "24", "--batch-size", "2", "--no-baseline"]


def test_conditional_acceptance_from_the_shares_that_kept_at_least_k():
    assert conditional_acceptance([0.8, 0.6, 0.3, 0.15]) == pytest.approx((0.8, 0.75, 0.5, 0.5))
    assert conditional_acceptance([0.5, 0.0, 0.0, 0.0]) == pytest.approx((0.5, 0.0))  # none reached draft 3
    assert conditional_acceptance([]) == ()


@pytest.mark.parametrize("q", [0.05, 0.3, 0.52, 0.9])
def test_the_sibling_fit_inverts_the_rank_model(q):
    layout = TreeLayout.of(TreeShape(4, 2, 16))
    p = (0.8, 0.7, 0.6, 0.5)
    assert fit_sibling(p, layout, layout.expected_tokens(p, q)) == pytest.approx(q, abs=1e-9)
    assert fit_sibling(p[:2], layout, layout.expected_tokens((0.8, 0.7, 0.7, 0.7), q)) == pytest.approx(q, abs=1e-9)
    # a tree that kept less than its chain would (another sitting's figures, noise) is clipped to q = 0
    assert fit_sibling(p, layout, layout.expected_tokens(p, 0.0) - 0.1) == 0.0
    assert fit_sibling(p, layout, 17.0) == 1.0


@pytest.fixture(scope="module")
def evals(tmp_path_factory):
    """A chain's eval and a static tree's of the shipped Qwen3.5 target with its MTP layer."""
    root = tmp_path_factory.mktemp("evals")
    assert main([*EVAL, "--output", str(root / "chain")]) == 0
    assert main([*EVAL, "--topk", "2", "--num-draft-tokens", "8", "--output", str(root / "tree")]) == 0
    return root


def test_the_eval_names_the_flag(evals, capsys):
    assert main([*EVAL, "--output", str(evals / "chain")]) == 0  # (resumes: nothing left to run)
    assert f"--acceptance-prior {evals / 'chain'} (a chain's)" in capsys.readouterr().out


def test_the_prior_read_from_the_pairs_evals(evals):
    chain = json.loads((evals / "chain" / "summary.json").read_text())["runs"][0]
    tree = json.loads((evals / "tree" / "summary.json").read_text())["runs"][0]
    prior = read_acceptance_prior([evals / "tree", evals / "chain" / "summary.json"])  # (either order, file or folder)
    shares = chain["position_acceptance"]
    assert prior.acceptance == pytest.approx(conditional_acceptance(shares)) and len(prior.acceptance) == 4
    assert prior.acceptance[0] == pytest.approx(shares[0]) and 0.3 < shares[0] < 1.0  # the shipped MTP is trained
    assert 0.0 < prior.sibling < 1.0  # (not clipped: ~0.23 for these greedy drafts)
    layout = TreeLayout.of(TreeShape(4, 2, 8))  # the rank model at the fitted q gives the tree's measured yield
    assert layout.expected_tokens(prior.acceptance, prior.sibling) == pytest.approx(tree["mean_accepted_length"])
    assert read_acceptance_prior([evals / "chain"]).sibling is None
    config = adaptive_config([evals / "chain", evals / "tree"])
    assert config.prior_acceptance == prior.acceptance and config.sibling_prior == prior.sibling
    assert adaptive_config([]) == AdaptiveConfig()


def test_the_engines_policy_starts_from_it(evals):
    prior = read_acceptance_prior([evals / "chain"])
    config = EngineConfig.from_flags(max_batch=2, max_seq_len=128, speculation="adaptive",
                                     adaptive=adaptive_config([evals / "chain"]))
    policy = LLM("qwen3.5", "mtp", config=config).engine.policy
    assert policy.config.prior_acceptance == prior.acceptance
    # a new request starts from the pooled acceptance, which starts from the prior
    assert [policy.population.conditional(k) for k in range(4)] == pytest.approx(prior.acceptance)


def test_run_and_eval_take_the_flag(evals, tmp_path, capsys):
    assert main(["run", "--draft", "mtp", "--speculation", "adaptive", "--acceptance-prior", str(evals / "chain"),
                 "--prompt", "Hello", "--max-new-tokens", "4"]) == 0
    out = tmp_path / "adaptive"
    argv = [*EVAL, "--speculation", "adaptive", "--acceptance-prior", str(evals / "chain"), "--output", str(out)]
    assert main(argv) == 0
    assert json.loads((out / "eval.json").read_text())["acceptance_prior"] == [str(evals / "chain")]
    assert main(argv) == 0  # the same settings again: the folder resumes (its eval.json read back as equal)


def summary(topk: int = 1, runs: list | None = None, dynamic: bool = False) -> dict:
    run = {"mode": "speculative", "batch_size": 1, "mean_accepted_length": 2.5,
           "position_acceptance": [0.7, 0.5, 0.3, 0.2]}
    return {"settings": {"num_steps": 4, "topk": topk, "num_draft_tokens": 8 if topk > 1 else None,
                         "dynamic_tree": dynamic}, "runs": [run] if runs is None else runs}


@pytest.fixture
def no_model_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model started loading before the arguments were checked")

    monkeypatch.setattr(specdec.api, "load_model", refuse)


@pytest.mark.parametrize("files, extra, message", [
    ({}, [], "no summary.json there; give the output folder of a `specdec eval`"),
    ({"a": summary()}, ["--speculation", "fixed"], "--acceptance-prior is where adaptive speculation's acceptance "
                                                   "starts; add --speculation adaptive"),
    ({"a": summary(), "b": summary()}, [], "needs one eval of a chain (--topk 1), and at most one of a static tree"),
    ({"a": summary(topk=2)}, [], "needs one eval of a chain (--topk 1)"),
    ({"a": summary(topk=2, dynamic=True)}, [], "an eval of dynamic trees"),
    ({"a": summary(runs=[])}, [], "no fixed speculative run in it; evaluate the pair with --speculation fixed"),
    ({"a": {"runs": []}}, [], "not a summary `specdec eval` wrote"),
    ({"a": summary(runs=[{"mode": "speculative", "batch_size": 1, "position_acceptance": [0.0, 0.0]}])}, [],
     "kept no draft at any position"),
], ids=["no-summary", "fixed", "two-chains", "tree-alone", "dynamic", "no-run", "not-a-summary", "nothing-kept"])
def test_bad_priors_are_one_line_before_any_model_loads(files, extra, message, tmp_path, capsys, no_model_loads):
    paths = []
    for name, content in (files or {"empty": None}).items():
        (tmp_path / name).mkdir()
        if content is not None:
            (tmp_path / name / "summary.json").write_text(json.dumps(content))
        paths.append(str(tmp_path / name))
    assert main(["run", "--draft", "mtp", "--speculation", "adaptive", *extra, "--acceptance-prior", *paths]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["eval", "--num-prompts", "1"],
                                     ["bench", "--batch-sizes", "1"]])
def test_every_command_with_the_flag_refuses_a_folder_without_an_eval(command, tmp_path, capsys, no_model_loads):
    argv = [*command, "--draft", "mtp", "--speculation", "adaptive", "--acceptance-prior", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--acceptance-prior {tmp_path}: no summary.json there" in err and len(err.strip().splitlines()) == 1, err
