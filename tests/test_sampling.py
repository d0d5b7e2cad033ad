"""Sampling: the target distribution, and lossless acceptance of chains and multi-candidate trees, checked by the
distribution of emitted tokens over 20k trials against the target (total variation), with a biased acceptance
rule shown to fail the same bound."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specdec.speculation import DraftTree, accept_greedy, accept_path
from specdec.speculation.acceptance import accept_batch, accept_child
from specdec.speculation.sampling import SamplingParams, sample, target_distribution

VOCAB = 6
TRIALS = 20_000
TV_BOUND = 0.03  # the sampling noise of 20k draws over <= 36 outcomes is ~0.015


def total_variation(counts: torch.Tensor, expected: torch.Tensor) -> float:
    return 0.5 * (counts / counts.sum() - expected).abs().sum().item()


def distributions(seed: int):
    gen = torch.Generator().manual_seed(seed)
    p1 = torch.rand(VOCAB, generator=gen)
    p1 = p1 / p1.sum()
    p2 = torch.rand(VOCAB, VOCAB, generator=gen)  # target for the next token, given the first
    p2 = p2 / p2.sum(-1, keepdim=True)
    q = torch.rand(VOCAB, generator=gen) ** 3
    return p1, p2, q / q.sum()


def without(q: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """q with the given tokens removed, renormalised: the law of a draw without replacement."""
    q = q.clone()
    q[tokens] = 0
    return q / q.sum()


def emitted_pairs(draft, p1, p2, accept=accept_path, seed: int = 0) -> torch.Tensor:
    """Counts [V, V] of the first two tokens emitted; a step that emits one token is followed by a step with no
    drafts, which samples the second from the target."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(VOCAB, VOCAB)
    for _ in range(TRIALS):
        tree = draft(gen)
        target = torch.stack([p1 if j == 0 else p2[tree.tokens[j]] for j in range(len(tree))])
        path, bonus = accept(tree, target, gen)
        tokens = [tree.tokens[j] for j in path[1:]] + [bonus]
        if len(tokens) == 1:
            tokens.append(sample(p2[tokens[0]], gen))
        counts[tokens[0], tokens[1]] += 1
    return counts


def chain_of_two(q):
    """A 2-token chain drawn from q (the draft ignores context: any q is allowed)."""
    def draft(gen):
        first, second = sample(q, gen), sample(q, gen)
        return DraftTree.chain(0, [first, second], [q, q])
    return draft


def three_siblings_without_replacement(q):
    def draft(gen):
        tokens, laws = [], []
        for _ in range(3):
            law = without(q, tokens)
            tokens.append(sample(law, gen))
            laws.append(law)
        return DraftTree([0, *tokens], [-1, 0, 0, 0], [None, *laws])
    return draft


def deterministic_tree(_q):
    """Fixed candidates (point masses), two levels: as n-gram or greedy top-k drafters propose."""
    def draft(_gen):
        return DraftTree([0, 2, 4, 1, 3], [-1, 0, 0, 1, 1])
    return draft


def accept_one_row(tree, target, gen):
    """The batched walk (acceptance.accept_batch) on a batch of one."""
    return accept_batch([tree], target[None], [gen])[0]


@pytest.mark.parametrize("accept", [accept_path, accept_one_row], ids=["per-row", "batched"])
@pytest.mark.parametrize("make_draft", [chain_of_two, three_siblings_without_replacement, deterministic_tree],
                         ids=["sampled-chain", "sampled-siblings", "deterministic-tree"])
