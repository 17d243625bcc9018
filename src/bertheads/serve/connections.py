"""The server's connections, below HTTP requests: how many are open, from whom, and for how
long one may send nothing or dribble its headers.

- at most `max_connections` open connections, and `max_client_connections` from one client
  address. Past either limit, a new connection takes the place of the connection (of all, or
  of that client) that has waited longest for a request's headers (idle, or dribbling them),
  once that one has waited `REPLACE_AFTER_S`; a connection whose request is under way is never
  closed for another. A connection that finds no such place waits without one: when its own
  request's headers are in, it takes the place of any connection still waiting for its
  headers, or is answered 503 (`Retry-After`, then closed) when every place has a request
  under way. Connections without a place are bounded too (`max_connections` of them);
- a connection idle for `keep_alive` seconds (before its first request, or after an answer) is
  closed;
- a request's headers must all arrive within `header_timeout` seconds of their first byte (a
  client sending them a byte at a time cannot hold a connection for long): 408, then closed.

So connections that send nothing useful, from one address or many, cannot keep real requests
out: a complete request always goes before them. Every refusal is counted in
`bertheads_refused_requests_total{reason}` (`connections` and `client_connections`: answered
503 or closed at once for want of a place; `replaced`: closed to make room; `header_timeout`);
`bertheads_http_connections` is the number holding a place. `protocol_for` gives uvicorn the
h11 protocol class that keeps these rules.
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
# a connection waits this long for its request before a new connection may take its place (a
# real client sends its request as soon as it has connected); at most half the header timeout
REPLACE_AFTER_S = 1.0


class Connections:
    """The connections holding a place (protocol objects), by client address, and the limits."""

    def __init__(self, settings: ServeSettings, metrics: Metrics) -> None:
        self.settings, self.metrics = settings, metrics
        self.admitted: set = set()
        self.by_client: dict[str | None, set] = {}
        self.waiting = 0  # connections without a place, still open
        Gauge("bertheads_http_connections", "open connections holding a place",
              registry=metrics.registry).set_function(lambda: len(self.admitted))

    def admit(self, conn, now: float, complete: bool = False) -> str | None:
        """Give `conn` (its `host` the client address) a place, closing the connection that has
        waited longest for its headers where a limit is reached: one that waited since before
        `now - REPLACE_AFTER_S`, or (`complete`: `conn` has a whole request) any one. None when
        admitted, else the limit that kept it out."""
        grace = 0.0 if complete else min(REPLACE_AFTER_S, self.settings.header_timeout / 2)
        leaving: list = []
        for group, limit, reason in ((self.admitted, self.settings.max_connections, "connections"),
                                     (self.by_client.get(conn.host, set()), self.settings.max_client_connections,
                                      "client_connections")):
            members = [c for c in group if c not in leaving]
            if len(members) < limit:
                continue
            idle = [c for c in members if c.waiting_since is not None and c.waiting_since <= now - grace]
            if not idle:
                return reason
            leaving.append(min(idle, key=lambda c: c.waiting_since))
        for old in leaving:
            self.release(old)
            old.replaced()
            self.metrics.refused.labels("replaced").inc()
        self.admitted.add(conn)
        self.by_client.setdefault(conn.host, set()).add(conn)
        return None

    def release(self, conn) -> None:
        """Give back the place of `conn` (a connection already replaced holds none)."""
        self.admitted.discard(conn)
        mine = self.by_client.get(conn.host)
        if mine is not None:
            mine.discard(conn)
            if not mine:
                del self.by_client[conn.host]

    def detail(self, reason: str) -> str:
        if reason == "connections":
            return (f"the server's {self.settings.max_connections} connections all have requests under way "
                    f"(--max-connections); try again")
        return (f"this client's {self.settings.max_client_connections} connections all have requests under way "
                f"(--max-client-connections); reuse one or try again")


def raw_answer(status: int, reason: str, detail: str) -> bytes:
    """A whole HTTP/1.1 answer with a JSON `detail`, for a connection that ends after it."""
    body = json.dumps({"detail": detail}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n\r\n")
    return head.encode() + body


def protocol_for(connections: Connections) -> type[H11Protocol]:
    """uvicorn's h11 protocol with the connection limits and timeouts of `connections`."""
    settings = connections.settings

    class GuardedProtocol(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.host = self.client[0] if self.client else None
            self.header_timer = self.idle_timer = None
            self.waiting_since = self.loop.time()  # waiting for a request's headers (None: one under way)
            self.kept_out = connections.admit(self, self.waiting_since)  # the limit, while it has no place
            if self.kept_out is not None:
                if connections.waiting >= settings.max_connections:  # those without a place: bounded too
                    connections.metrics.refused.labels(self.kept_out).inc()
                    self.kept_out = "closed"
                    transport.abort()
                    return
                connections.waiting += 1
                self.served_by, self.app = self.app, self.place_first
            self.idle_timer = self.loop.call_later(settings.keep_alive, self.idle_expired)

        async def place_first(self, scope, receive, send) -> None:
            """The app of a connection without a place, once its request is in: take the place of
            one still waiting for its headers and serve it, or answer 503."""
            if self.kept_out not in (None, "closed", "gone"):
                reason = connections.admit(self, self.loop.time(), complete=True)
                if reason is None:
                    connections.waiting -= 1
                    self.kept_out, self.app = None, self.served_by
                else:
                    self.kept_out = reason
            if self.kept_out is None:
                await self.served_by(scope, receive, send)
                return
            connections.metrics.refused.labels(self.kept_out).inc()
            connections.metrics.requests.labels(path_label(scope.get("path", "")), "503").inc()
            body = json.dumps({"detail": connections.detail(self.kept_out)}).encode()
            await send({"type": "http.response.start", "status": 503, "headers": [
                (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(RETRY_AFTER_S).encode()), (b"connection", b"close")]})
            await send({"type": "http.response.body", "body": body})

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE and self.header_timer is None:  # a request's first bytes
                self.cancel_timer("idle_timer")
                self.header_timer = self.loop.call_later(settings.header_timeout, self.headers_expired)
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:  # its headers are in: the request is under way
                self.waiting_since = None
                self.cancel_timer("header_timer")

        def on_response_complete(self) -> None:
            self.cancel_timer("header_timer")
            super().on_response_complete()  # uvicorn's keep-alive timer (settings.keep_alive) then runs
            if self.conn.their_state is h11.IDLE:
                self.waiting_since = self.loop.time()

        def connection_lost(self, exc) -> None:
            self.cancel_timer("idle_timer")
            self.cancel_timer("header_timer")
            if self.kept_out is None:
                connections.release(self)
            elif self.kept_out not in ("closed", "gone"):
                connections.waiting -= 1
            self.kept_out = "gone"
            super().connection_lost(exc)

        def cancel_timer(self, name: str) -> None:
            timer = getattr(self, name, None)
            if timer is not None:
                timer.cancel()
                setattr(self, name, None)

        def replaced(self) -> None:
            """Closed to make room for another connection (its place is already given up)."""
            self.kept_out = "closed"
            if not self.transport.is_closing():
                if self.header_timer is not None:  # its headers had begun: say why
                    self.transport.write(raw_answer(408, "Request Timeout", "request headers not received before "
                                                                            "the connection's place was needed"))
                self.transport.close()

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
