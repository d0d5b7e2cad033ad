"""`specdec bench` on the shipped Qwen3.5 pair (CPU): every backend, mode and batch size gets a row whose figures
agree with each other, with the model's state shapes and with the roofline of the steps it ran; transformers'
generate() as the outside reference; synthetic acceptance and the real-shape random targets for benchmarks (drawn
where they load, nothing on disk but their config)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from specdec.cli import main as cli_main
from specdec.engine.engine import EngineConfig
from specdec.eval.bench import BenchSettings, bench_prompts, full_batch_ms, markdown_table, run_bench
from specdec.eval.peaks import Peaks
from specdec.eval.roofline import Workload, roofline
from specdec.models import load_model
from specdec.presets import resolve


def test_rows_are_consistent(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert cli_main(["bench", "--batch-sizes", "1", "2", "--baseline", "recurrent", "--max-new-tokens", "12",
                     "--prompt-tokens", "24", "--state-memory-gb", "1", "--hf-reference", "--output", str(out),
                     "--peak-copy-gbs", "20", "--peak-gemm-tflops", "0.5"]) == 0
    assert "| recurrent | speculative | 2 |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["peaks"] == {"copy_bytes_per_second": 20e9, "gemm_flops_per_second": 0.5e12, "source": "given"}
    rows = result["rows"]
    reference = [row for row in rows if row["backend"] == "transformers"]
    # decode throughput: the token each request's prefill makes is not counted
    assert [(row["batch_size"], row["new_tokens"]) for row in reference] == [(1, 11), (2, 22)]
    rows = [row for row in rows if row["backend"] != "transformers"]
    assert {(r["backend"], r["mode"], r["batch_size"]) for r in rows} == {
        (backend, mode, batch) for backend in ("kvbuffer", "recurrent") for mode in ("plain", "speculative")
        for batch in (1, 2)}
    by_key = {(r["backend"], r["mode"], r["batch_size"]): r for r in rows}
    spec = load_model(resolve("qwen3.5"), device="cpu").cache_spec()
    state = sum(math.prod(layer.state_shape) for layer in spec.linear) * 4
    entry = sum(math.prod(layer.key_shape) + math.prod(layer.value_shape) + layer.decay_heads
                for layer in spec.linear) * 4
    expected_bytes = {("kvbuffer", "plain"): state + 16 * entry, ("kvbuffer", "speculative"): state + 16 * entry,
                      ("recurrent", "plain"): state, ("recurrent", "speculative"): state * (1 + 4 + 1)}
    for (backend, mode, batch), row in by_key.items():
        assert row["new_tokens"] == 11 * batch
        assert row["tokens_per_second"] == pytest.approx(row["new_tokens"] / row["seconds"])
        assert row["state_mib_per_request"] * 2**20 == pytest.approx(expected_bytes[backend, mode])
        assert row["max_concurrent_requests"] == 2**30 // expected_bytes[backend, mode]
        if backend == "kvbuffer":
            base = by_key["recurrent", mode, batch]["tokens_per_second"]
            assert row["speedup_over_recurrent"] == pytest.approx(row["tokens_per_second"] / base)
        else:
            assert row["speedup_over_recurrent"] is None
        assert (row["mean_accepted_length"] == 1.0) == (mode == "plain")
        assert 0.0 <= row["gc_pause_ms"] <= 1e3 * row["seconds"]  # (the collector's time within the timed steps)
        # one step of the whole batch: within the whole run
        assert 0.0 < row["full_batch_step_ms"] <= 1e3 * row["seconds"]
        # every timed round, in order: together within the run's time (each rounded to 0.1 us)
        rounds = row["step_ms"]
        assert 0.0 < sum(rounds) <= 1e3 * row["seconds"] + 1e-4 * len(rounds)
        if mode == "plain":  # (the whole batch runs every round: its median past the first two is the full-batch one)
            assert row["full_batch_step_ms"] == pytest.approx(sorted(rounds[2:])[(len(rounds) - 3) // 2], abs=1e-4)
        check_roofline_columns(row, batch, peaks=Peaks(20e9, 0.5e12, "given"))
    # the same greedy decoding either way: the drafts are accepted alike
    for batch in (1, 2):
        assert by_key["kvbuffer", "speculative", batch]["mean_accepted_length"] == pytest.approx(
            by_key["recurrent", "speculative", batch]["mean_accepted_length"])


def check_roofline_columns(row: dict, batch: int, peaks: Peaks) -> None:
    """The roofline of a row's steps: between that of its batch at the prompt's context and at the longest context
    (plain rows: the batch runs whole to its end, so every step is that batch), its parts adding up, the measured
    step over it, and for KVBuffer rows the baseline's roofline over ours on the same steps."""
    assert sum(row["roofline_ms_by_part"].values()) == pytest.approx(row["roofline_ms_per_step"])
    assert row["x_roofline"] == pytest.approx(row["ms_per_step"] / row["roofline_ms_per_step"])
    assert (row["roofline_speedup_over_recurrent"] is not None) == (row["backend"] == "kvbuffer")
    if row["mode"] != "plain":
        return
    config = load_model(resolve("qwen3.5"), device="cpu").hf_config
    flush = 16 if row["backend"] == "kvbuffer" else 1
    bounds = [roofline(config, Workload(batch, backend=row["backend"], flush_length=flush, context=context,
                                        dtype_bytes=4), peaks).ms_per_step for context in (25, 24 + 12)]
    assert bounds[0] <= row["roofline_ms_per_step"] <= bounds[1]
    if row["backend"] == "kvbuffer":  # the shipped model's state is small next to its weights: near 1, above it
        assert 1.0 < row["roofline_speedup_over_recurrent"] < 1.5


