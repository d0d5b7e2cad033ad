"""What each rank of the tensor-parallel tests runs, in processes of their own (torch.multiprocessing, spawn), and
the launcher. A rank writes its results (or its traceback) to files in OUT, for the test to compare. The engine and
the drafters are imported where used: a rank that only computes logits starts in half the time."""

from __future__ import annotations

import os
import random
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from specdec import CacheConfig, ModelRunner, load_model
from specdec.parallel import SINGLE, TensorParallel, TensorParallelError, init_tensor_parallel, shutdown

DECODE_STEPS = 4
NEW_TOKENS = 24
# the shipped Qwen3.5 pair (specdec/checkpoints): its draft model, MTP layer and EAGLE-3 head under TP
SHIPPED_DRAFTERS = ("small", "mtp", "eagle3")
SHIPPED_PROMPTS = ["The history of Rome", "def fibonacci(n):", "Once upon a time there was"]
SHIPPED_TOKENS = 16
ADAPTIVE_TOKENS = 32  # (its first steps explore every shape, the ones after choose)
# `specdec eval` on two prompts of a shipped set, plain and speculative (the shipped draft)
EVAL_ARGS = ["eval", "--device", "cpu", "--dataset", "mt-bench", "--num-prompts", "2", "--max-new-tokens", "12",
             "--batch-size", "2"]

# `specdec bench` of adaptive speculation on synthetic drafts, its policy's decisions traced
BENCH_ARGS = ["bench", "--device", "cpu", "--draft", "synthetic:2.5", "--batch-sizes", "2", "--max-new-tokens", "12",
              "--prompt-tokens", "8", "--speculation", "adaptive", "--peak-copy-gbs", "20", "--peak-gemm-tflops", "0.2"]


def prompts(vocab: int) -> list[list[int]]:
    """Ragged prompts across the flush length; repeated patterns, so the n-gram drafter gets tokens accepted."""
    generator = torch.Generator().manual_seed(5)
    pattern = torch.randint(0, vocab, (5,), generator=generator).tolist()
    return [pattern * 3, torch.randint(0, vocab, (2,), generator=generator).tolist(),
            torch.randint(0, vocab, (7,), generator=generator).tolist() + pattern * 2]


def runner_logits(model) -> dict:
    """The runner's prefill logits [B, T, V] and DECODE_STEPS greedy decode logits [steps, B, V] for prompts()."""
    batch = prompts(model.hf_config.vocab_size)
    runner = ModelRunner.create(model, CacheConfig(max_requests=3, max_seq_len=64, flush_length=3))
    slots = [runner.cache.allocate_request() for _ in batch]
    prefill = runner.prefill(slots, batch, all_logits=True)
    tokens = [int(prefill[row, len(prompt) - 1].argmax()) for row, prompt in enumerate(batch)]
    steps = []
    for _ in range(DECODE_STEPS):
        steps.append(runner.decode(slots, tokens))
        tokens = steps[-1].argmax(-1).tolist()
    return {"prefill": prefill.cpu(), "decode": torch.stack(steps).cpu()}


def logits(directory: Path, tp: TensorParallel, device: str = "cpu") -> dict:
    return runner_logits(load_model(directory, device=device, dtype=torch.float32, tp=tp))


def logits_and_outputs(directory: Path, tp: TensorParallel, device: str = "cpu") -> dict:
    """runner_logits, and the engine's greedy outputs, plain and n-gram speculative (with the tokens accepted
    beyond the root; its prompts prefilled 8 tokens a forward, the longer two in pieces), from CUDA graphs on a GPU.
    fp32 throughout."""
    from drafters import NgramDrafter
    from specdec.engine.engine import Engine, EngineConfig
    from specdec.speculation import SamplingParams, TreeShape

    model = load_model(directory, device=device, dtype=torch.float32, tp=tp)
    batch = prompts(model.hf_config.vocab_size)
    result = {**runner_logits(model), "spec": model.cache_spec()}
    for name, drafter, prefill_tokens in (("plain", None, 16384), ("ngram", NgramDrafter(), 8)):
        config = EngineConfig(cache=CacheConfig(max_requests=3, max_seq_len=96, flush_length=3),
                              shape=TreeShape(steps=3), max_prefill_tokens=prefill_tokens, speculation="fixed")
        engine = Engine(model, drafter, config)
        requests = [engine.add_request(prompt, SamplingParams(), NEW_TOKENS) for prompt in batch]
        engine.run()
        result[name] = [request.output for request in requests]
        result[f"{name}_accepted"] = sum(sum(r.stats.emitted_per_step) - len(r.stats.emitted_per_step)
                                         for r in requests)
    return result


