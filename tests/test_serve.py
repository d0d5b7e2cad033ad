"""`specdec serve` on the shipped Qwen3.5 pair, on CPU: one server (uvicorn in a thread on 127.0.0.1, a free port)
shared by every test. The official openai client gets the answers solo `generate()` gives; 64 concurrent clients are
batched and all answered; a client that disconnects mid-stream frees its slot; bad input gets 4xx errors in OpenAI's
shape, no traceback anywhere, and the server keeps serving."""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest
import torch
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from specdec.api import LLM
from specdec.cli import build_parser, main
from specdec.engine.engine import EngineConfig
from specdec.serve.app import Server
from specdec.serve.drafts import depths, prefix
from specdec.serve.text import IncrementalText
from specdec.speculation import DraftTree

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]  # as --tp 2 does
MODEL = "qwen3.5"
TOKENS = 8  # max_tokens everywhere: short answers keep the module quick
PROMPTS = ["The history of Rome", "Once upon a time", "The river flows", "In the year 1850"]
QUESTIONS = ["Tell me about Rome.", "What is a river?", "Who was Caesar?", "Name a city."]


@pytest.fixture(scope="module")
def served():
    """(base url, the LLM, solo greedy answers {(prompt, chat): Output}), computed before the server takes the
    engine over. One torch thread: the tiny models' matmuls gain nothing from more, and on a busy 2-core machine
    torch's thread pool spinning against the server's threads made every step ten times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    config = EngineConfig.from_flags(max_batch=16, max_seq_len=192, num_state_slots=12, speculation="fixed")
    llm = LLM(MODEL, draft="small", device="cpu", config=config)
    solo = {(p, False): llm.generate(p, max_new_tokens=TOKENS)[0] for p in PROMPTS}
    solo |= {(q, True): llm.generate(q, max_new_tokens=TOKENS, chat=True)[0] for q in QUESTIONS}
    server = uvicorn.Server(uvicorn.Config(Server(llm, MODEL).app, log_config=None, log_level="warning"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", llm, solo
    server.should_exit = True
    thread.join()
    torch.set_num_threads(threads)


@pytest.fixture
def client(served):
    return openai.OpenAI(base_url=served[0] + "/v1", api_key="unused", max_retries=0)


def post(url: str, path: str, body: bytes | dict, method: str = "POST") -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(method, path, body if isinstance(body, bytes) else json.dumps(body),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    status, payload = response.status, json.loads(response.read())
    conn.close()
    return status, payload


def metrics(url: str) -> dict[str, float]:
    """Every sample of /metrics by name{labels}."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def test_models_health_and_the_subcommand(served):
    url = served[0]
    assert post(url, "/v1/models", b"", "GET") == (200, {"object": "list", "data": [
        {"id": MODEL, "object": "model", "created": pytest.approx(time.time(), abs=3600), "owned_by": "specdec"}]})
    assert post(url, "/health", b"", "GET") == (200, {"status": "ok"})
    args = build_parser().parse_args(["serve", "--port", "0", "--num-steps", "2", "--draft", "ngram"])
    assert (args.command, args.port, args.num_steps, args.draft, args.host) == ("serve", 0, 2, "ngram", "127.0.0.1")


def test_openai_client_gets_the_solo_answers_with_usage(served, client):
    _, llm, solo = served
    prompt, question = PROMPTS[0], QUESTIONS[0]
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=TOKENS, temperature=0)
    expected = solo[(prompt, False)]
    assert out.choices[0].text == expected.text and out.choices[0].finish_reason == "length"
    assert (out.usage.prompt_tokens, out.usage.completion_tokens) == (len(llm.encode(prompt)), TOKENS)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": question}],
                                          max_tokens=TOKENS, temperature=0)
    assert chat.choices[0].message.content == solo[(question, True)].text
    assert chat.choices[0].message.role == "assistant"
    assert chat.usage.prompt_tokens == len(llm.encode(question, chat=True))


def test_streams_add_up_to_the_answer(served, client):
    _, _, solo = served
    stream = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=TOKENS, temperature=0,
                                       stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == solo[(PROMPTS[1], False)].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == TOKENS
    chat = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTIONS[1]}],
                                               max_tokens=TOKENS, temperature=0, stream=True))
    assert chat[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chat) == solo[(QUESTIONS[1], True)].text