def test_bad_batch_sizes_are_refused():
    with pytest.raises(ValueError, match="--batch-sizes needs values >= 1"):
        run_bench(BenchSettings(target="qwen3.5", batch_sizes=(0,)))


def test_each_request_gets_its_own_prompt():
    """A batch of one prompt would route every token of a MoE layer to the same experts: the prompts differ, are of
    one length, and are the same in every run."""
    class Model:  # bench_prompts reads the vocabulary size only
        hf_config = type("Config", (), {"vocab_size": 1000})()

    llm = type("LLM", (), {"model": Model()})()
    settings = BenchSettings(target="qwen3.5", prompt_tokens=16)
    prompts = bench_prompts(llm, settings, 64)
    assert len(prompts) == 64 and {len(p) for p in prompts} == {16}
    assert len({tuple(p) for p in prompts}) == 64
    assert all(2 <= t < 1000 for p in prompts for t in p)
    assert bench_prompts(llm, settings, 64) == prompts


def test_synthetic_drafts_are_accepted_at_the_mean_asked_for():
    from specdec.eval.synthetic import SyntheticAcceptance, SyntheticDrafter
    from specdec.speculation import DraftTree, TreeShape

    drafter, acceptance = SyntheticDrafter(2.9, seed=3), SyntheticAcceptance(2.9, seed=3)
    drafter.check_shape(TreeShape(steps=4))
    alpha = acceptance.alpha(4)
    assert sum(alpha**i for i in range(1, 5)) == pytest.approx(1.9)
    chain = DraftTree([0, 1, 2, 3, 4], [-1, 0, 1, 2, 3])
    lengths = [len(acceptance.forced_path(chain)) for _ in range(20000)]
    assert sum(lengths) / len(lengths) == pytest.approx(2.9, abs=0.03)
    assert set(lengths) == {1, 2, 3, 4, 5}
    with pytest.raises(ValueError, match="raise --num-steps"):
        drafter.check_shape(TreeShape(steps=1))
    with pytest.raises(ValueError, match="drop --dynamic-tree"):
        drafter.check_shape(TreeShape(steps=4, topk=4, dynamic=True))


