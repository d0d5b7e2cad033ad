"""A whole model scoring token trees through the KVBuffer cache: every node's logits equal those of its root path
decoded as a plain chain, and committing an accepted path leaves the cache exactly as decoding that path would.
(The chain path itself is checked against transformers in test_model_parity.)"""

from __future__ import annotations

import pytest
import torch

from specdec import CacheConfig, ModelRunner, StepBatch, load_model
from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny

# Two requests per step: a short prompt (buffer only, no committed state) and a long one (chunked prefill).
PROMPTS = [[5, 9, 2], [int(t) for t in torch.randint(0, 90, (21,), generator=torch.Generator().manual_seed(3))]]
TREES = [
    # tokens, parents (topological; -1 = child of the last committed token), accepted root-to-leaf path
    ([11, 12, 13, 14, 15, 16, 17], [-1, 0, 0, 1, 1, 2, 5], [0, 2, 5, 6]),
    ([21, 22, 23, 24], [-1, -1, 0, 2], [1]),
]


def root_path(parents: list[int], node: int) -> list[int]:
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.fixture(scope="module", params=["qwen3_5", "nemotron_h"])
def model(request, tmp_path_factory):
    config = qwen35_text_config() if request.param == "qwen3_5" else nemotron_h_config()
    directory = tmp_path_factory.mktemp(request.param)
    save_tiny(config, directory, seed=11)
    return load_model(directory, device="cpu")


def chain_logits(model, flush_length: int, sequences: list[list[int]]) -> list[torch.Tensor]:
    """Last-token logits of each sequence, prefilled as a plain chain on a fresh cache."""
    runner = ModelRunner.create(model, CacheConfig(max_requests=len(sequences), max_seq_len=64,
                                                   flush_length=flush_length))
    slots = [runner.cache.allocate_request() for _ in sequences]
    return list(runner.prefill(slots, sequences))


@pytest.mark.parametrize("flush_length", [1, 4, 16], ids=lambda length: f"L{length}")
def test_tree_nodes_match_their_root_paths_and_commit_matches_decoding(model, flush_length):
    runner = ModelRunner.create(model, CacheConfig(max_requests=2, max_seq_len=64, flush_length=flush_length))
    slots = [runner.cache.allocate_request() for _ in PROMPTS]
    runner.prefill(slots, PROMPTS)
    batch = StepBatch.trees(slots, [tree[0] for tree in TREES], [tree[1] for tree in TREES])
    hidden, ctx = runner.score(batch)
    logits = model.compute_logits(hidden)  # [B, T, V]

    for row, (prompt, (tokens, parents, _)) in enumerate(zip(PROMPTS, TREES, strict=True)):
        paths = [prompt + [tokens[i] for i in root_path(parents, node)] for node in range(len(tokens))]
        expected = chain_logits(model, flush_length, paths)
        for node, reference in enumerate(expected):
            torch.testing.assert_close(logits[row, node], reference, atol=2e-5, rtol=0,
                                       msg=lambda m, row=row, node=node: f"row {row} node {node}: {m}")

    accepted = [tree[2] for tree in TREES]
    width = max(len(path) for path in accepted)
    accepted_tensor = torch.tensor([path + [-1] * (width - len(path)) for path in accepted])
    runner.cache.commit(ctx, accepted_tensor, torch.tensor([len(path) for path in accepted]))

    # Continue greedily from the committed cache; compare with a fresh cache that decoded the same tokens.
    histories = [prompt + [tree[0][i] for i in path] for prompt, tree, path in zip(PROMPTS, TREES, accepted,
                                                                                    strict=True)]
    next_tokens = [3, 4]
    for _ in range(6):
        step_logits = runner.decode(slots, next_tokens)
        histories = [history + [token] for history, token in zip(histories, next_tokens, strict=True)]
        expected = chain_logits(model, flush_length, histories)
        for row in range(2):
            torch.testing.assert_close(step_logits[row], expected[row], atol=2e-5, rtol=0)
        next_tokens = step_logits.argmax(-1).tolist()
    assert [runner.cache.committed_length(slot) for slot in slots] == [len(h) for h in histories]
