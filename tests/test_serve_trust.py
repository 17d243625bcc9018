"""The server's trust boundaries, probed on a real server on 127.0.0.1: idle and slow-header
connections closed, connections capped per client so one client cannot lock the others out,
every refusal counted in /metrics, its own faults answered 5xx without server paths (and
reported by /health), and bodies it cannot read answered 422 with a detail."""

from __future__ import annotations

import select
import shutil
import socket
import threading
import time

import httpx
import pytest
from helpers_multi import build_task, save_heads
from helpers_serve import running_server
from safetensors.torch import load_file, save_file

import bertheads
from bertheads.encoder.pretrained import Encoder
from bertheads.model import BertHeads
from bertheads.saved import bundle
from bertheads.serve.app import ServeSettings, create_app
from bertheads.store.encoder_refs import reference

HEADS = {"sentiment": ("classify", 1, {"labels": ["negative", "positive"]}),
         "qa": ("qa", 3, {"max_length": 64, "stride": 16})}
JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def model(tiny_bert, tmp_path_factory):
    return bertheads.load(save_heads(tiny_bert, tmp_path_factory.mktemp("serve-trust") / "model", HEADS))


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    sock.settimeout(5)
    return sock


def closed_after(sock: socket.socket) -> tuple[bytes, float]:
    """What the server sent before it closed the connection, and when (seconds from now)."""
    start, data = time.monotonic(), b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data, time.monotonic() - start


def refusals(url: str) -> dict[str, float]:
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1]) for line in lines
            if line.startswith("bertheads_refused_requests_total{")}


# -- 4. idle and slow connections -------------------------------------------------------------------
def test_idle_and_slow_header_connections_are_closed(model):
    settings = ServeSettings(window_ms=1, header_timeout=1, keep_alive=1)
    with running_server(create_app(model, settings)) as url:
        port = int(url.rsplit(":", 1)[1])
        idle = connect(port)
        data, waited = closed_after(idle)
        assert data == b"" and 0.8 < waited < 3

        slow = connect(port)
        start = time.monotonic()
        request = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Padding: " + b"a" * 100
        try:
            for byte in request:  # a byte every 65 ms, for at most ~7 s: the server must end it first
                if select.select([slow], [], [], 0)[0]:  # it answered (or closed)
                    break
                slow.send(bytes([byte]))
                time.sleep(0.065)
        except OSError:  # the server closed it
            pass
        data, _ = closed_after(slow)
        assert time.monotonic() - start < 3
        assert data.startswith(b"HTTP/1.1 408") and b"request headers not received within 1 s" in data

        with httpx.Client(base_url=url) as client:  # keep-alive: idle after an answer, closed too
            assert client.get("/health").status_code == 200
        assert refusals(url).get("header_timeout") == 1