def test_synthetic_acceptance_returns_each_rows_forced_path_and_the_argmax_after_it():
    """The acceptance's paths (drawn before the logits are read) and bonus tokens (read per row on the device): the
    forced path of each tree, as a fresh acceptance of the same seed draws them, and the argmax at its last node."""
    from specdec.eval.synthetic import SyntheticAcceptance
    from specdec.speculation import DraftTree, SamplingParams

    trees = [DraftTree(list(range(n + 1)), list(range(-1, n))) for n in (4, 0, 2, 4, 1, 3) * 20]
    logits = torch.randn(len(trees), 5, 50, generator=torch.Generator().manual_seed(0))
    ours = SyntheticAcceptance(2.5, seed=7, depth=4).accept(trees, logits, [SamplingParams()] * len(trees),
                                                           [None] * len(trees))
    reference = SyntheticAcceptance(2.5, seed=7, depth=4)
    expected = []
    for row, tree in enumerate(trees):
        path = reference.forced_path(tree)
        expected.append((path, int(logits[row, path[-1]].argmax())))
    assert ours == expected
    assert {len(path) for path, _ in ours} == {1, 2, 3, 4, 5}


def test_synthetic_acceptance_of_a_draft_does_not_depend_on_the_chain_length():
    """Quoted at a depth (the engine's chains), a shorter chain (adaptive speculation) keeps each draft with that
    depth's alpha: a collapsed mean of 1.2 at depth 4 keeps a lone draft some 17% of the time, not 20%."""
    from specdec.eval.synthetic import SyntheticAcceptance
    from specdec.speculation import DraftTree

    acceptance = SyntheticAcceptance(1.2, seed=1, depth=4)
    alpha = acceptance.alpha(4)
    assert sum(alpha**i for i in range(1, 5)) == pytest.approx(0.2) and 0.16 < alpha < 0.17
    lone = [len(acceptance.forced_path(DraftTree([0, 1], [-1, 0]))) - 1 for _ in range(20000)]
    assert sum(lone) / len(lone) == pytest.approx(alpha, abs=0.01)
    assert acceptance.forced_path(DraftTree([0], [-1])) == [0]
    unquoted = SyntheticAcceptance(1.2, seed=1)  # each chain meets the mean at its own length
    lone = [len(unquoted.forced_path(DraftTree([0, 1], [-1, 0]))) - 1 for _ in range(20000)]
    assert sum(lone) / len(lone) == pytest.approx(0.2, abs=0.01)


def test_paired_synthetic_drafts_are_kept_by_their_text_position_whatever_the_shape():
    """Paired, the drafter and the acceptance decide each draft by a draw fixed per (text, position): a 4-chain and a
    2-chain drafted at the same position of the same text keep the same leading drafts, a chain drafted one position
    later (after a plain step) reads the draws from there, another text has draws of its own, and the mean over
    many texts is the one asked for."""
    from drafters.base import DraftRequest
    from specdec.eval.synthetic import synthetic_speculation
    from specdec.speculation import SamplingParams, TreeShape

    def kept(pair, tokens, steps):
        drafter, acceptance = pair
        (tree,) = drafter.propose([DraftRequest(0, tokens, SamplingParams(), None)], TreeShape(steps=steps))
        return len(acceptance.forced_path(tree)) - 1

    texts = [[text] * 20 + list(range(30)) for text in range(400)]
    four = [kept(synthetic_speculation("synthetic:2.5", 4), text, 4) for text in texts]
    two = [kept(synthetic_speculation("synthetic:2.5", 4), text, 2) for text in texts]
    assert two == [min(k, 2) for k in four]  # the same draws, whichever engine and shape
    pair = synthetic_speculation("synthetic:2.5", 4)
    assert [kept(pair, text, 4) for text in texts] == four  # and again in the same engine
    later = [kept(pair, text + [7], 4) for text in texts]  # one position further on
    for k, n in zip(four, later, strict=True):  # its first k - 1 positions were kept, the k-th was not
        assert n == k - 1 if 0 < k < 4 else (n >= 3 if k == 4 else True)
    assert sum(four) / len(four) == pytest.approx(1.5, abs=0.15) and len(set(four)) == 5


