"""benchmarks/sweep_gdn.py's candidates (benchmarks/sweep_gdn_candidates.py) name settings that exist: a misspelt
one would set a new attribute that no kernel reads, and a GPU sweep would time the defaults under its label
(device time is the scarce resource)."""

from benchmarks import sweep_gdn_candidates

OPS = {"fold", "append", "commit", "decode", "foldstep", "verify", "chains", "verify1", "conv", "small"}


def test_every_candidate_changes_an_existing_setting():
    candidates = sweep_gdn_candidates.candidates(OPS)
    assert {c.op for c in candidates} >= OPS - {"append"}  # (append times the defaults alone)
    for candidate in candidates:
        for name in candidate.changes:
            module, _, attribute = name.partition(".")
            assert hasattr(sweep_gdn_candidates.MODULES[module], attribute), f"{candidate.label}: no setting {name}"
    folding = {c.changes["decode.FOLDING_DECODE"] for c in candidates if "decode.FOLDING_DECODE" in c.changes}
    assert folding == set(sweep_gdn_candidates.MODULES["decode"].FOLDING_DECODES)  # each launch, none misspelt


def test_candidate_labels_are_unique_per_op():
    candidates = sweep_gdn_candidates.candidates(OPS)
    labels = [(c.op, c.label) for c in candidates]
    assert len(labels) == len(set(labels))
