"""`specdec serve`: an OpenAI-compatible HTTP server over the engine (docs in README.md, "Serving").

    cli.py       the subcommand: arguments, loading, start
    app.py       the ASGI app: routes, request -> job, job -> JSON or server-sent events, errors
    protocol.py  OpenAI's request / response shapes and their checks
    loop.py      the engine thread: continuous batching, streaming out, aborts
    text.py      incremental detokenization and stop strings
    drafts.py    per-request speculation (off, or fewer drafted tokens) on the engine's one draft shape
    metrics.py   Prometheus metrics

Libraries (the `serve` extra), and why:
- Starlette (ASGI framework): routing, request bodies, streaming responses that notice a client going away, and
  exception handlers, without anything we would not use. FastAPI sits on Starlette and adds dependency injection
  and OpenAPI docs; its automatic validation answers 422 in its own shape, which OpenAI clients do not expect, so we
  would be overriding it anyway. Starlette is what FastAPI, vLLM and SGLang run on underneath.
- pydantic (already installed with transformers' stack): the request models and their range checks.
- uvicorn (ASGI server): the reference server for Starlette, the one vLLM and SGLang start, and it runs inside a
  thread for the tests.
- prometheus_client: the official Python client; its text format is what Prometheus and Grafana scrape.

Per-request draft lengths: the engine drafts one TreeShape for the whole batch (Engine.propose hands the drafter
`config.shape`). drafts.PerRequestDrafts cuts each request's tree to its own budget after drafting, which is exact
(the target verifies a prefix of the tree) and saves the target's verify work, but not the drafter's. Saving that
too needs Drafter.propose to take a shape (or a budget) per request, and Engine.propose to pass each request's.
"""