def test_stop_strings_cut_the_answer_streamed_or_not(served, client):
    full = served[2][(PROMPTS[0], False)].text
    stop = full.split()[2]
    cut = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=TOKENS, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and full.startswith(cut.choices[0].text)
    assert stop not in cut.choices[0].text and len(cut.choices[0].text) < len(full)
    streamed = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=TOKENS, temperature=0,
                                         stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == cut.choices[0].text


def test_seeded_sampling_is_reproducible(served, client):
    def ask():
        return client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=TOKENS, temperature=0.9,
                                         top_p=0.95, seed=11).choices[0].text

    assert ask() == ask()


def test_speculation_per_request(served, client):
    url, _, solo = served
    prompt = PROMPTS[3]
    before = metrics(url)
    off = client.completions.create(model=MODEL, prompt=prompt, max_tokens=TOKENS, temperature=0,
                                    extra_body={"speculation": False})
    after_off = metrics(url)
    one = client.completions.create(model=MODEL, prompt=prompt, max_tokens=TOKENS, temperature=0,
                                    extra_body={"num_draft_tokens": 1})
    after_one = metrics(url)
    assert off.choices[0].text == one.choices[0].text == solo[(prompt, False)].text
    assert after_off["specdec_draft_tokens_total"] == before["specdec_draft_tokens_total"]  # nothing drafted
    first, second = (f"specdec_draft_position_proposed_total{{position={n}}}" for n in (1, 2))
    # (a position's series appears with its first count: absent here if no speculative request ran before this test,
    # as the test order of a pytest-xdist worker may have it)
    assert after_one[first] > after_off.get(first, 0.0)
    assert after_one.get(second, 0.0) == after_off.get(second, 0.0)
    with pytest.raises(openai.BadRequestError, match="at most 4"):
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=TOKENS, extra_body={"num_draft_tokens": 5})


def test_64_concurrent_clients_all_get_their_solo_answers(served):
    """16 request slots and 12 committed-state slots: most clients wait for room. Every third client decodes
    plainly and every third drafts 1 or 3 tokens, so the batch verifies trees of mixed sizes."""
    url, _, solo = served
    asks = [(PROMPTS + QUESTIONS)[i % 8] for i in range(64)]
    speculation = [{}, {"speculation": False}, {"num_draft_tokens": 1}, {}, {"speculation": False},
                   {"num_draft_tokens": 3}]
    before = metrics(url)

    async def burst():
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        async with client:
            async def one(text: str, chat: bool, extra: dict) -> str:
                if chat:
                    out = await client.chat.completions.create(model=MODEL, max_tokens=TOKENS, temperature=0,
                                                               messages=[{"role": "user", "content": text}],
                                                               extra_body=extra)
                    return out.choices[0].message.content
                return (await client.completions.create(model=MODEL, prompt=text, max_tokens=TOKENS,
                                                        temperature=0, extra_body=extra)).choices[0].text

            return await asyncio.gather(*(one(text, text in QUESTIONS, speculation[i % 6])
                                          for i, text in enumerate(asks)))

    answers = asyncio.run(burst())
    assert answers == [solo[(text, text in QUESTIONS)].text for text in asks]
    after = metrics(url)
    finished = sum(v - before.get(k, 0) for k, v in after.items() if k.startswith("specdec_requests_total{"))
    assert finished == 64 and after["specdec_request_slots_used"] == after["specdec_requests_waiting"] == 0
    assert after["specdec_requests_prefilling"] == 0
    assert (after["specdec_request_slots"], after["specdec_state_slots"]) == (16, 12)
    assert after["specdec_step_seconds_count"] > before["specdec_step_seconds_count"]
    assert after["specdec_accepted_length_count"] > before["specdec_accepted_length_count"]
    assert 0 < after["specdec_draft_acceptance_rate"] <= 1
    assert after["specdec_generation_tokens_total"] - before["specdec_generation_tokens_total"] == 64 * TOKENS


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole-answer"])
def test_a_client_that_disconnects_mid_answer_frees_its_slot(served, stream, capfd):
    url, _, _ = served
    aborted = "specdec_requests_total{endpoint=completions,finish_reason=abort}"
    before = metrics(url).get(aborted, 0)
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 150,
                                                        "temperature": 0, "stream": stream}))
    if stream:
        response = conn.getresponse()
        assert response.status == 200 and response.readline().startswith(b"data: ")  # it is generating
    else:
        while metrics(url)["specdec_requests_running"] == 0:  # wait until it is generating
            time.sleep(0.05)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    deadline = time.time() + 30
    while metrics(url).get(aborted, 0) == before:
        assert time.time() < deadline, "the disconnected request was not aborted"
        time.sleep(0.1)
    now = metrics(url)
    assert now["specdec_requests_running"] == 0 and now["specdec_request_slots_used"] == 0
    time.sleep(0.5)
    assert metrics(url)["specdec_generation_tokens_total"] == now["specdec_generation_tokens_total"]  # it stopped
    assert "Traceback" not in "".join(capfd.readouterr())


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/completions", b'{"model": "qwen3.5", "prompt": "x",', 400, None),
    ("/v1/completions", b"\xff\xfe", 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "word " * 200}, 400, "prompt"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 190},
     400, "messages"),
    ("/v1/completions", {"model": MODEL, "prompt": [9999999]}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 2}, 400, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 3}, 400, "logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, 400,
     "messages.0.role"),
    ("/v1/nothing", {}, 404, None),
], ids=["malformed-json", "not-utf8", "not-an-object", "unknown-model", "prompt-too-long", "chat-too-long",
        "token-outside-vocab", "empty-prompt", "negative-temperature", "temperature-text", "top-p-0", "top-p-1.5",
        "max-tokens-0", "n-2", "logprobs", "two-prompts", "no-messages", "unknown-role", "unknown-route"])