def test_slow_clients_cannot_lock_the_others_out_and_are_counted(model):
    """A flood of slow-header connections from the real client's own address: each new
    connection takes the place of the one that waited longest, so every real request is
    answered; places with a request under way are never taken, and a connection that finds
    every place busy is refused 503; all of it counted in /metrics."""
    settings = ServeSettings(window_ms=1, header_timeout=1, keep_alive=2, max_connections=16,
                             max_client_connections=4)
    with running_server(create_app(model, settings)) as url:
        port = int(url.rsplit(":", 1)[1])
        stop = threading.Event()

        def slowloris() -> None:  # bounded: at most 40 connections, for at most ~3 s
            socks = []
            for _ in range(40):
                if stop.is_set():
                    break
                try:
                    sock = connect(port)
                    sock.send(b"GET /health HTTP/1.1\r\nHost: local")
                    socks.append(sock)
                except OSError:
                    pass
                time.sleep(0.065)
            stop.wait(1.0)
            for sock in socks:
                sock.close()

        attacker = threading.Thread(target=slowloris)
        attacker.start()
        time.sleep(0.5)  # the slow connections hold every place of the address
        statuses = []
        for _ in range(20):  # each on a connection of its own
            statuses.append(httpx.post(f"{url}/predict/sentiment", json={"texts": ["A warm film."]}).status_code)
            time.sleep(0.1)
        stop.set()
        attacker.join(10)
        assert statuses == [200] * 20
        counted = refusals(url)  # the slow connections were closed by the server: replaced, or timed out
        assert counted.get("replaced", 0) >= 1 and counted.get("replaced", 0) + counted.get("header_timeout", 0) >= 30

        busy = []  # 16 places, each with a request under way (its body still to come)
        for i in range(16):
            sock = connect(port, f"127.0.0.{3 + i // 4}")
            sock.send(b"POST /analyze HTTP/1.1\r\nHost: localhost\r\ncontent-type: application/json\r\n"
                      b"content-length: 40\r\n\r\n")
            busy.append(sock)
        time.sleep(0.2)
        late = connect(port, "127.0.0.9")
        late.send(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        data, _ = closed_after(late)
        assert data.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in data and b"--max-connections" in data
        for sock in busy:
            sock.close()
        time.sleep(0.2)  # their places are given back
        assert refusals(url).get("connections") == 1


# -- 6. a model the server can no longer run: its fault, said without its paths ---------------------
@pytest.mark.parametrize("what", ["deleted", "changed"])
def test_a_vanished_checkpoint_is_a_server_fault_and_health_says_so(what, tiny_bert, tmp_path, monkeypatch):
    monkeypatch.setenv("BERTHEADS_CACHE", str(tmp_path / "cache"))
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(tiny_bert, checkpoint)
    encoder = Encoder.load(str(checkpoint))
    encoder.reference = reference(encoder, str(checkpoint))
    out = tmp_path / "head-only"
    bundle.save(BertHeads(encoder, {"sentiment": build_task(encoder, *HEADS["sentiment"])}), out)
    served = bertheads.load(out)
    assert not served.net.encoder.loaded  # the weights load with the first request
    with running_server(create_app(served, ServeSettings(window_ms=1))) as url:
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
        if what == "deleted":
            shutil.rmtree(checkpoint)
            health = httpx.get(f"{url}/health")  # seen before any request needs the weights
            assert health.status_code == 503 and health.json()["status"] == "failing"
        else:  # other weights, as valid safetensors
            state = load_file(str(checkpoint / "model.safetensors"))
            key = next(k for k in state if k.endswith("query.weight"))
            state[key] = state[key] * 2
            save_file(state, str(checkpoint / "model.safetensors"), metadata={"format": "pt"})
        answer = httpx.post(f"{url}/predict/sentiment", json={"texts": ["A warm film."]})
        assert answer.status_code == 503 and str(tmp_path) not in answer.text
        assert "cannot run the model" in answer.json()["detail"]
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503 and health.json()["status"] == "failing"


# -- 8. bodies the server cannot read -----------------------------------------------------------------
@pytest.mark.parametrize("body,headers,detail", [
    (b'{"texts": ["\xff\xfe"]}', JSON, "the body is not UTF-8 text (byte 13)"),
    (b'{"texts": ' + b"[" * 50_000, JSON, "malformed JSON (nested too deeply)"),
    (b'{"texts": [' + b"7" * 5000 + b"]}", JSON, "a number with too many digits"),
    ('{"texts": ["caf\u00e9"]}'.encode("latin-1"), {"content-type": "application/json; charset=latin-1"},
     "charset=latin-1: JSON bodies are UTF-8"),
    (b'{"texts": ["A warm film."]}', {"content-type": "text/plain"}, "Content-Type text/plain: send the body as JSON"),
])
def test_unreadable_bodies_are_422_with_a_detail(model, body, headers, detail):
    with running_server(create_app(model, ServeSettings(window_ms=1))) as url:
        answer = httpx.post(f"{url}/analyze", content=body, headers=headers)
    assert answer.status_code == 422 and detail in answer.json()["detail"], answer.text


def test_a_passage_of_invisible_characters_is_empty(model):
    with running_server(create_app(model, ServeSettings(window_ms=1))) as url:
        for context in ("", "\u200b", "\u200b\ufeff \u2060"):
            answer = httpx.post(f"{url}/predict/qa", json={"questions": ["Who?"], "contexts": [context]})
            assert answer.status_code == 422 and "contexts[0]: empty passage" in answer.json()["detail"]