def test_paired_synthetic_text_keys_follow_each_request():
    """The drafter's text keys, kept per request while its tokens grow (TextCoins.keys), give the draws a fresh pair
    gives the same tokens; another request under the same id (its own tokens) and a finished one get theirs."""
    from drafters.base import DraftRequest
    from specdec.eval.synthetic import synthetic_speculation
    from specdec.speculation import SamplingParams, TreeShape

    def kept(pair, request):
        drafter, acceptance = pair
        (tree,) = drafter.propose([request], TreeShape(steps=4))
        return len(acceptance.forced_path(tree)) - 1

    pair, tokens = synthetic_speculation("synthetic:2.5", 4), list(range(20))
    request = DraftRequest(0, tokens, SamplingParams(), None)
    for step in range(30):  # the same list, grown as the engine grows a request's tokens
        fresh = kept(synthetic_speculation("synthetic:2.5", 4), DraftRequest(0, list(tokens), SamplingParams(), None))
        assert kept(pair, request) == fresh
        tokens.append(step)
    texts = [[text] * 20 for text in range(50)]
    alone = [kept(synthetic_speculation("synthetic:2.5", 4), DraftRequest(0, text, SamplingParams(), None))
             for text in texts]
    assert [kept(pair, DraftRequest(0, text, SamplingParams(), None)) for text in texts] == alone  # (one id)
    pair[0].finish(0)
    assert 0 not in pair[1].text_coins.keys


def test_adaptive_rows_beside_plain_and_fixed_with_the_shapes_chosen(tmp_path):
    """--speculation fixed adaptive: a row per mode (here the adaptive engine alone); it counts the shapes of its
    timed steps, its policy starting from the roofline of the target's step; --policy-trace records each step's
    decision, the warm-up's and the timed ones."""
    import json

    from specdec.eval.bench import load_llm
    from specdec.eval.step_cost import with_device_prior

    trace = tmp_path / "policy.jsonl"
    settings = BenchSettings(target="qwen3.5", draft="synthetic:1.2", batch_sizes=(2,), max_new_tokens=8,
                             prompt_tokens=8, flush_length=4, device="cpu", speculation=("fixed", "adaptive"),
                             only=("kvbuffer", "adaptive"), policy_trace=str(trace))
    peaks = Peaks(20e9, 200e9, "test")
    (row,) = run_bench(settings, peaks)
    steps = round(1e3 * row.seconds / row.ms_per_step)
    assert row.mode == "adaptive" and sum(row.shapes.values()) == steps
    decisions = [json.loads(line) for line in trace.read_text().splitlines()]
    timed = [d for d in decisions if d["timed"]]
    assert len(timed) == steps and len(decisions) > steps  # the warm-up's steps recorded before them
    shapes = {0: "plain", 1: "chain-1", 2: "chain-2", 4: "chain-4"}
    assert {shapes[d["steps"]] for d in timed} == set(row.shapes)
    assert all(d["batch_size"] == 2 and set(d["estimated_ms"]) == {"0", "1", "2", "4"} for d in decisions)
    assert all(d["measured_ms"] is None or d["measured_ms"] > 0 for d in decisions)
    # whether each step was a probe, and its rows' shadow drafts kept (the synthetic drafter makes them)
    assert all(isinstance(d["probe"], bool) and (d["shadow_kept"] is None or 0 <= d["shadow_kept"] <= 1)
               for d in decisions)
    assert set(row.shapes) <= {"plain", "chain-1", "chain-2", "chain-4"}
    table = markdown_table([row], 40.0)
    assert "shapes chosen" in table and "| kvbuffer | adaptive | 2 |" in table
    llm = load_llm(settings, "kvbuffer", "adaptive")
    with_device_prior(llm, peaks)
    prior = llm.engine.policy.cost.prior
    assert 0 < prior(1, 2, 100.0) < prior(64, 5, 100.0)
    with pytest.raises(ValueError, match=r"modes \['plain', 'speculative'\]"):
        run_bench(BenchSettings(**{**settings.__dict__, "speculation": ("fixed",)}), peaks)
    with pytest.raises(ValueError, match="speculation takes"):
        BenchSettings(target="qwen3.5", speculation=("sometimes",))


