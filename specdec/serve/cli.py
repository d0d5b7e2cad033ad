"""`specdec serve`: the subcommand's arguments (the model, speculation and engine options of `specdec run`, and the
server's own) and its start. Imports nothing heavy until the command runs, so `specdec --help` stays fast."""

from __future__ import annotations

import os
import socket
import time

from specdec.options import (
    add_engine_arguments,
    add_model_arguments,
    add_speculation_arguments,
    add_speculation_mode_argument,
    add_tp_argument,
    check_tree,
)

PROGRESS_SECONDS = 10.0  # between the start-up capture's progress lines (capture_graphs)
# prompt tokens of the start-up warm-up's requests (warm_kernels): one short and not a multiple of 16 (Triton compiles
# an integer argument apart where it is one), one of several 64-token chunks and a multiple of 16, one long enough for
# the attention's split-K launch (the H200's first requests of 2026-12-06, cold Triton cache: 50-62 s for the first
# prompt, fla-core's autotuning of its chunk kernels most of it, 9 s for Nemotron-3-Nano's first prompt of another
# class, 4.3 s for Qwen3.5's first of 1000 tokens: benchmarks/results/first_use_h200_2026-12-06.md), and one past the
# MoE kernels' largest row bucket (more than 64 rows an expert, verify_kernels/moe/experts.py CONFIGS: 1366 tokens for
# Nemotron-3-Nano's 128 experts and top-6, 2049 for Qwen3.5-35B-A3B's 256 and top-8; after the first three a
# 4000-token Nemotron-3-Nano prompt still compiled its MoE kernels, 3.5 s on the H100); and, first, one short enough
# for the linear layers' buffer (--flush-length, 16 by default), which their verify kernels score as a chain of its
# length: a short chat turn's path, which no other warm-up prompt takes. No prompt is needed past a multiple of 16:
# the prefill path's kernels take their token counts unspecialised (do_not_specialize), so 3000 warms the forms that
# only a long prompt takes (the MoE router's one launch from 1009 tokens, the attention without key splits from ~520)
# for every length (a 3008-token request did until 2026-12-07: on the H100 then, without it, no prompt of 528-6000
# tokens compiled anything: benchmarks/results/exemptions_h100_2026-12-07/)
WARM_UP_LENGTHS = (13, 47, 256, 1000, 3000)
WARM_UP_NEW_TOKENS = 16  # a few drafting steps each: a draft model's own prefill and catch-up are warmed too


def add_command(commands) -> None:
    """Register `serve`, with `specdec run`'s model / speculation / engine option groups (specdec/options.py) and
    the server's own options."""
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (completions, chat, metrics)",
                                description="Serve the target (and drafter) over OpenAI's /v1/completions and "
                                "/v1/chat/completions, with /v1/models, /health and Prometheus /metrics. Concurrent "
                                "requests are batched continuously through one engine.")
    add_model_arguments(serve)
    add_speculation_arguments(serve)
    add_speculation_mode_argument(serve)
    add_engine_arguments(serve)
    add_tp_argument(serve)
    server = serve.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for "
                        "every interface)")
    server.add_argument("--port", type=int, default=8000, help="default 8000")
    server.add_argument("--served-model-name", default=None,
                        help="the model name clients send and /v1/models lists (default: --target as given)")
    server.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(handler=serve_command, launch_check=check_serve)


def check_serve(args) -> None:
    """What fails before any model loads (with --tp, before the ranks start): the tree, the port."""
    from specdec.eval.acceptance_prior import adaptive_settings

    check_tree(args)
    adaptive_settings(args)
    listen(args.host, args.port).close()


def serve_command(args) -> None:
    """Load, listen, serve until Ctrl-C. Under --tp, rank 0 listens and serves and the other ranks mirror its
    engine (specdec/serve/ranks.py)."""
    from specdec.eval.acceptance_prior import adaptive_settings

    check_tree(args)
    adaptive = adaptive_settings(args)
    try:
        import uvicorn

        from .app import Server
    except ImportError as error:
        raise ValueError(f"specdec serve needs the serve extra ({error.name} is missing): "
                         "pip install 'specdec[serve]'") from None
    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig
    from specdec.engine.heap import freeze_heap
    from specdec.eval.step_cost import with_device_prior
    from specdec.presets import DEFAULT_TARGET, drafter_asked

    primary = os.environ.get("RANK", "0") == "0"  # the rank that serves (torchrun sets RANK)
    sock = listen(args.host, args.port) if primary else None  # before the models load: a taken port fails at once
    config = EngineConfig.from_flags(
        max_batch=args.max_batch, max_seq_len=args.max_seq_len, flush_length=args.flush_length,
        num_steps=args.num_steps, topk=args.topk, num_draft_tokens=args.num_draft_tokens,
        dynamic_tree=args.dynamic_tree, cuda_graphs=not args.disable_cuda_graph, speculation=args.speculation,
        adaptive=adaptive, max_prefill_tokens=args.max_prefill_tokens)
    target = args.target or DEFAULT_TARGET
    llm = LLM(target, drafter_asked(args.target, args.draft), device=args.device, dtype=args.dtype, config=config,
              state_memory_gb=args.state_memory_gb, tp=args.tp)
    with_device_prior(llm)
    capture_graphs(llm, announce=primary)
    warm_kernels(llm, announce=primary)
    freeze_heap()  # what loading built is never walked by a collection between steps (specdec/engine/heap.py)
    if not primary:
        from .ranks import follow

        follow(llm)
        return
    server = Server(llm, args.served_model_name or target)
    print(f"[specdec] serving {server.model_name!r} on http://{args.host}:{sock.getsockname()[1]}/v1", flush=True)
    uvicorn.Server(uvicorn.Config(server.app, log_level=args.log_level)).run(sockets=[sock])


