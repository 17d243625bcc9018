"""What stands between the network and the server's API: the `Host` check, bearer-token auth,
the body limit on the bytes actually received (any framing, chunked included), refusing new
work while shutting down, and Prometheus metrics of every answer.

`Guard` is a plain ASGI middleware, so it sees each request before anything reads its body.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bertheads.serve.bodies import content_type_problem
from bertheads.serve.settings import LOOPBACK_NAMES, is_loopback  # noqa: F401 (is_loopback: re-exported)

OPEN_PATHS = ("/", "/health", "/ready")  # answered without a token (the page asks for one; probes)
OPEN_PREFIXES = ("/static/",)  # the docs pages' script and style files
BODY_METHODS = ("POST", "PUT", "PATCH")
DRAIN_BYTES = 64 * 2**20  # an oversized body is read on (and discarded) up to this, so the client sees the 413
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class Control:
    """Server state the guard reads: set `draining` when shutting down; `fault`: why the model
    could not run (a server fault, for `/health`); `check`: looks for such a fault at once."""

    draining: bool = False
    fault: str | None = None
    check: Callable[[], str | None] | None = None

    def problem(self) -> str | None:
        """Why the server cannot run its model (None while it can)."""
        return self.fault or (self.check() if self.check is not None else None)


def host_name(header: str) -> str:
    """The name in a `Host` header: port, IPv6 brackets and a trailing dot removed, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    if header.count(":") == 1:
        header = header.split(":", 1)[0]
    return header.rstrip(".")


def allowed_hosts(extra: list[str], bind_host: str | None = None) -> set[str] | None:
    """Loopback names, the address served on (unless a wildcard) and `extra`; None when '*' allows any."""
    if "*" in extra:
        return None
    names = set(LOOPBACK_NAMES) | {host_name(h) for h in extra}
    if bind_host and bind_host not in ("0.0.0.0", "::", ""):
        names.add(bind_host.strip("[]").lower())
    return names


def path_label(path: str) -> str:
    """A bounded label for metrics: the route, not the raw path."""
    if path.startswith("/predict/"):
        return "/predict/{head}"
    if path.startswith(OPEN_PREFIXES):
        return "/static"
    return path if path in ("/", "/analyze", "/heads", "/health", "/ready", "/metrics", "/docs", "/redoc",
                            "/openapi.json") else "other"