def test_the_engine_accepts_what_the_synthetic_acceptance_forces():
    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig
    from specdec.eval.synthetic import synthetic_speculation

    drafter, acceptance = synthetic_speculation("synthetic:3.0")
    llm = LLM("qwen3.5", drafter, device="cpu", config=EngineConfig.from_flags(max_batch=4, max_seq_len=256,
                                                                               speculation="fixed"),
              acceptance=acceptance)
    outputs = llm.generate(["a", "b", "c", "d"], max_new_tokens=100)
    steps = [n for out in outputs for n in out.stats.emitted_per_step]
    assert sum(steps) / len(steps) == pytest.approx(3.0, abs=0.35) and max(steps) == 5
    with pytest.raises(ValueError, match="e.g. synthetic:2.9"):
        synthetic_speculation("synthetic:lots")


def test_real_shapes():
    from specdec.models.real_shapes import nemotron3_nano, qwen35_9b, qwen35_35b_a3b

    qwen = qwen35_9b()
    assert qwen.num_hidden_layers == 32 and qwen.layer_types.count("full_attention") == 8
    assert (qwen.linear_num_value_heads, qwen.linear_key_head_dim, qwen.hidden_size) == (32, 128, 4096)
    moe = qwen35_35b_a3b()
    assert moe.model_type == "qwen3_5_moe_text" and moe.layer_types.count("full_attention") == 10
    assert (moe.hidden_size, moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size,
            moe.shared_expert_intermediate_size) == (2048, 256, 8, 512, 512)
    assert (moe.num_attention_heads, moe.num_key_value_heads, moe.head_dim, moe.linear_num_key_heads,
            moe.linear_num_value_heads, moe.vocab_size) == (16, 2, 256, 16, 32, 248320)
    nano = nemotron3_nano()
    assert len(nano.layers_block_type) == 52 and nano.layers_block_type.count("full_attention") == 6
    assert nano.layers_block_type.count("moe") == 23 and nano.layers_block_type.count("linear_attention") == 23
    assert nemotron3_nano(8).layers_block_type[:6] == ["linear_attention", "moe", "linear_attention", "moe",
                                                       "linear_attention", "full_attention"]
    # long-context benchmarks (paired_adaptive --prompt-tokens) are admitted: Qwen3.5's native context, not 8192
    assert {config.max_position_embeddings for config in (qwen, moe, nano)} == {262144}
    with pytest.raises(ValueError, match="known: qwen3.5-9b, qwen3.5-35b-a3b, nemotron-3-nano"):
        resolve("random:llama-8b")
    with pytest.raises(ValueError, match="1 to 32 layers"):
        resolve("random:qwen3.5-9b:40")
    with pytest.raises(ValueError, match="layer count"):
        resolve("random:qwen3.5-9b:many")


def test_a_random_target_is_its_config_alone(tmp_path, monkeypatch):
    """random:NAME writes a config and a seed, no weights: the 35B model costs a few KB of disk."""
    from transformers import AutoConfig

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    directory = Path(resolve("random:qwen3.5-35b-a3b:4"))
    assert directory.parent == tmp_path / "random"
    assert sorted(p.name for p in directory.iterdir()) == ["config.json", "random_weights.json"]
    assert sum(p.stat().st_size for p in directory.iterdir()) < 20_000
    config = AutoConfig.from_pretrained(directory)
    assert (config.model_type, config.num_hidden_layers, config.num_experts) == ("qwen3_5_moe_text", 4, 256)