def test_emitted_tokens_follow_the_target(make_draft, accept):
    p1, p2, q = distributions(seed=1)
    counts = emitted_pairs(make_draft(q), p1, p2, accept=accept)
    assert total_variation(counts.flatten(), (p1[:, None] * p2).flatten()) < TV_BOUND


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                            reason="needs a CUDA device")])])
def test_rows_of_one_batch_walk_independently(device):
    """Trees of all three kinds in one batch of 60 rows, 20k rows in all: each kind still emits the target (the
    targets on `device`, the draft laws on the host, as the engine has them)."""
    p1, p2, q = distributions(seed=2)
    gen = torch.Generator().manual_seed(4)
    makers = [chain_of_two(q), three_siblings_without_replacement(q), deterministic_tree(q)]
    counts = torch.zeros(len(makers), VOCAB, VOCAB)
    for _ in range(TRIALS // 60):
        trees = [makers[row % 3](gen) for row in range(60)]
        width = max(len(tree) for tree in trees)
        targets = torch.stack([torch.stack([p1 if j == 0 else p2[tree.tokens[j]] if j < len(tree) else p1
                                            for j in range(width)]) for tree in trees])
        walks = accept_batch(trees, targets.to(device), [gen] * 60)
        for row, (tree, (path, bonus)) in enumerate(zip(trees, walks, strict=True)):
            tokens = [tree.tokens[j] for j in path[1:]] + [bonus]
            if len(tokens) == 1:
                tokens.append(sample(p2[tokens[0]], gen))
            counts[row % 3, tokens[0], tokens[1]] += 1
    for kind in counts:
        assert total_variation(kind.flatten(), (p1[:, None] * p2).flatten()) < 2 * TV_BOUND  # ~6.7k draws each


def test_the_bound_catches_a_biased_acceptance_rule():
    """Accepting every drafted token (no rejection) is not lossless: the same check must fail it."""
    p1, p2, q = distributions(seed=1)

    def accept_everything(tree, target, gen):
        path = [0]
        while children := tree.children(path[-1]):
            path.append(children[0])
        return path, sample(target[path[-1]], gen)

    counts = emitted_pairs(chain_of_two(q), p1, p2, accept=accept_everything)
    assert total_variation(counts.flatten(), (p1[:, None] * p2).flatten()) > 3 * TV_BOUND


def test_greedy_accepts_exactly_the_argmax():
    logits = torch.tensor([[0.1, 2.0, 0.3], [1.5, 0.2, 0.1]])
    probs = target_distribution(logits, SamplingParams())
    tree = DraftTree([7, 1, 2, 0], [-1, 0, 0, 1])  # node 1 (token 1) is the argmax at the root; then token 0
    path, bonus = accept_path(tree, torch.stack([probs[0], probs[1], probs[0], probs[0]]), None)
    assert path == [0, 1, 3] and bonus == 1  # node 3's target (row 0) has argmax 1


def test_target_distribution_filters():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0])
    assert target_distribution(logits, SamplingParams()).tolist() == [1, 0, 0, 0, 0]
    hot = target_distribution(logits, SamplingParams(temperature=2.0))
    torch.testing.assert_close(hot, (logits / 2).softmax(0))
    top2 = target_distribution(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (top2[2:] == 0).all() and torch.allclose(top2[:2], logits[:2].softmax(0))
    # top_p: the smallest most-likely set whose mass reaches top_p
    probs = logits.softmax(0)
    nucleus = target_distribution(logits, SamplingParams(temperature=1.0, top_p=float(probs[0] + 1e-3)))
    assert (nucleus > 0).tolist() == [True, True, False, False, False]
    only_first = target_distribution(logits, SamplingParams(temperature=1.0, top_p=float(probs[0] * 0.5)))
    assert only_first.tolist() == [1, 0, 0, 0, 0]


def test_acceptance_probability():
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.25, 0.25, 0.5])
    assert accept_child(p, 0, q, None)  # p >= q: always
    assert not accept_child(p, 2, q, None)  # p = 0: never
    gen = torch.Generator().manual_seed(0)
    frequency = sum(accept_child(torch.tensor([0.2, 0.8]), 0, torch.tensor([0.8, 0.2]), gen) for _ in range(4000))
    assert abs(frequency / 4000 - 0.25) < 0.03  # p / q = 0.25


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(temperature=-0.5), "temperature must be >= 0"), (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
     (dict(top_p=1.5), r"top_p must be in \(0, 1\]"), (dict(top_k=-1), "top_k must be >= 0")],
    ids=["temperature", "top-p-zero", "top-p-above-one", "top-k"],
)
def test_bad_sampling_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_trees():
    with pytest.raises(ValueError, match="parents must be -1 for the root"):
        DraftTree([1, 2], [0, 0])
    with pytest.raises(ValueError, match="as many tokens"):
        DraftTree([1, 2], [-1])