def shipped_drafters(tp_size: int, device: str = "cpu") -> dict:
    """Greedy answers of the shipped Qwen3.5 to SHIPPED_PROMPTS through specdec.LLM in fp32: plain, and with each
    of SHIPPED_DRAFTERS (with the draft tokens each got accepted). device "cuda": the rank's GPU."""
    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig

    config = EngineConfig.from_flags(max_batch=len(SHIPPED_PROMPTS), max_seq_len=96, num_steps=3, speculation="fixed")
    result = {}
    for draft in (None, *SHIPPED_DRAFTERS):
        llm = LLM("qwen3.5", draft, device=device, dtype="fp32", config=config, tp=tp_size)
        outputs = llm.generate(SHIPPED_PROMPTS, max_new_tokens=SHIPPED_TOKENS)
        result[draft or "plain"] = [out.token_ids for out in outputs]
        result[f"{draft}_accepted"] = sum(sum(out.stats.emitted_per_step) - out.stats.steps for out in outputs)
    return result


def adaptive_answers(tp_size: int, rank: int) -> dict:
    """Greedy answers of the shipped Qwen3.5 to SHIPPED_PROMPTS with adaptive speculation (the draft model's chains
    and a static tree) through specdec.LLM in fp32, each rank given a roofline prior at peaks of its own, and each but
    rank 0 on a clock of its own: its time.perf_counter reads up to 20 ms late at random, so the step times it
    measures are nothing like rank 0's (steps of a few ms here). Its policy plans alike only if it prices shapes at
    rank 0's peaks and times. `specdec serve`'s warm-up runs first. -> the answers, each request's drafts per step,
    the policy's shapes, the warm-up's prompt lengths and the step costs it left."""
    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig
    from specdec.eval.peaks import Peaks
    from specdec.eval.step_cost import with_device_prior
    from specdec.serve import cli as serve_cli

    config = EngineConfig.from_flags(max_batch=len(SHIPPED_PROMPTS), max_seq_len=96, num_steps=3, topk=2,
                                     num_draft_tokens=6, speculation="adaptive")
    llm = LLM("qwen3.5", "small", device="cpu", dtype="fp32", config=config, tp=tp_size)
    # each rank given peaks of its own, a memory-bound machine's on rank 0, compute-bound ones on the others: the
    # policies' priors (the shapes' costs before any is measured) agree only if every rank takes rank 0's
    with_device_prior(llm, Peaks(20e9 * (1 + 99 * rank), 200e9 / (1 + 99 * rank), f"rank {rank}'s"))
    real, noise = time.perf_counter, random.Random(rank)
    if rank:
        time.perf_counter = lambda: real() + noise.uniform(0.0, 0.02)
    try:
        # `specdec serve`'s warm-up first, as its ranks run it on GPUs (here the CPU's, which it skips, made to run):
        # the policy keeps the step costs it measured there, each rank's from rank 0's times
        serve_cli.compiles_kernels, compiles = (lambda _: True), serve_cli.compiles_kernels
        try:
            warmed = serve_cli.warm_kernels(llm, announce=False)
        finally:
            serve_cli.compiles_kernels = compiles
        costs = dict(llm.engine.policy.cost.factors)
        outputs = llm.generate(SHIPPED_PROMPTS, max_new_tokens=ADAPTIVE_TOKENS)
    finally:
        time.perf_counter = real
    return {"answers": [out.token_ids for out in outputs], "drafted": [out.stats.drafted_per_step for out in outputs],
            "shapes": dict(llm.engine.policy.counts), "warmed": warmed, "costs_after_warm_up": costs}


