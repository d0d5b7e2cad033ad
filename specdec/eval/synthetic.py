"""Speculation for throughput benchmarks on random weights, where real drafts are never accepted: `specdec bench
--draft synthetic:MEAN[:SIBLING]`. SyntheticDrafter proposes chains, or static trees (--topk K), of random tokens (no
model, no cost) and SyntheticAcceptance, injected into the engine in place of the target's acceptance, keeps the
first k drafts of each chain, k drawn so that the mean accepted length (the bonus token included) is MEAN. Every
draft is accepted with the same probability alpha given that the one before it was, as a real drafter's acceptance
roughly falls. In a tree, the children of a node stand in rank order (the drafter's most likely first): the first is
kept with probability alpha, and each later one, where those before it were not, with probability SIBLING (default
SIBLING_ACCEPTANCE), so that a chain keeps what it kept and a tree keeps more.

Verification and commit cost what they cost with real drafts of that acceptance; the emitted tokens mean nothing.
Use it to time speculative decoding at the accepted length measured on trained models (specdec eval).

Paired (synthetic_speculation), the drafter and the acceptance share TextCoins: whether a draft is kept is decided by
a uniform draw fixed per (request text, position), as a real drafter's success is a property of the text, not of
the order in which an engine happens to draw. Every engine and every shape then meets the same texts: fixed chains,
adaptive speculation choosing other lengths, and plain decoding in between see the same predictable and
unpredictable positions, so that their rows differ by what they chose, not by their luck (at batch 1 and 64 tokens,
independent draws moved a fixed-chain row by 10-15% between runs: benchmarks/adaptive_replay.py).
"""

from __future__ import annotations

import random

import torch

from drafters.base import Drafter, DraftRequest
from specdec.cache.host_buffer import to_device
from specdec.cache.step import host_longs
from specdec.speculation import DraftTree, SamplingParams, TreeShape
from specdec.speculation.acceptance import AcceptedOnDevice
from specdec.speculation.tree import chain_parents, static_tree_parents

PREFIX = "synthetic:"
# a tree's later sibling kept where those before it were not: fitted to the shipped Qwen3.5's MTP on MT-bench (a
# 4-chain kept 3.09 tokens a step, a static tree of --topk 2 and 16 drafts 3.73: 0.52; its EAGLE-3 head, 3.39 and
# 3.54: 0.15; benchmarks/results/shapes_cpu_2026-12-05.md; the rank model's mean, tests/test_synthetic_trees.py
# expected_kept, solved for the sibling's acceptance at those figures)
SIBLING_ACCEPTANCE = 0.5


class TextCoins:
    """Uniform draws in [0, 1) fixed per (text, position): a request's text is keyed by its first KEY_TOKENS tokens
    (the benchmarks give each request its own random prompt), its draws made in chunks from a generator seeded by
    the key. The drafter marks each tree it proposes with its text and the position of its first draft; the
    acceptance takes the tree's draws from there (draws_for). Marks live for one step."""

    KEY_TOKENS = 16
    CHUNK = 256

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.draws: dict[int, list[float]] = {}  # text key -> draws by position
        self.marks: dict[int, tuple[int, int]] = {}  # id(tree) -> (text key, position of its first draft)
        # request id -> (its tokens list, its text key), once the tokens hold the key's KEY_TOKENS (a key per request
        # and step, a tuple hashed, was ~60 us of the drafter's host work a step at batch 128 on a 2-core CPU, on
        # the path between the acceptance read and the next launch); used while the request's tokens are still that
        # list (a request's tokens list lives as long as it does; another request under the id has its own),
        # forgotten when the request leaves (forget)
        self.keys: dict[int, tuple[list[int], int]] = {}

    def mark(self, trees: list[DraftTree], requests: list[DraftRequest]) -> None:
        keys, marks = self.keys, {}
        for tree, request in zip(trees, requests, strict=True):
            tokens = request.tokens
            known = keys.get(request.request_id)
            if known is not None and known[0] is tokens:
                key = known[1]
            else:
                key = self.key(tokens)
                if len(tokens) >= self.KEY_TOKENS:  # (its text is fixed from then on)
                    keys[request.request_id] = (tokens, key)
            marks[id(tree)] = (key, len(tokens))
        self.marks = marks

    def forget(self, request_id: int) -> None:
        """The request left (its key is worked out again should its id come back)."""
        self.keys.pop(request_id, None)

    def key(self, tokens: list[int]) -> int:
        """The text of a request whose tokens so far are `tokens`."""
        return hash(tuple(tokens[:self.KEY_TOKENS]))

    def draws_for(self, tree: DraftTree, count: int) -> list[float] | None:
        """The draws of the tree's first `count` drafts; None for a tree this step's drafter did not mark."""
        mark = self.marks.get(id(tree))
        if mark is None:
            return None
        return self.at(*mark, count)

    def at(self, key: int, position: int, count: int) -> list[float]:
        """The draws of text `key` at positions position .. position + count - 1."""
        draws = self.draws.setdefault(key, [])
        while len(draws) < position + count:  # (a text's draws, chunk by chunk, each from its own seed)
            generator = torch.Generator().manual_seed(hash((self.seed, key, len(draws))) & (2**63 - 1))
            draws += torch.rand(self.CHUNK, generator=generator, dtype=torch.float64).tolist()
        return draws[position:position + count]