def test_bad_input_gets_an_openai_error_and_the_server_keeps_serving(served, client, caplog, capfd, path, body,
                                                                     status, param):
    with caplog.at_level(logging.INFO):
        got, payload = post(served[0], path, body)
        assert got == status and set(payload) == {"error"}
        assert set(payload["error"]) == {"message", "type", "param", "code"} and payload["error"]["message"]
        assert payload["error"]["param"] == param
        out = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=2, temperature=0)
        assert out.choices[0].text == served[2][(PROMPTS[0], False)].text[:len(out.choices[0].text)]
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert "Traceback" not in "".join(capfd.readouterr())


def test_text_holds_back_what_a_stop_string_may_claim():
    pieces = {1: "Hel", 2: "lo, W", 3: "or", 4: "ld!"}
    text = IncrementalText(lambda tokens: "".join(pieces[t] for t in tokens), stop=["World", "xyz"])
    text.add([1, 2])
    assert text.pending() == "Hello, "  # "W" may start "World"
    text.add([3])
    assert text.pending() == "" and not text.stopped
    text.add([4])
    assert text.stopped and text.pending() == "" and text.text == "Hello, "


def test_text_waits_for_a_whole_character():
    pieces = {1: "a", 2: "\ufffd", 3: "\u00e9"}  # token 2 alone is half a character; with 3 it is whole

    def decode(tokens):
        return "".join(pieces[t] for t in tokens).replace("\ufffd\u00e9", "\u00e9")

    text = IncrementalText(decode, stop=[])
    text.add([1])
    assert text.pending() == "a"
    text.add([2])
    assert text.pending() == ""
    text.add([3])
    assert text.pending() == "\u00e9" and text.text == "a\u00e9"


def test_a_tree_prefix_is_a_tree():
    tree = DraftTree([5, 6, 7, 8, 9], [-1, 0, 0, 1, 2])
    assert depths(tree) == [0, 1, 1, 2, 2]
    assert prefix(tree, 2).tokens == [5, 6, 7] and prefix(tree, 2).parents == [-1, 0, 0]
    assert prefix(tree, 0).tokens == [5] and prefix(tree, 9) is tree