def single_process(directory: Path | None, device: str = "cpu", what=logits_and_outputs):
    """The reference, in the test's process, on one thread as the ranks (several threads per process on the busy
    CI cores make torch's small matmuls a hundred times slower). what(directory, SINGLE, device); directory None:
    shipped_drafters(1, device)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return shipped_drafters(1, device) if directory is None else what(directory, SINGLE, device)
    finally:
        torch.set_num_threads(threads)


def rank_main(rank: int, size: int, init_method: str, directories: list[Path], out: Path) -> None:
    """Each checkpoint through logits_and_outputs (-> OUT/rank{r}.pt); the shipped pair's drafters (-> OUT/
    drafters{r}.pt); adaptive speculation on clocks that disagree (-> OUT/adaptive{r}.pt); `specdec eval --tp` (->
    OUT/eval/, rank 0's); `specdec bench --tp` of adaptive speculation (-> OUT/bench.json, OUT/trace.jsonl, rank
    0's). Then the failures, each on a group of its own with a short collective timeout: the last rank stalls (alive,
    in no collective), and the others' prefill must fail when the timeout passes; then it exits, and their next
    prefill must fail at once, or at the latest when the timeout passes (-> OUT/failures{r}.pt: the stalled and the
    dead case)."""
    tp = init_tensor_parallel(rank, size, init_method, backend="gloo", timeout_s=60)
    # the failure cases' groups now, while the ranks are in step: a group connects within its own short timeout
    timeout_s = {"stalled": 2.0, "dead": 5.0}
    groups = {case: TensorParallel(rank, size, dist.new_group(timeout=timedelta(seconds=seconds)), seconds)
              for case, seconds in timeout_s.items()}
    torch.save([logits_and_outputs(directory, tp) for directory in directories], out / f"rank{rank}.pt")
    os.environ.update(WORLD_SIZE=str(size), RANK=str(rank))  # as torchrun's ranks: LLM(tp=) and the CLI join `tp`
    torch.save(shipped_drafters(size), out / f"drafters{rank}.pt")
    torch.save(adaptive_answers(size, rank), out / f"adaptive{rank}.pt")
    from specdec.cli import main

    stdout = sys.stdout  # the CLI silences ranks other than 0
    assert main([*EVAL_ARGS, "--tp", str(size), "--output", str(out / "eval")]) == 0
    sys.stdout = stdout
    assert main([*BENCH_ARGS, "--tp", str(size), "--policy-trace", str(out / "trace.jsonl"),
                 "--output", str(out / "bench.json")]) == 0
    sys.stdout = stdout

    models = {case: load_model(directories[0], device="cpu", tp=group) for case, group in groups.items()}
    if rank == size - 1:  # stalls until the others timed out, then dies
        while len(list(out.glob("stalled-over*"))) < size - 1:
            time.sleep(0.05)
        os._exit(0)
    failures = {}
    for case, model in models.items():
        runner = ModelRunner.create(model, CacheConfig(max_requests=1, max_seq_len=32, flush_length=3))
        start = time.monotonic()
        try:
            runner.prefill([runner.cache.allocate_request()], [[1, 2, 3]])
            message = "no error"
        except TensorParallelError as error:
            message = str(error)
        failures[case] = {"message": message, "seconds": time.monotonic() - start, "timeout_s": timeout_s[case]}
        if case == "stalled":
            (out / f"stalled-over{rank}").touch()
    torch.save(failures, out / f"failures{rank}.pt")
    # its groups' peer is gone mid-collective: tearing them down at interpreter exit can abort in gloo's threads
    # ("terminate called without an active exception", exit -6 after the work is saved); leave as the dead rank did
    os._exit(0)


def rank_logits(rank: int, size: int, init_method: str, directories: list[Path], out: Path) -> None:
    """Each checkpoint through logits() alone (-> OUT/rank{r}.pt)."""
    tp = init_tensor_parallel(rank, size, init_method, backend="gloo", timeout_s=60)
    torch.save([logits(directory, tp) for directory in directories], out / f"rank{rank}.pt")


def rank_main_cuda(rank: int, size: int, init_method: str, directories: list[Path], out: Path) -> None:
    """Each checkpoint through logits_and_outputs on the rank's GPU, over nccl (-> OUT/rank{r}.pt); the shipped
    pair's drafters, their steps replayed from CUDA graphs (-> OUT/drafters{r}.pt)."""
    tp = init_tensor_parallel(rank, size, init_method, backend="nccl", timeout_s=120)
    torch.save([logits_and_outputs(directory, tp, f"cuda:{rank}") for directory in directories], out / f"rank{rank}.pt")
    os.environ.update(WORLD_SIZE=str(size), RANK=str(rank))
    torch.save(shipped_drafters(size, "cuda"), out / f"drafters{rank}.pt")
    shutdown(tp)


def _entry(rank: int, size: int, target, init_method: str, directories: list[Path], out: Path) -> None:
    torch.set_num_threads(1)  # the ranks share the machine's cores
    try:
        target(rank, size, init_method, directories, out)
    except BaseException:
        (out / f"rank{rank}.err").write_text(traceback.format_exc())
        raise


def run_ranks(target, size: int, directories: list[Path], out: Path, limit_s: float = 120.0) -> None:
    """`target`(rank, size, init_method, directories, out) in `size` spawned processes joined through a file store,
    for their files in `out`. Ranks still alive after limit_s are killed; a rank's exception fails the call."""
    context = mp.get_context("spawn")
    init_method = f"file://{out / 'store'}"
    ranks = [context.Process(target=_entry, args=(rank, size, target, init_method, directories, out))
             for rank in range(size)]
    for process in ranks:
        process.start()
    deadline = time.monotonic() + limit_s
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in ranks:
        if process.is_alive():
            process.kill()
            process.join()
    errors = [(out / f"rank{rank}.err").read_text() for rank in range(size) if (out / f"rank{rank}.err").exists()]
    assert not errors, "a rank failed:\n" + "\n".join(errors)
    codes = [process.exitcode for process in ranks]
    assert codes == [0] * size, f"the ranks exited with {codes} (negative: killed after {limit_s:.0f} s or by a signal)"