def capture_graphs(llm, announce: bool) -> None:
    """Capture now the CUDA graphs of every step the server may run: batches up to --max-batch, requests up to
    --max-seq-len tokens (Engine.prepare_steps: graphs bucketed by batch, step width and key length), so that no
    request's step stops to capture one (on first use a capture runs inside a step: a stall for the whole batch).
    Where they do not all fit in GPU memory beside the pools, the rest are captured on first use. Under --tp every
    rank captures the same graphs in the same order (their collectives pair up); rank 0 announces them."""
    import torch

    engine = llm.engine
    graphs = engine.runner.graphs
    if graphs is None or not graphs.capture:  # (the CPU, --disable-cuda-graph, a model that cannot be captured)
        return
    cache = engine.config.cache
    if announce:
        print(f"[specdec] capturing CUDA graphs for batches of up to {cache.max_requests} requests of up to "
              f"{cache.max_seq_len} tokens", flush=True)
    start = last = time.perf_counter()
    count = 0

    def built_one() -> None:  # (a line every PROGRESS_SECONDS: a large --max-batch and --max-seq-len take a while)
        nonlocal count, last
        count += 1
        now = time.perf_counter()
        if announce and now - last >= PROGRESS_SECONDS:
            print(f"[specdec] {count} CUDA graphs captured ({now - start:.0f} s)", flush=True)
            last = now

    try:
        # (a step's key length is bucketed up to max_seq_len at most: prompt + new tokens of max_seq_len reach it)
        built = engine.prepare_steps(cache.max_requests, 1, cache.max_seq_len - 1, built_one)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        if announce:
            print("[specdec] not every CUDA graph fits beside the KVBuffer pools: the rest are captured on first use "
                  "(lower --max-batch, --max-seq-len or --state-memory-gb to make room)", flush=True)
        return
    if announce:
        print(f"[specdec] {built} CUDA graphs captured in {time.perf_counter() - start:.1f} s", flush=True)


def warm_kernels(llm, announce: bool) -> list[int]:
    """Run one request of each of WARM_UP_LENGTHS prompt tokens (those that fit --max-seq-len) on a GPU before
    serving, so that the first requests do not wait for what a kernel's first launch at a shape costs there: Triton's
    compiles and fla-core's autotuning of its prefill kernels, a minute on a cold Triton cache, well under a second
    from a warm one. Under --tp every rank runs the same requests in the same order (their collectives pair up).
    Adaptive speculation keeps the step costs they measured, not the acceptance: prompts of no text say nothing of
    the requests to come (AdaptivePolicy.forget_acceptance). -> the prompt lengths run."""
    if not compiles_kernels(llm):
        return []
    engine, vocab = llm.engine, llm.model.hf_config.vocab_size
    # (the longest prompt Engine.check_request takes with WARM_UP_NEW_TOKENS: a step's tree lies beyond them)
    room = engine.config.cache.max_seq_len - WARM_UP_NEW_TOKENS - (engine.scheduler.draft_budget + 1)
    if engine.context_length is not None:
        room = min(room, engine.context_length - WARM_UP_NEW_TOKENS)
    lengths = [n for n in WARM_UP_LENGTHS if n <= room] or ([room] if room >= 1 else [])
    if not lengths:
        return []
    if announce:
        print(f"[specdec] warming up the kernels: requests of {', '.join(map(str, lengths))} prompt tokens",
              flush=True)
    start = time.perf_counter()
    for length in lengths:  # (no end-of-text token: every request runs its WARM_UP_NEW_TOKENS)
        engine.add_request([(7 * i + length) % (vocab - 10) + 5 for i in range(length)],
                           max_new_tokens=WARM_UP_NEW_TOKENS)
        engine.run()
    if engine.policy is not None:
        engine.policy.forget_acceptance()
    if announce:
        print(f"[specdec] kernels warm in {time.perf_counter() - start:.1f} s", flush=True)
    return lengths


def compiles_kernels(llm) -> bool:
    """Whether the model runs where kernels are compiled on first use (a GPU; on the CPU: the torch references)."""
    return llm.model.device.type == "cuda"


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (port 0: any free one), or a ValueError saying why not."""
    if not 0 <= port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {port}")
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as error:
        raise ValueError(f"--host {host}: {error.strerror}") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen()  # clients that connect while the models load wait in the backlog
    except OSError as error:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return sock