class Metrics:
    """The server's Prometheus metrics, in a registry of their own."""

    def __init__(self, batcher) -> None:
        self.registry = registry = CollectorRegistry()
        self.requests = Counter("bertheads_http_requests", "HTTP requests answered, by route and status",
                                ["path", "status"], registry=registry)
        self.latency = Histogram("bertheads_http_request_duration_seconds", "time to answer a request, by route",
                                 ["path"], buckets=LATENCY_BUCKETS, registry=registry)
        self.in_flight = Gauge("bertheads_http_requests_in_flight", "requests being answered", registry=registry)
        queue = Gauge("bertheads_queue_requests", "requests waiting for the model", registry=registry)
        queue.set_function(lambda: batcher.queued)
        queue_tokens = Gauge("bertheads_queue_tokens", "encoder tokens waiting for the model", registry=registry)
        queue_tokens.set_function(lambda: batcher.queued_tokens)
        self.batch_texts = Histogram("bertheads_batch_texts", "texts per model call", registry=registry,
                                     buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
        self.batch_tokens = Histogram("bertheads_batch_tokens", "encoder tokens per model call", registry=registry,
                                      buckets=(32, 128, 512, 1024, 2048, 4096, 8192, 16384, 65536, 262144))
        self.batch_seconds = Histogram("bertheads_batch_duration_seconds", "time of one model call",
                                       buckets=LATENCY_BUCKETS, registry=registry)
        self.abstained = Counter("bertheads_abstained_predictions", "predictions below --min-confidence (answered "
                                 "with \"abstained\": true), by head", ["head"], registry=registry)
        self.refused = Counter("bertheads_refused_requests", "requests refused or dropped before the model ran, "
                               "by reason", ["reason"], registry=registry)

    def count_abstained(self, head: str, predictions: list) -> None:
        """Count the predictions of `head` that abstained."""
        n = sum(1 for p in predictions if isinstance(p, dict) and p.get("abstained") is True)
        if n:
            self.abstained.labels(head).inc(n)

    def observe_batch(self, texts: int, tokens: int, seconds: float) -> None:
        self.batch_texts.observe(texts)
        self.batch_tokens.observe(tokens)
        self.batch_seconds.observe(seconds)


class Guard:
    """ASGI middleware: Host check, token, draining, body limit, metrics (in that order)."""

    def __init__(self, app, *, hosts: set[str] | None, token: str | None, body_limit: int, body_timeout: float,
                 control: Control, metrics: Metrics | None = None) -> None:
        self.app, self.hosts, self.token = app, hosts, token
        self.body_limit, self.body_timeout = body_limit, body_timeout
        self.control, self.metrics = control, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [0]

        async def send_status(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        metrics = self.metrics
        if metrics is not None:
            metrics.in_flight.inc()
        try:
            await self.handle(scope, receive, send_status)
        except BaseException:
            status[0] = status[0] or 500
            raise
        finally:
            if metrics is not None:
                metrics.in_flight.dec()
                label = path_label(scope.get("path", ""))
                metrics.requests.labels(label, str(status[0] or 499)).inc()
                metrics.latency.labels(label).observe(time.perf_counter() - started)

    async def handle(self, scope, receive, send) -> None:
        headers = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        if self.hosts is not None:
            host = host_name(headers.get("host", ""))
            if host not in self.hosts:
                shown = headers.get("host", "")[:100]
                await answer(send, 400, f"Host header {shown!r} is not served here; start the server with "
                                        f"--allowed-host NAME to accept it")
                return
        if self.control.draining:
            await answer(send, 503, "the server is shutting down", {"retry-after": "5", "connection": "close"})
            return
        path = scope.get("path", "")
        if self.token and scope.get("method") != "OPTIONS" and path not in OPEN_PATHS \
                and not path.startswith(OPEN_PREFIXES):
            given = headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), self.token.encode()):
                detail = "missing bearer token" if not given else "wrong bearer token"
                await answer(send, 401, f"{detail}: send 'Authorization: Bearer TOKEN' (the server's --token)",
                             {"www-authenticate": 'Bearer realm="bertheads"'})
                return
        if scope.get("method") not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        wrong_type = content_type_problem(headers.get("content-type"))
        if wrong_type is not None:
            await self.discard_body(receive)
            await answer(send, 422, wrong_type)
            return
        length = headers.get("content-length")
        if length is not None:
            if not length.strip().isdigit():
                await answer(send, 400, "malformed Content-Length header", {"connection": "close"})
                return
            if int(length) > self.body_limit:
                if int(length) <= DRAIN_BYTES:
                    await self.discard_body(receive)
                await answer(send, 413, f"request body of {int(length)} bytes; at most {self.body_limit}",
                             {"connection": "close"})
                return
        body = await self.read_body(receive, send)
        if body is None:
            return

        sent = [False]

        async def replay():
            if not sent[0]:
                sent[0] = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def read_body(self, receive, send) -> bytes | None:
        """The whole body, or None after answering 413 (too large) or 408 (too slow)."""
        chunks, total = [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.001, deadline - loop.time()))
            except TimeoutError:
                await answer(send, 408, f"request body not received within {self.body_timeout:g} s",
                             {"connection": "close"})
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.body_limit:
                chunks.clear()
                if message.get("more_body", False):
                    await self.discard_body(receive, total)
                await answer(send, 413, f"request body of more than {self.body_limit} bytes; at most "
                                        f"{self.body_limit}", {"connection": "close"})
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


    async def discard_body(self, receive, received: int = 0) -> None:
        """Read the rest of a refused body without keeping it (up to DRAIN_BYTES and the body
        timeout), so that the client, still sending, gets to read the answer."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        while received <= DRAIN_BYTES:
            try:
                message = await asyncio.wait_for(receive(), max(0.001, deadline - loop.time()))
            except TimeoutError:
                return
            if message["type"] != "http.request":
                return
            received += len(message.get("body", b""))
            if not message.get("more_body", False):
                return


async def answer(send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