class SyntheticDrafter(Drafter):
    """Chains or static trees (static_tree_parents) of tokens drawn at random from the first request's tokens (a
    benchmark's random prompt gives random tokens: MoE routing as varied as real drafts'), so that it needs no
    vocabulary or model: a pool of POOL of them, drawn once, read in turn (a draw per drafted token costs more host
    time than the rest of a step)."""

    POOL = 8192

    def __init__(self, mean_accepted_length: float, seed: int = 0, text_coins: TextCoins | None = None):
        if mean_accepted_length < 1:
            raise ValueError(f"synthetic:MEAN needs a mean accepted length >= 1 (the bonus token counts), "
                             f"got {mean_accepted_length}")
        self.mean_accepted_length = mean_accepted_length
        self.picks = random.Random(seed)
        self.pool: list[int] = []
        self.cursor = 0
        self.text_coins = text_coins  # marks each tree with its text and position (TextCoins), when paired

    def check_shape(self, shape: TreeShape) -> None:
        if shape.dynamic:
            raise ValueError("the synthetic drafter drafts chains and static trees: drop --dynamic-tree")
        if self.mean_accepted_length > shape.steps + 1:
            raise ValueError(f"a mean accepted length of {self.mean_accepted_length} needs chains of at least "
                             f"{self.mean_accepted_length - 1:g} drafts; raise --num-steps (now {shape.steps})")

    def propose(self, requests: list[DraftRequest], shape: TreeShape) -> list[DraftTree]:
        depth = shape.budget  # (drafted nodes)
        if not self.pool:
            self.pool = self.picks.choices(requests[0].tokens, k=self.POOL)
        # every tree built without DraftTree's checks (valid by construction), sharing one parents list and one
        # list of point masses, read-only: 128 trees cost ~80 us on a 2-core CPU built one by one, on the path
        # between the target's acceptance read and its next launch, for a drafter meant to cost nothing
        parents = list(range(-1, depth)) if shape.topk == 1 else static_tree_parents(shape)
        point_masses, pool, trees = [None] * (depth + 1), self.pool, []
        new_tree, cursor = object.__new__, self.cursor
        for request in requests:
            if cursor + depth > self.POOL:
                cursor = 0
            tree = new_tree(DraftTree)
            tree.tokens, tree.parents, tree.draft_probs = [request.tokens[-1], *pool[cursor:cursor + depth]], \
                parents, point_masses
            trees.append(tree)
            cursor += depth
        self.cursor = cursor
        if self.text_coins is not None:
            self.text_coins.mark(trees, requests)
        return trees

    def finish(self, request_id: int) -> None:
        if self.text_coins is not None:
            self.text_coins.forget(request_id)

    def shadow_drafts(self, requests: list[DraftRequest]) -> list[int | None]:
        """Drafting costs nothing here: a token from the pool per request (SyntheticAcceptance.shadow_kept decides,
        as it decides the drafts of a chain)."""
        if not self.pool:
            self.pool = self.picks.choices(requests[0].tokens, k=self.POOL)
        return [self.pool[(self.cursor + i) % self.POOL] for i in range(len(requests))]