@pytest.mark.parametrize("family", ["qwen3.5", "qwen3.5-moe", "nemotron-h"])
def test_a_random_target_builds_as_its_checkpoint_would_load(tmp_path, family):
    """Drawn where it is built, in the dtype asked (the fp32 parameters stay fp32), with the parameters, shapes,
    dtypes and weight scales of the same config written as a checkpoint and loaded; it decodes finite logits."""
    from specdec.api import LLM
    from specdec.models.random_checkpoint import random_target, transformers_random_model
    from tests.tiny_models import nemotron_h_config, qwen35_text_config, save_tiny

    config = {"qwen3.5": qwen35_text_config(), "qwen3.5-moe": qwen35_text_config(moe=True),
              "nemotron-h": nemotron_h_config()}[family]
    random_target(config, tmp_path / "random", seed=0)
    written = save_tiny(config, tmp_path / "checkpoint", seed=0)
    # transformers' model of it too (bench's outside reference), drawn alike
    reference = transformers_random_model(tmp_path / "random", "cpu", torch.bfloat16)
    assert {n: p.shape for n, p in reference.named_parameters()} == {n: p.shape for n, p in written.named_parameters()}
    head = reference.get_output_embeddings().weight
    assert head.dtype == torch.bfloat16 and torch.isfinite(head).all()
    drawn = load_model(tmp_path / "random", device="cpu", dtype=torch.bfloat16)
    loaded = load_model(tmp_path / "checkpoint", device="cpu", dtype=torch.bfloat16)
    ours, theirs = dict(drawn.state_dict()), dict(loaded.state_dict())
    assert ours.keys() == theirs.keys()
    for name, tensor in ours.items():
        assert (tensor.shape, tensor.dtype) == (theirs[name].shape, theirs[name].dtype), name
        assert torch.isfinite(tensor).all(), name
        if tensor.ndim >= 2:  # unit-scale noise over sqrt(fan-in), as the checkpoint's
            assert tensor.float().std().item() == pytest.approx(theirs[name].float().std().item(), rel=0.3), name
    small = EngineConfig.from_flags(max_batch=2, max_seq_len=64, speculation="fixed")
    assert decodes_finite_logits(LLM(str(tmp_path / "random"), device="cpu", config=small))


def decodes_finite_logits(llm) -> bool:
    """Prefill and a few decode steps of two prompts, every LM-head output finite (eager steps: the check reads
    the logits)."""
    finite = []
    hook = llm.model.lm_head.register_forward_hook(lambda _, __, out: finite.append(bool(torch.isfinite(out).all())))
    out = llm.generate([[3, 4, 5], [6, 7]], max_new_tokens=6)
    hook.remove()
    return all(o.token_ids for o in out) and len(finite) > 1 and all(finite)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["qwen3.5-9b", "qwen3.5-35b-a3b", "nemotron-3-nano"])
def test_real_shape_random_targets_decode_finite_in_bf16(name):
    """The weight scale keeps bf16 activations finite through the real widths (the first 8 layers of each)."""
    from specdec.api import LLM

    config = EngineConfig.from_flags(max_batch=2, max_seq_len=64, cuda_graphs=False, speculation="fixed")
    assert decodes_finite_logits(LLM(f"random:{name}:8", device="cuda", config=config))


@pytest.mark.parametrize("backend", ["kvbuffer", "recurrent"])
def test_the_memory_column_is_what_the_pools_hold(backend):
    """State MiB per request (and so requests in the budget) is what the engine's linear-attention pools allocate
    per request slot: committed state + buffer entries, or committed state + the reserved node states."""
    from specdec.eval.bench import linear_state_bytes, load_llm

    settings = BenchSettings(target="qwen3.5", draft="synthetic:2.7", batch_sizes=(3,), max_new_tokens=8,
                             device="cpu")
    llm = load_llm(settings, backend, "speculative")
    cache = llm.engine.runner.cache
    held = sum(pool.linear_state.nbytes() + sum(t.numel() * t.element_size()
                                                for t in (pool.state, pool.buf_key, pool.buf_value, pool.buf_gcum))
               for pool in cache.linear)
    assert held == cache.config.max_requests * linear_state_bytes(llm, settings, backend, "speculative")


def test_the_prefill_budget_reaches_the_engines_of_bench_and_eval():
    from specdec.eval import bench, run

    settings = BenchSettings(target="qwen3.5", batch_sizes=(2,), device="cpu", max_prefill_tokens=64)
    assert bench.load_llm(settings, "kvbuffer", "plain").engine.config.max_prefill_tokens == 64
    evaluation = run.EvalSettings(target="qwen3.5", draft=None, dataset="mt-bench", device="cpu", max_prefill_tokens=32)
    assert run.load_llm(evaluation, "plain", 2).engine.config.max_prefill_tokens == 32