def test_greedy_walk_equals_the_distribution_walk():
    """accept_greedy (argmax only) takes the same path and bonus as accept_path on one-hot targets."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(200):
        tree = DraftTree([0, *torch.randint(0, 4, (6,), generator=gen).tolist()], [-1, 0, 0, 1, 1, 2, 4])
        logits = torch.randn(len(tree), 4, generator=gen)
        probs = target_distribution(logits, SamplingParams())
        assert accept_greedy(tree, logits.argmax(-1).tolist()) == accept_path(tree, probs, None)


def test_batched_greedy_chains_equal_the_walk_per_row():
    """accept_greedy_chains (all rows at once, what TargetAcceptance takes for greedy chains) against accept_greedy,
    on chains of every length, with drafts that match the argmax for a while and then do not."""
    from specdec.speculation.acceptance import TargetAcceptance, accept_greedy_chains

    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(40, 6, VOCAB, generator=gen)
    argmax = logits.argmax(-1)
    trees = []
    for row in range(40):
        depth, good = row % 6, row % 4  # drafts that hold the argmax at their parent, then a wrong one
        drafts = []
        for j in range(depth):
            right = int(argmax[row, j])
            drafts.append(right if j < good else (right + 1) % VOCAB)
        trees.append(DraftTree.chain(7, drafts))
    expected = [accept_greedy(tree, argmax[row].tolist()) for row, tree in enumerate(trees)]
    assert accept_greedy_chains(trees, logits) == expected
    greedy = [SamplingParams()] * 40
    assert TargetAcceptance().accept(trees, logits, greedy, [None] * 40) == expected
    assert {len(path) for path, _ in expected} == {1, 2, 3, 4}, "the case covers rejections at every depth"


def test_greedy_trees_accepted_on_the_device_are_the_walk_per_row():
    """greedy_trees (what TargetAcceptance leaves on the device for greedy trees) against accept_greedy, on random
    trees whose nodes often hold the argmax at their parent, with siblings of one token (the first one counts),
    ragged sizes and a one-node tree; through the commit's columns too."""
    from specdec.speculation.acceptance import TargetAcceptance, greedy_trees

    gen = torch.Generator().manual_seed(6)
    rows, width = 30, 9
    logits = torch.randn(rows, width + 2, VOCAB, generator=gen)
    argmax = logits.argmax(-1)
    trees = []
    for row in range(rows):
        size = 1 + row % width
        parents, tokens = [-1], [5]
        for node in range(1, size):
            parent = int(torch.randint(0, node, (), generator=gen))
            likely = bool(torch.rand((), generator=gen) < 0.7)
            tokens.append(int(argmax[row, parent]) if likely else int(torch.randint(0, VOCAB, (), generator=gen)))
            parents.append(parent)
        trees.append(DraftTree(tokens, parents))
    expected = [accept_greedy(tree, argmax[row].tolist()) for row, tree in enumerate(trees)]
    accepted = greedy_trees(trees, logits)
    assert accepted.read() == expected
    columns = accepted.columns(width + 2).tolist()
    assert [row[:len(path)] for row, (path, _) in zip(columns, expected, strict=True)] == [p for p, _ in expected]
    assert all(set(row[len(path):]) == {-1} for row, (path, _) in zip(columns, expected, strict=True))
    params = [SamplingParams()] * rows
    assert TargetAcceptance().accept(trees, logits, params, [None] * rows) == expected
    assert max(len(path) for path, _ in expected) >= 4 and any(
        len({(p, t) for p, t in zip(tree.parents, tree.tokens, strict=True)}) < len(tree.tokens) for tree in trees
    ), "the case has deep paths and siblings of one token"


@pytest.mark.parametrize("shared", [False, True], ids=["own-generators", "one-generator"])
def test_batched_chains_walk_as_the_general_batched_walk(shared):
    """accept_chains (what TargetAcceptance takes when every sampled row is a chain: one read for the whole walk)
    against accept_batch, from the same generator states: the very same paths and bonus tokens, on chains of every
    length, with point-mass drafts and with drawn ones (their laws), drafts likely under the target and not, and one
    generator for every row (the walk's order of draws then matters) or one per row."""
    from specdec.speculation.acceptance import accept_chains

    gen = torch.Generator().manual_seed(5)
    rows, width = 48, 5
    probs = torch.softmax(3 * torch.randn(rows, width, VOCAB, generator=gen), -1)
    probs[::7, :, 2] = 0  # some drafts the target never emits (p(x) = 0)
    probs = probs / probs.sum(-1, keepdim=True)
    trees = []
    for row in range(rows):
        depth = row % width
        if row % 3 == 0:  # drawn from a law: accepted with probability min(1, p / q)
            laws = [torch.softmax(torch.randn(VOCAB, generator=gen), -1) for _ in range(depth)]
            drafts = [sample(law, gen) for law in laws]
        else:  # point masses: likely tokens (p's argmax at the parent) or token 2
            laws = None
            drafts = [int(probs[row, j].argmax()) if (row + j) % 6 else 2 for j in range(depth)]
        trees.append(DraftTree.chain(1, drafts, laws))

    def generators(seed):
        if shared:
            return [torch.Generator().manual_seed(seed)] * rows
        return [torch.Generator().manual_seed(seed + row) for row in range(rows)]

    lengths = set()
    for seed in range(4):
        expected = accept_batch(trees, probs, generators(seed))
        assert accept_chains(trees, probs, generators(seed)) == expected
        lengths |= {len(path) for path, _ in expected}
    assert lengths == set(range(1, width + 1)), f"the case covers every accepted length, got {lengths}"


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_plain_decoding_samples_what_a_draftless_tree_accepts(temperature):
    """The batched sampler (plain decoding) draws what accept gives trees that are their root alone, from the same
    generators: the same tokens for the same seeds."""
    from specdec.speculation import TargetAcceptance
    from specdec.speculation.sampler import SamplerRows, SamplerShape, sample_rows

    logits = torch.randn(9, VOCAB, generator=torch.Generator().manual_seed(5))
    params = [SamplingParams(temperature=temperature, top_k=[0, 3][row % 2], seed=row) for row in range(9)]

    def generators():
        return [torch.Generator().manual_seed(row) for row in range(9)]

    roots = [DraftTree([1], [-1]) for _ in range(9)]
    walked = TargetAcceptance().accept(roots, logits[:, None], params, generators())
    sampled = sample_rows(logits, SamplerRows.of(params, generators()), SamplerShape.of(params))
    assert sampled.tolist() == [token for _, token in walked]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 0.5, 1.0, 1.7]), st.sampled_from([0, 1, 3, 6, 50]),
                          st.sampled_from([1.0, 0.95, 0.6, 0.1])), min_size=1, max_size=9),
       st.integers(0, 2**16))