class SyntheticAcceptance:
    """Keeps the first k drafts of each chain, k with mean `mean_accepted_length` - 1; the bonus token is the target's
    argmax after the last kept node (so the target's logits are still read, as a real step reads them).

    depth: the chain length the mean is quoted at. With it every draft is accepted with that length's alpha whatever
    the length of its chain, as a real drafter's acceptance of a draft does not depend on how many follow it: what
    adaptive speculation, choosing shorter chains or none, must see (a chain of 1 then keeps its draft with
    probability alpha, not with the mean's). Without it each chain's alpha meets the mean at the chain's own length.
    text_coins: the draws of the trees its drafter marked (TextCoins); other trees draw from one sequence. In a tree
    one draw per level picks the child kept (ranked_child): the first with probability alpha, as in a chain, a later
    one with probability `sibling` where those before it were not; the path ends where the child picked is not in the
    tree (a level's draw is the draw of that text position, whatever the shape)."""

    def __init__(self, mean_accepted_length: float, seed: int = 0, depth: int | None = None,
                 text_coins: TextCoins | None = None, sibling: float = SIBLING_ACCEPTANCE):
        if not 0.0 <= sibling <= 1.0:
            raise ValueError(f"a sibling's acceptance lies in [0, 1], got {sibling}")
        self.mean_accepted_length = mean_accepted_length
        self.depth = depth
        self.sibling = sibling
        self.text_coins = text_coins
        self.coins = random.Random(seed)  # acceptance draws, on the host: a step draws up to depth per request
        self._alpha: dict[int, float] = {}  # chain depth -> per-draft acceptance probability
        self._kids: tuple[list[int], list[list[int]]] | None = None  # the last tree's parents list and children

    def accept(self, trees: list[DraftTree], logits: torch.Tensor, params: list[SamplingParams],
               generators: list[torch.Generator | None]) -> list[tuple[list[int], int]]:
        return self.accept_on_device(trees, logits, params).read()

    def accept_on_device(self, trees: list[DraftTree], logits: torch.Tensor, params: list[SamplingParams],
                         generators=None) -> AcceptedOnDevice:
        """The kept counts drawn on the host while the device still runs the step (a row's Python after the read was
        the acceptance's 0.5 ms of idle GPU a step at batch 128 on the H200: benchmarks.step_timeline, 2026-12-03),
        the bonus (the argmax after the last kept node) left on the device, as the target's greedy chains are."""
        paths = [self.forced_path(tree) for tree in trees]
        kept = to_device(host_longs([len(path) - 1 for path in paths]), logits.device)
        if all(path[-1] == len(path) - 1 for path in paths):  # chains' paths (and trees' along their first nodes)
            return AcceptedOnDevice(kept, logits.argmax(-1).gather(1, kept[:, None])[:, 0])
        # a tree's path leaves its first nodes: its node indices, -1 padded to the widest tree [B, W], and the bonus
        # after its last node
        width = max(len(tree) for tree in trees)
        nodes = to_device(host_longs([n for path in paths for n in path + [-1] * (width - len(path))],
                                     len(paths), width), logits.device)
        last = to_device(host_longs([path[-1] for path in paths]), logits.device)
        return AcceptedOnDevice(kept, logits.argmax(-1).gather(1, last[:, None])[:, 0], nodes)

    def shadow_kept(self, contexts: list[list[int]], drafts: list[int | None], tokens: list[int]) -> list[bool]:
        """A first draft at the position after contexts[i] kept as a chain's first draft there would be (the text's
        draw there below the per-draft alpha): what a plain step's row would have gained by drafting one token."""
        alpha = self.alpha(self.depth or 1)
        if self.text_coins is None:
            return [draft is not None and self.coins.random() < alpha for draft in drafts]
        coins = self.text_coins
        return [draft is not None and coins.at(coins.key(context), len(context), 1)[0] < alpha
                for context, draft in zip(contexts, drafts, strict=True)]

    def forced_path(self, tree: DraftTree) -> list[int]:
        drafts = len(tree) - 1
        if tree.parents != chain_parents(len(tree)):  # a tree, not a chain
            return self._tree_path(tree, drafts)
        alpha = self.alpha(self.depth or drafts)
        draws = self.text_coins.draws_for(tree, drafts) if self.text_coins is not None and drafts else None
        accepted = 0
        if draws is not None:
            while accepted < drafts and draws[accepted] < alpha:
                accepted += 1
        else:
            while accepted < drafts and self.coins.random() < alpha:
                accepted += 1
        return list(range(accepted + 1))

    def _tree_path(self, tree: DraftTree, drafts: int) -> list[int]:
        """Root to the last node kept, a draw per level (at most `drafts` levels)."""
        if self._kids is None or self._kids[0] is not tree.parents:  # (the drafter's trees share one parents list)
            self._kids = (tree.parents, tree.child_lists())
        kids = self._kids[1]
        if self.depth is None:  # the mean is quoted at the tree's depth
            depth = [0] * len(tree)
            for node in range(1, len(tree)):
                depth[node] = depth[tree.parents[node]] + 1
            alpha = self.alpha(max(depth))
        else:
            alpha = self.alpha(self.depth)
        draws = self.text_coins.draws_for(tree, drafts) if self.text_coins is not None else None
        path, level = [0], 0
        while kids[path[-1]]:
            draw = draws[level] if draws is not None else self.coins.random()
            rank = ranked_child(draw, alpha, self.sibling, len(kids[path[-1]]))
            if rank is None:
                break
            path.append(kids[path[-1]][rank])
            level += 1
        return path

    def alpha(self, depth: int) -> float:
        """The alpha whose expected accepted drafts, alpha + alpha^2 + ... + alpha^depth, is the mean - 1."""
        if depth not in self._alpha:
            wanted = min(self.mean_accepted_length - 1, depth)
            low, high = 0.0, 1.0
            for _ in range(60):
                middle = (low + high) / 2
                low, high = (middle, high) if sum(middle**i for i in range(1, depth + 1)) < wanted else (low, middle)
            self._alpha[depth] = (low + high) / 2
        return self._alpha[depth]


