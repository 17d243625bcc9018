"""The server's connections, below HTTP requests: how many are open, from whom, and for how
long one may send nothing or dribble its headers.

- at most `max_connections` open connections, and `max_client_connections` from one client
  address: a connection over either limit is answered 503 (`Retry-After`, then closed) when its
  request comes, and never takes a place from the others;
- a connection idle for `keep_alive` seconds (before its first request, or after an answer) is
  closed;
- a request's headers must all arrive within `header_timeout` seconds of their first byte (a
  client sending them a byte at a time cannot hold a connection for long): 408, then closed.

Every refusal is counted in `bertheads_refused_requests_total{reason}` (`connections`,
`client_connections`, `header_timeout`); `bertheads_http_connections` is the number open.
`protocol_for` gives uvicorn the h11 protocol class that keeps these rules.
"""

from __future__ import annotations

import json
import logging

import h11
import uvicorn
from prometheus_client import Gauge
from uvicorn.protocols.http.h11_impl import H11Protocol

from bertheads.serve.guard import Metrics, path_label
from bertheads.serve.settings import ServeSettings

log = logging.getLogger("bertheads.serve.connections")

RETRY_AFTER_S = 1


class Connections:
    """The open connections by client address, the limits on them, and the refusal counts."""

    def __init__(self, settings: ServeSettings, metrics: Metrics) -> None:
        self.settings, self.metrics = settings, metrics
        self.open = 0  # admitted connections
        self.refused_open = 0  # refused ones still open (waiting to be answered 503, or to time out)
        self.by_client: dict[str, int] = {}
        Gauge("bertheads_http_connections", "open connections (admitted)",
              registry=metrics.registry).set_function(lambda: self.open)

    def admit(self, client: str | None) -> str | None:
        """Take a place for a new connection from `client`: None when admitted, else the reason
        it is refused (counted)."""
        reason = None
        if self.open >= self.settings.max_connections:
            reason = "connections"
        elif client is not None and self.by_client.get(client, 0) >= self.settings.max_client_connections:
            reason = "client_connections"
        if reason is not None:
            self.metrics.refused.labels(reason).inc()
            return reason
        self.open += 1
        if client is not None:
            self.by_client[client] = self.by_client.get(client, 0) + 1
        return None

    def release(self, client: str | None) -> None:
        self.open -= 1
        if client is not None:
            left = self.by_client.get(client, 1) - 1
            if left > 0:
                self.by_client[client] = left
            else:
                self.by_client.pop(client, None)

    def detail(self, reason: str) -> str:
        if reason == "connections":
            return f"the server has {self.settings.max_connections} connections open (--max-connections); try again"
        return (f"this client has {self.settings.max_client_connections} connections open "
                f"(--max-client-connections); reuse one or try again")


def raw_answer(status: int, reason: str, detail: str, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 answer with a JSON `detail`, for a connection that ends after it."""
    body = json.dumps({"detail": detail}).encode()
    lines = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
             "connection: close", *(f"{k}: {v}" for k, v in (headers or {}).items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def refusing_app(connections: Connections, reason: str):
    """The ASGI app a refused connection's request gets: 503 with Retry-After, then the
    connection is closed."""

    async def refuse(scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        connections.metrics.requests.labels(path_label(scope.get("path", "")), "503").inc()
        body = json.dumps({"detail": connections.detail(reason)}).encode()
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(RETRY_AFTER_S).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    return refuse


def protocol_for(connections: Connections) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the connection limits and timeouts of `connections`."""
    settings = connections.settings

    class GuardedProtocol(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.host = self.client[0] if self.client else None
            self.header_timer = None
            self.refused = connections.admit(self.host)
            if self.refused is not None:
                if connections.refused_open >= settings.max_connections:  # refused ones waiting: bounded too
                    self.refused = "dropped"
                    transport.abort()
                    return
                connections.refused_open += 1
                self.app = refusing_app(connections, self.refused)
            self.idle_timer = self.loop.call_later(settings.keep_alive, self.idle_expired)

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE and self.header_timer is None:  # a request's first bytes
                self.cancel_idle()
                self.header_timer = self.loop.call_later(settings.header_timeout, self.headers_expired)
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE and self.header_timer is not None:  # its headers are in
                self.header_timer.cancel()
                self.header_timer = None

        def on_response_complete(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None
            super().on_response_complete()  # uvicorn's keep-alive timer (settings.keep_alive) then runs

        def connection_lost(self, exc) -> None:
            self.cancel_idle()
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None
            if self.refused is None:
                connections.release(self.host)
            elif self.refused != "dropped":
                connections.refused_open -= 1
            self.refused = "gone"
            super().connection_lost(exc)

        def cancel_idle(self) -> None:
            timer = getattr(self, "idle_timer", None)
            if timer is not None:
                timer.cancel()
                self.idle_timer = None

        def idle_expired(self) -> None:
            self.idle_timer = None
            if self.conn.their_state is h11.IDLE and self.header_timer is None and not self.transport.is_closing():
                self.transport.close()

        def headers_expired(self) -> None:
            self.header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                connections.metrics.refused.labels("header_timeout").inc()
                self.transport.write(raw_answer(408, "Request Timeout", f"request headers not received within "
                                                                        f"{settings.header_timeout:g} s"))
                self.transport.close()

    return GuardedProtocol


def server_config(app, host: str, port: int, **options) -> uvicorn.Config:
    """uvicorn's settings for serving `app` (made by `create_app`): its connection rules, and the
    keep-alive timeout; `options` are more of uvicorn's settings."""
    connections: Connections = app.state.connections
    return uvicorn.Config(app, host=host, port=port, http=protocol_for(connections),
                          timeout_keep_alive=connections.settings.keep_alive, limit_concurrency=None, **options)
