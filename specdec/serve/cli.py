"""`specdec serve`: the subcommand's arguments (the model, speculation and engine options of `specdec run`, and the
server's own) and its start. Imports nothing heavy until the command runs, so `specdec --help` stays fast."""

from __future__ import annotations

import argparse

SHARED_GROUPS = ("models", "speculation", "engine")  # `specdec run`'s option groups that apply to a server


def add_command(commands, run: argparse.ArgumentParser) -> None:
    """Register `serve` beside `run`, with run's model / speculation / engine options (the same Action objects, as
    argparse's `parents=` shares them, so both commands always take the same flags)."""
    serve = commands.add_parser("serve", help="an OpenAI-compatible HTTP server (completions, chat, metrics)",
                                description="Serve the target (and drafter) over OpenAI's /v1/completions and "
                                "/v1/chat/completions, with /v1/models, /health and Prometheus /metrics. Concurrent "
                                "requests are batched continuously through one engine.")
    for group in run._action_groups:
        if group.title and group.title.startswith(SHARED_GROUPS):
            copy = serve.add_argument_group(group.title)
            for action in group._group_actions:
                copy._add_action(action)
    server = serve.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for "
                        "every interface)")
    server.add_argument("--port", type=int, default=8000, help="default 8000")
    server.add_argument("--served-model-name", default=None,
                        help="the model name clients send and /v1/models lists (default: --target as given)")
    server.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def serve(args) -> None:
    try:
        import uvicorn

        from .app import Server
    except ImportError as error:
        raise ValueError(f"specdec serve needs the serve extra ({error.name} is missing): "
                         "pip install 'specdec[serve]'") from None
    from specdec.api import LLM
    from specdec.engine.engine import EngineConfig
    from specdec.presets import DEFAULT_TARGET, drafter_asked

    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    config = EngineConfig.from_flags(
        max_batch=args.max_batch, max_seq_len=args.max_seq_len, flush_length=args.flush_length,
        num_steps=args.num_steps, topk=args.topk, num_draft_tokens=args.num_draft_tokens,
        dynamic_tree=args.dynamic_tree, cuda_graphs=not args.disable_cuda_graph)
    target = args.target or DEFAULT_TARGET
    llm = LLM(target, drafter_asked(args.target, args.draft), device=args.device, dtype=args.dtype, config=config,
              state_memory_gb=args.state_memory_gb)
    server = Server(llm, args.served_model_name or target)
    uvicorn.run(server.app, host=args.host, port=args.port, log_level=args.log_level)