def ranked_child(draw: float, alpha: float, sibling: float, children: int) -> int | None:
    """The rank of the child a uniform `draw` keeps among `children` ranked ones: the first where draw < alpha (as
    a chain's draft), else each later one with probability `sibling` given those before it were not; None: none."""
    if draw < alpha:
        return 0
    rest = (draw - alpha) / (1.0 - alpha)  # uniform in [0, 1) again, given the first was not kept
    for rank in range(1, children):
        if rest < sibling:
            return rank
        rest = (rest - sibling) / (1.0 - sibling)
    return None


def synthetic_speculation(draft: str, depth: int | None = None) -> tuple[SyntheticDrafter, SyntheticAcceptance]:
    """`synthetic:MEAN[:SIBLING]` -> the drafter and the acceptance to give the engine together, sharing the draws
    of each text position (TextCoins); depth: the chain length the mean is quoted at (the engine's TreeShape.depth),
    which fixes the acceptance of each draft (SyntheticAcceptance); SIBLING: a tree's later sibling's acceptance."""
    spec = draft.removeprefix(PREFIX)
    mean, _, sibling = spec.partition(":")
    try:
        value = float(mean)
        kept = float(sibling) if sibling else SIBLING_ACCEPTANCE
        coins = TextCoins()
        return SyntheticDrafter(value, text_coins=coins), SyntheticAcceptance(value, depth=depth, text_coins=coins,
                                                                              sibling=kept)
    except ValueError as error:
        raise ValueError(f"--draft synthetic:MEAN[:SIBLING] takes a mean accepted length and optionally a tree "
                         f"sibling's acceptance, e.g. synthetic:2.9 or synthetic:2.9:0.5; {spec!r}: {error}") from None