def test_serve_refuses_a_taken_port_or_a_bad_one_before_loading_models(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", "--port", str(taken.getsockname()[1])]) == 2
    assert main(["serve", "--port", "70000"]) == 2
    err = capsys.readouterr().err
    assert "cannot listen on 127.0.0.1" in err and "--port must be in [0, 65535]" in err and "Traceback" not in err


def test_serve_under_tp_answers_as_one_process(served, tmp_path):
    """`specdec serve --tp 2 --speculation adaptive` on the CPU: two gloo ranks, rank 0 serving, rank 1 mirroring its
    engine (specdec/serve/ranks.py), each rank's policy planning from rank 0's step times (rank 0 also answers the
    clients between steps, so its clock and rank 1's disagree). Concurrent clients (one cut by a stop string, so
    aborted mid-answer; one without speculation; one chat) get the one-process answers (fixed speculation's, greedy:
    the same tokens); Ctrl-C stops every process. Started as `specdec serve --tp 2` starts it, minus the launcher's
    checks (test_cli_refuses_tp_it_cannot_run)."""
    _, llm, solo = served
    log = tmp_path / "ranks.log"
    with open(log, "w") as stderr:
        launcher = subprocess.Popen(
            [*TORCHRUN, "-m", "specdec", "serve", "--tp", "2", "--device", "cpu", "--port", "0", "--max-batch", "16",
             "--max-seq-len", "192", "--speculation", "adaptive", "--log-level", "warning"], cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=stderr, text=True, start_new_session=True)
    watchdog = threading.Timer(240, launcher.terminate)  # torchrun stops its ranks
    watchdog.start()
    try:
        line = launcher.stdout.readline()
        assert line.startswith("[specdec] serving"), f"no server: {line!r}\n{log.read_text()[-3000:]}"
        url = line.split(" on ")[1].strip().removesuffix("/v1")
        full = solo[(PROMPTS[0], False)].text
        stop = full.split()[2]
        asks = [("/v1/completions", {"prompt": PROMPTS[0], "stop": [stop]}),
                ("/v1/completions", {"prompt": PROMPTS[1]}),
                ("/v1/completions", {"prompt": PROMPTS[3], "speculation": False}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": QUESTIONS[0]}]})]
        with ThreadPoolExecutor(len(asks)) as pool:
            answers = list(pool.map(lambda ask: post(url, ask[0], {"model": MODEL, "max_tokens": TOKENS,
                                                                    "temperature": 0, **ask[1]}), asks))
        assert all(status == 200 for status, _ in answers), answers
        texts = [answer["choices"][0].get("text", answer["choices"][0].get("message", {}).get("content"))
                 for _, answer in answers]
        assert texts[0] == full[:full.index(stop)]
        assert texts[1:] == [solo[(PROMPTS[1], False)].text, solo[(PROMPTS[3], False)].text,
                             solo[(QUESTIONS[0], True)].text]
        os.killpg(launcher.pid, signal.SIGINT)
        launcher.wait(timeout=60)
        assert "Error" not in log.read_text().split("SignalException")[0], log.read_text()[-3000:]
    finally:
        watchdog.cancel()
        if launcher.poll() is None:
            launcher.terminate()
            launcher.wait(timeout=60)


def test_adaptive_shapes_are_counted_in_the_metrics():
    """--speculation adaptive: /metrics counts each request-step under the shape the policy chose, every step of a
    request once (8 tokens, the first from the prefill: 2 to 7 steps of at most 5 tokens)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    config = EngineConfig.from_flags(max_batch=4, max_seq_len=192, num_state_slots=4, speculation="adaptive")
    llm = LLM(MODEL, draft="small", device="cpu", config=config)
    server = uvicorn.Server(uvicorn.Config(Server(llm, MODEL).app, log_config=None, log_level="warning"))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            assert thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        status, _ = post(url, "/v1/completions", {"model": MODEL, "prompt": PROMPTS[0], "max_tokens": TOKENS,
                                                   "temperature": 0})
        assert status == 200
        shapes = {k: v for k, v in metrics(url).items() if k.startswith("specdec_speculation_shape_steps_total")}
        assert shapes and all(k.split("shape=")[1].rstrip("}") in {"plain", "chain-1", "chain-2", "chain-3",
                                                                   "chain-4"} for k in shapes), shapes
        assert 2 <= sum(shapes.values()) <= TOKENS - 1, shapes
    finally:
        server.should_exit = True
        thread.join()
        torch.set_num_threads(threads)