def test_what_does_not_fit_the_device_is_a_row_not_a_crash(monkeypatch):
    """An engine whose pools do not fit (here: the baseline's speculative engine), or a batch that runs out of
    memory mid-run (the kvbuffer plain batch of 2), gives rows marked out of memory; the rest is measured. Any other
    error is raised."""
    from specdec.eval import bench

    load, time_batch = bench.load_llm, bench.time_batch

    def load_or_fail(settings, backend, mode):
        if (backend, mode) == ("recurrent", "speculative"):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return load(settings, backend, mode)

    def time_or_fail(llm, prompt, batch_size, settings, backend, mode, *rest):
        if (backend, mode, batch_size) == ("kvbuffer", "plain", 2):  # a kernel launch running out, as Triton says
            raise RuntimeError("Triton Error [CUDA]: out of memory")
        return time_batch(llm, prompt, batch_size, settings, backend, mode, *rest)

    monkeypatch.setattr(bench, "load_llm", load_or_fail)
    monkeypatch.setattr(bench, "time_batch", time_or_fail)
    rows = run_bench(BenchSettings(target="qwen3.5", draft="synthetic:2.5", batch_sizes=(1, 2, 3), baseline=True,
                                   max_new_tokens=6, prompt_tokens=8, device="cpu"))
    failed = {(r.backend, r.mode, r.batch_size) for r in rows if r.out_of_memory}
    assert failed == {("kvbuffer", "plain", 2), ("kvbuffer", "plain", 3), ("recurrent", "speculative", 1),
                      ("recurrent", "speculative", 2), ("recurrent", "speculative", 3)}
    assert all(r.tokens_per_second > 0 for r in rows if not r.out_of_memory) and len(rows) == 12
    by_key = {(r.backend, r.mode, r.batch_size): r for r in rows}
    assert by_key["kvbuffer", "speculative", 1].speedup_over_recurrent is None  # nothing to compare with
    assert by_key["kvbuffer", "plain", 1].speedup_over_recurrent is not None
    assert "| kvbuffer | plain | 2 | out of memory |" in bench.markdown_table(rows, 40.0)
    assert not bench.out_of_memory(RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered"))


def test_a_phase_memory_line_reads_the_allocator_and_the_driver(monkeypatch):
    from specdec.eval import device_memory

    gib = 2**30
    assert device_memory.phase_line(torch.device("cpu")) is None  # no allocator figures off CUDA
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (12 * gib, 140 * gib))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 100 * gib)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 110 * gib)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: 126 * gib)
    assert device_memory.phase_line(torch.device("cuda")) == (
        "allocated 100.0 GiB, reserved 110.0, peak reserved 126.0, free 12.0 of 140.0")


def test_the_largest_batch_in_memory_is_read_off_one_batch():
    """80 GiB device, 1 GiB not ours, 20 GiB of weights; pools 0.25 GiB per request slot; the batch of 16 peaked
    4 GiB above the built engine (activations 0.25 GiB per request): (80 - 1 - 20) / (0.25 + 0.25) = 118."""
    from specdec.eval.device_memory import EngineMemory, largest_batch

    gib = 2**30
    memory = EngineMemory(device_total=80 * gib, not_ours=gib, fixed=20 * gib, pools_per_request=gib / 4,
                          built=28 * gib)
    assert largest_batch(memory, peak=32 * gib, batch=16) == 118


def test_full_batch_step_is_the_median_of_whole_batch_rounds_past_the_first_two():
    rounds = [(4, 9.0), (4, 5.0), (4, 0.002), (4, 0.004), (4, 0.003), (3, 0.001), (1, 0.0005)]
    assert full_batch_ms(rounds, 4) == pytest.approx(3.0)  # (the refill's 9 s and 5 s left out, the tail's too)
    assert full_batch_ms(rounds[:2], 4) is None
