"""`bertheads serve` under overload and hostile requests: the bounded queue, deadlines, dropped
work of clients that left, token budgets, the body limit whatever the framing, the Host check,
tokens, CORS, metrics and a graceful SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers_multi import save_heads
from helpers_serve import running_server

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.inference.analyze import analyze_inputs
from bertheads.serve.app import ServeSettings, create_app
from bertheads.serve.queue import Batcher, DeadlineExceeded, Overloaded, request_tokens


@pytest.fixture(scope="module")
def model_dir(tiny_bert, tmp_path_factory):
    heads = {"sentiment": ("classify", 1, {"labels": ["negative", "positive"]}),
             "ner": ("tag", 5, {"tags": ["O", "B-LOC", "I-LOC"], "max_length": 64, "stride": 16})}
    return save_heads(tiny_bert, tmp_path_factory.mktemp("limits") / "model", heads)


@pytest.fixture(scope="module")
def model(model_dir):
    return bertheads.load(model_dir)


def client_for(model, host: str = "localhost", **settings) -> TestClient:
    return TestClient(create_app(model, ServeSettings(window_ms=1, **settings)), base_url=f"http://{host}")


# -- the queue: bounded, deadlines, dropped work, token budgets ---------------------------------
def blocking_run(gate: threading.Event, calls: list):
    def run(key, payloads):
        calls.append([p["n"] for p in payloads])
        gate.wait(10)
        return [[p["n"]] for p in payloads]

    return run


def test_full_queue_is_refused_at_once_and_deadlines_hold():
    gate, calls = threading.Event(), []

    async def scenario():
        batcher = Batcher(blocking_run(gate, calls), max_batch=1, window_s=0.0, max_queue=1)
        running = asyncio.ensure_future(batcher.submit(("k",), {"n": 0}, 1, timeout=0.6))
        await asyncio.sleep(0.1)  # n=0 is in the model call now
        queued = asyncio.ensure_future(batcher.submit(("k",), {"n": 1}, 1, timeout=0.3))
        await asyncio.sleep(0.01)
        start = time.monotonic()
        with pytest.raises(Overloaded) as full:
            await batcher.submit(("k",), {"n": 2}, 1, timeout=5)
        refused_in = time.monotonic() - start
        with pytest.raises(Overloaded) as late:  # still queued at its deadline: 503
            await queued
        with pytest.raises(DeadlineExceeded):  # started but not done at its deadline: 504
            await running
        gate.set()
        await asyncio.sleep(0.1)
        await batcher.stop()
        return full.value, refused_in, late.value, batcher

    full, refused_in, late, batcher = asyncio.run(scenario())
    assert full.reason == "queue_full" and "--max-queue" in str(full) and refused_in < 0.05
    assert late.reason == "deadline" and "did not start within the 0.3 s deadline" in str(late)
    assert calls == [[0]] and batcher.expired == 1  # the expired request never ran


def test_a_request_that_would_not_finish_in_time_is_not_started():
    calls = []

    def run(key, payloads):
        calls.append(len(payloads))
        return [[0] for _ in payloads]

    async def scenario():
        batcher = Batcher(run, window_s=0.0, max_tokens=10_000)
        batcher.rate = 100.0  # tokens per second, as if measured
        with pytest.raises(Overloaded) as late:
            await batcher.submit(("k",), {}, 1, tokens=1000, timeout=2)  # about 10 s of work
        assert await batcher.submit(("k",), {}, 1, tokens=10, timeout=2) == [0]
        await batcher.stop()
        return late.value

    late = asyncio.run(scenario())
    assert late.reason == "deadline" and "would not finish within its deadline" in str(late)
    assert calls == [1]  # only the small request ran


def test_work_of_a_client_that_went_away_is_dropped():
    gate, calls = threading.Event(), []

    async def scenario():
        batcher = Batcher(blocking_run(gate, calls), max_batch=1, window_s=0.0)
        first = asyncio.ensure_future(batcher.submit(("k",), {"n": 0}, 1))
        await asyncio.sleep(0.1)
        gone = asyncio.ensure_future(batcher.submit(("k",), {"n": 1}, 1))
        await asyncio.sleep(0.05)
        gone.cancel()
        gate.set()
        assert await first == [0]
        await asyncio.sleep(0.1)
        await batcher.stop()
        return batcher

    batcher = asyncio.run(scenario())
    assert calls == [[0]] and batcher.dropped == 1


def test_disconnected_http_client_is_dropped(model):
    app = create_app(model, ServeSettings(window_ms=1, max_batch=1))
    batcher = app.state.batcher
    gate, seen = threading.Event(), []
    real_run = batcher.run

    def slow_run(key, payloads):
        seen.append([p["texts"][0] for p in payloads])
        gate.wait(10)
        return real_run(key, payloads)

    batcher.run = slow_run
    with running_server(app) as url:
        holder = threading.Thread(target=lambda: httpx.post(f"{url}/analyze", json={"texts": ["first"]}, timeout=20))
        holder.start()
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            httpx.post(f"{url}/analyze", json={"texts": ["second"]}, timeout=0.5)
        deadline = time.monotonic() + 5
        while batcher.dropped == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        gate.set()
        holder.join(20)
        health = httpx.get(f"{url}/health").json()
    assert seen == [["first"]]  # "second" never reached the model
    assert health["dropped"] == 1


def test_batches_are_budgeted_by_tokens_not_texts():
    calls = []

    def run(key, payloads):
        calls.append(len(payloads))
        return [[0] for _ in payloads]

    async def scenario():
        batcher = Batcher(run, max_batch=64, window_s=0.05, max_tokens=100)
        await asyncio.gather(*(batcher.submit(("k",), {}, 1, tokens=60) for _ in range(3)),
                             *(batcher.submit(("k",), {}, 1, tokens=10) for _ in range(2)))
        await batcher.stop()
        return batcher

    batcher = asyncio.run(scenario())
    assert sum(calls) == 5 and len(calls) >= 3 and batcher.largest_tokens <= 100


def test_a_long_text_costs_its_windows(model):
    net = model.net
    long = "Angela Merkel visited Paris last week. " * 260  # about 10,000 characters
    short_cost = request_tokens(net, analyze_inputs(net, ["A fine film."]))
    long_tag = request_tokens(net, {"ner": [long]})
    long_cls = request_tokens(net, {"sentiment": [long]})
    tokens = len(net.encoder.tokenizer(long, add_special_tokens=False)["input_ids"])
    assert short_cost < 20 and long_cls == 128  # classify reads the truncated text
    assert long_tag >= tokens and long_tag // 64 >= tokens // 62  # every 64-token window of the tag head
    assert request_tokens(net, analyze_inputs(net, [long])) == long_cls + long_tag
    # a short text both heads read whole is one pass
    assert request_tokens(net, analyze_inputs(net, ["A fine film."])) == request_tokens(net, {"ner": ["A fine film."]})


# -- the body, the text, the host, the token, CORS ---------------------------------------------
def test_chunked_body_over_the_limit_is_413(model):
    settings = ServeSettings(window_ms=1, max_texts=2, max_text_chars=100)
    limit = settings.body_limit()

    def chunks():
        yield b'{"texts": ["'
        for _ in range(64):
            yield b"x" * (limit // 16)
        yield b'"]}'

    with running_server(create_app(model, settings)) as url:
        response = httpx.post(f"{url}/analyze", content=chunks(), headers={"content-type": "application/json"})
        assert response.status_code == 413 and f"at most {limit}" in response.json()["detail"]
        sized = httpx.post(f"{url}/analyze", content=b"x" * (3 * limit), headers={"content-type": "application/json"})
        assert sized.status_code == 413 and f"request body of {3 * limit} bytes" in sized.json()["detail"]
        ok = httpx.post(f"{url}/analyze", content=iter([b'{"texts": ', b'["fine"]}']),
                        headers={"content-type": "application/json"})
        assert ok.status_code == 200


@pytest.mark.parametrize("body,status,message", [
    (b'{"texts": ["ok", "bad \\ud800 text"]}', 422, "texts[1]: not valid Unicode (a lone surrogate at character 4)"),
    (b'{"texts": ["\\udc00"]}', 422, "lone surrogate"),
    (b'{"texts": ["\xff\xfe"]}', 422, "the body is not UTF-8 text (byte 13)"),
    (b'{"texts": ' + b"[" * 50_000, 422, "malformed JSON (nested too deeply)"),
])
def test_text_that_cannot_be_utf8_or_json(model, body, status, message):
    with client_for(model) as client:
        response = client.post("/analyze", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status and message in response.json()["detail"]


def test_host_header_check(model):
    with client_for(model) as client:
        assert client.post("/analyze", json={"texts": ["a"]}).status_code == 200
        for host in ("localhost:8000", "127.0.0.1:1", "[::1]:8000", "LOCALHOST."):
            assert client.get("/heads", headers={"host": host}).status_code == 200, host
        for host in ("evil.example", "evil.example:8000", "localhost.evil.example", ""):
            response = client.get("/heads", headers={"host": host})
            assert response.status_code == 400 and "--allowed-host" in response.json()["detail"], host
    with client_for(model, host="models.internal", allowed_hosts=["models.internal"]) as client:
        assert client.get("/heads").status_code == 200
        assert client.get("/heads", headers={"host": "evil.example"}).status_code == 400
    with client_for(model, host="anything.example", allowed_hosts=["*"]) as client:
        assert client.get("/heads").status_code == 200


def test_bearer_token(model):
    with client_for(model, token="s3cret") as client:
        missing = client.post("/analyze", json={"texts": ["a"]})
        assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
        assert "missing bearer token" in missing.json()["detail"]
        wrong = client.post("/analyze", json={"texts": ["a"]}, headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "wrong bearer token" in wrong.json()["detail"]
        assert client.get("/metrics").status_code == 401
        good = client.post("/analyze", json={"texts": ["a"]}, headers={"authorization": "Bearer s3cret"})
        assert good.status_code == 200
        assert client.get("/health").status_code == 200 and client.get("/").status_code == 200


def test_non_loopback_address_needs_a_token(model_dir, capsys):
    assert main(["serve", str(model_dir), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert "--host 0.0.0.0 is not a loopback address: give --token" in err and err.count("\n") == 1
    ServeSettings(token="t").check("0.0.0.0")
    ServeSettings(insecure=True).check("0.0.0.0")
    ServeSettings().check("::1")
    with pytest.raises(UserError, match="^timeout=: expected a positive number"):
        ServeSettings(timeout=0).check()


def test_cors_is_off_unless_an_origin_is_given(model):
    origin = {"origin": "https://app.example"}
    with client_for(model) as client:
        response = client.post("/analyze", json={"texts": ["a"]}, headers=origin)
        assert response.status_code == 200 and "access-control-allow-origin" not in response.headers
        assert client.options("/analyze", headers={**origin, "access-control-request-method": "POST"}).status_code == 405
    with client_for(model, cors_origins=["https://app.example"], token="t") as client:
        preflight = client.options("/analyze", headers={**origin, "access-control-request-method": "POST",
                                                        "access-control-request-headers": "authorization"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        response = client.post("/analyze", json={"texts": ["a"]}, headers={**origin, "authorization": "Bearer t"})
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        other = client.post("/analyze", json={"texts": ["a"]},
                            headers={"origin": "https://evil.example", "authorization": "Bearer t"})
        assert "access-control-allow-origin" not in other.headers


def test_metrics_in_prometheus_format(model):
    with client_for(model) as client:
        assert client.post("/analyze", json={"texts": ["one", "two"]}).status_code == 200
        assert client.post("/predict/nope", json={"texts": ["x"]}).status_code == 404
        assert client.post("/analyze", json={"texts": []}).status_code == 422
        response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    text = response.text
    for line in ('bertheads_http_requests_total{path="/analyze",status="200"} 1.0',
                 'bertheads_http_requests_total{path="/predict/{head}",status="404"} 1.0',
                 'bertheads_http_requests_total{path="/analyze",status="422"} 1.0',
                 "bertheads_queue_requests 0.0", 'bertheads_batch_texts_bucket{le="2.0"} 1.0',
                 "bertheads_batch_texts_count 1.0", 'bertheads_http_request_duration_seconds_count{path="/analyze"} 2.0'):
        assert line in text, line


def test_refusals_carry_retry_after_and_count(model):
    app = create_app(model, ServeSettings(window_ms=1))
    app.state.control.draining = True
    with TestClient(app, base_url="http://localhost") as client:
        response = client.post("/analyze", json={"texts": ["a"]})
        assert response.status_code == 503 and response.headers["retry-after"]
        assert response.headers["connection"] == "close"
    from prometheus_client import generate_latest

    assert 'bertheads_http_requests_total{path="/analyze",status="503"} 1.0' in generate_latest(
        app.state.metrics.registry).decode()


# -- the real command: SIGTERM drains ----------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # runs extra processes (torchrun, kills, signals)
def test_sigterm_finishes_in_flight_and_refuses_new(model_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # a 5 s batch window keeps the request in flight when the signal comes, however busy the machine
    proc = subprocess.Popen([sys.executable, "-m", "bertheads", "serve", str(model_dir), "--port", str(port),
                             "--batch-window-ms", "5000"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        answer = {}
        flight = threading.Thread(target=lambda: answer.update(
            r=httpx.post(f"{url}/analyze", json={"texts": ["in flight"]}, timeout=30)))
        flight.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        refused, deadline = False, time.monotonic() + 4
        while not refused and time.monotonic() < deadline:  # once the signal is handled
            try:
                httpx.get(f"{url}/health", timeout=1)
                time.sleep(0.05)
            except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):  # refused, or reset unanswered
                refused = True
        assert refused and "r" not in answer  # new connections refused while the first is still in flight
        flight.join(30)
        assert answer["r"].status_code == 200 and "sentiment" in answer["r"].json()["results"][0]
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # drained, uvicorn (>= 0.29) raises the SIGTERM it caught again: the process ends as the signal asks
    output = proc.stdout.read()
    assert proc.returncode == -signal.SIGTERM and "Traceback" not in output, (proc.returncode, output)


def test_a_short_request_goes_before_long_ones_queued_earlier():
    """Served by cost: a one-word request passes the long ones waiting, a long one is not starved,
    and under a flood the long requests are refused at once while a short one still gets in."""
    gate, calls = threading.Event(), []

    def run(key, payloads):
        calls.append([p["n"] for p in payloads])
        gate.wait(10)
        return [[p["n"]] for p in payloads]

    async def scenario():
        batcher = Batcher(run, max_batch=64, window_s=0.0, max_tokens=1000)
        batcher.rate = 1000.0  # tokens per second, as if measured
        first = asyncio.ensure_future(batcher.submit(("k",), {"n": "long0"}, 1, tokens=900, timeout=30))
        await asyncio.sleep(0.05)  # long0 is in the model call
        longs = [asyncio.ensure_future(batcher.submit(("k",), {"n": f"long{i}"}, 1, tokens=900, timeout=30))
                 for i in range(1, 4)]
        await asyncio.sleep(0.05)
        short = asyncio.ensure_future(batcher.submit(("k",), {"n": "short"}, 1, tokens=3, timeout=30))
        await asyncio.sleep(0.05)
        with pytest.raises(Overloaded) as flood:  # 3 x 0.9 s queued ahead of it: more than 2 s
            await batcher.submit(("k",), {"n": "late"}, 1, tokens=900, timeout=2)
        admitted = asyncio.ensure_future(batcher.submit(("k",), {"n": "short2"}, 1, tokens=3, timeout=2))
        await asyncio.sleep(0.05)
        gate.set()
        results = await asyncio.gather(first, *longs, short, admitted)
        await batcher.stop()
        return flood.value, results

    flood, results = asyncio.run(scenario())
    assert flood.reason == "busy" and flood.retry_after >= 1
    assert calls[0] == ["long0"] and calls[1][:2] == ["short", "short2"]
    assert sorted(n for call in calls for n in call if n.startswith("long")) == ["long0", "long1", "long2", "long3"]
    assert [r[0] for r in results] == ["long0", "long1", "long2", "long3", "short", "short2"]


def test_a_small_call_does_not_set_a_pessimistic_rate():
    batcher = Batcher(lambda key, payloads: [[0] for _ in payloads])
    batcher.measure(3, 0.02)  # one word: 150 tokens/s, mostly overhead
    assert batcher.rate is None and batcher.expected_wait(8192) == 0.0
    batcher.measure(8192, 0.5)
    assert batcher.rate == pytest.approx(16384)
    batcher.measure(3, 0.02)  # cannot lower it
    assert batcher.rate == pytest.approx(16384)
    batcher.measure(4096, 0.5)
    assert batcher.rate == pytest.approx(0.7 * 16384 + 0.3 * 8192)