def test_the_batched_sampler_draws_what_each_row_alone_draws(rows, seed):
    """sample_rows (every row's filters as tensors, one pass) against target_distribution + the inverse-CDF draw of
    each row on its own: the same token for the same uniform, whatever the mix of greedy, top-k and top-p rows."""
    from specdec.speculation.sampler import SamplerRows, SamplerShape, sample_rows

    logits = torch.randn(len(rows), VOCAB * 5, generator=torch.Generator().manual_seed(seed)) * 2
    params = [SamplingParams(temperature=t, top_k=k, top_p=p, seed=seed + row) for row, (t, k, p) in enumerate(rows)]
    batched = sample_rows(logits, SamplerRows.of(params, [torch.Generator().manual_seed(seed + r) for r in
                                                          range(len(rows))]), SamplerShape.of(params))
    for row, p in enumerate(params):
        probs = target_distribution(logits[row], p)
        if p.greedy:
            assert batched[row] == logits[row].argmax()
            continue
        uniform = float(torch.rand((), generator=torch.Generator().manual_seed(seed + row)))
        cdf = probs.double().cumsum(-1)
        expected = torch.searchsorted(cdf, uniform * cdf[-1:], right=True).clamp_max(cdf.shape[-1] - 1)
        assert batched[row] == expected[0], f"row {row}: {p}"


@pytest.mark.parametrize("mix", ["sampled", "greedy-and-sampled"])
def test_chains_accepted_on_device_are_the_host_walks(mix):
    """TargetAcceptance.accept_on_device on chains with sampled rows (the engine commits from it before reading
    it): each sampled row's path and bonus are accept_chains' over the sampled rows from the same generator states,
    each greedy row's accept_greedy's, and the generators end where the host walk leaves them."""
    from specdec.speculation.acceptance import TargetAcceptance, accept_chains, sampled_probs

    gen = torch.Generator().manual_seed(11)
    rows, width = 24, 5
    logits = 3 * torch.randn(rows, width, VOCAB, generator=gen)
    params = [SamplingParams() if mix != "sampled" and row % 3 == 0
              else SamplingParams(temperature=0.7, top_k=0 if row % 2 else 20) for row in range(rows)]
    trees = [DraftTree.chain(1, [int(logits[row, j].argmax()) if (row + j) % 4 else 2 for j in range(row % width)])
             for row in range(rows)]
    sampled = [row for row in range(rows) if not params[row].greedy]
    on_device = [torch.Generator().manual_seed(100 + row) for row in range(rows)]
    accepted = TargetAcceptance().accept_on_device(trees, logits, params, on_device).read()
    host = [torch.Generator().manual_seed(100 + row) for row in sampled]
    walks = dict(zip(sampled, accept_chains([trees[row] for row in sampled], sampled_probs(logits, params, sampled),
                                            host), strict=True))
    argmax = logits.argmax(-1).tolist()
    for row in range(rows):
        assert accepted[row] == (walks[row] if row in walks else accept_greedy(trees[row], argmax[row]))
    assert [float(torch.rand((), generator=on_device[row])) for row in sampled] == [
        float(torch.rand((), generator=g)) for g in host], "the same numbers drawn"
    assert {len(path) for path, _ in accepted} >= {1, 2, 3}
