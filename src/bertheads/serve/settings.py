"""The server's settings (`bertheads serve` flags derived from them) and the loopback check
they need, apart from the web stack so that the command line loads without it."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from bertheads.base.errors import UserError
from bertheads.base.schema import said, setting, vars_for
from bertheads.base.values import positive_float, positive_int
from bertheads.compute.batching import INFERENCE_BATCH

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    if host.strip("[]").lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass
class Address:
    """Where `bertheads serve` listens."""

    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8000, "port to listen on", type=int)


@dataclass
class ServeSettings:
    max_batch: int = setting(64, "most texts run together in one model call", type=positive_int)
    window_ms: float = setting(5.0, "how long to gather concurrent requests", type=float, flag="--batch-window-ms",
                              metavar="BATCH_WINDOW_MS")
    max_texts: int = setting(64, "most texts in one request", type=positive_int)
    max_text_chars: int = setting(10000, "longest text accepted, in characters", type=positive_int)
    batch_size: int = setting(INFERENCE_BATCH, "encoder batch size inside a model call", type=positive_int, cli=False)
    max_body_bytes: int = setting(0, "largest request body (0: derived from max_texts and max_text_chars)", type=int,
                                  cli=False)
    max_batch_tokens: int = setting(4096, "encoder tokens in one model call", type=positive_int)
    max_queue: int = setting(64, "requests waiting; more get 503 with Retry-After", type=positive_int)
    timeout: float = setting(30.0, "seconds a request may take: 503 if not started by then, 504 if not finished",
                             type=positive_float)
    max_connections: int = setting(128, "concurrent connections; past it a new one takes the place of the one "
                                        "waiting longest for its request's headers (idle or slow), or gets 503 "
                                        "when every one has a request under way", type=positive_int)
    max_client_connections: int = setting(32, "concurrent connections from one client address, kept the same way "
                                              "(behind a proxy every client has its address: raise it to "
                                              "--max-connections)", type=positive_int)
    header_timeout: float = setting(10.0, "seconds a request's headers may take from their first byte; slower: 408, "
                                          "connection closed", type=positive_float)
    keep_alive: float = setting(5.0, "seconds a connection may stay idle (before its first request, or between "
                                     "requests) before it is closed", type=positive_float)
    allowed_hosts: list[str] = setting(help="a Host header name to accept besides loopback names (repeatable; "
                                            "'*': any)", factory=list, flag="--allowed-host", append=True,
                                       metavar="NAME")
    token: str | None = setting(None, "require 'Authorization: Bearer TOKEN' (default: $BERTHEADS_TOKEN)")
    insecure: bool = setting(False, "serve a non-loopback --host without a token")
    access_log: str | None = setting(None, "write one line per request in the Combined Log Format (Apache's, "
                                           "nginx's) to this file, or - for stdout (default: none)",
                                     metavar="FILE")
    cors_origins: list[str] = setting(help="a browser origin allowed to call the API (repeatable; default: none)",
                                      factory=list, flag="--cors-origin", append=True, metavar="ORIGIN")

    def body_limit(self) -> int:
        return self.max_body_bytes or 3 * 4 * self.max_texts * self.max_text_chars + 65536

    def check(self, host: str | None = None) -> None:
        """Settings that cannot work, and a non-loopback `host` without a token, are UserErrors."""
        for name in ("max_batch", "max_texts", "max_text_chars", "max_batch_tokens", "max_queue", "max_connections",
                     "max_client_connections"):
            if getattr(self, name) < 1:
                raise UserError(f"{said(name)}: expected a positive integer, got {getattr(self, name)}")
        for name in ("timeout", "header_timeout", "keep_alive"):
            if not getattr(self, name) > 0:
                raise UserError(f"{said(name)}: expected a positive number of seconds, got {getattr(self, name)}")
        if self.token is not None and not self.token.strip():
            raise UserError(f"{said('token')}: empty")
        if host is not None and not is_loopback(host) and not self.token and not self.insecure:
            raise UserError(f"{said('host', host)} is not a loopback address: give {said('token')} (or set "
                            f"BERTHEADS_TOKEN) so that clients must authenticate, or {said('insecure', True)} to "
                            f"serve without one")


def settings_from_args(args) -> ServeSettings:
    """`bertheads serve` flags as settings."""
    return ServeSettings(**vars_for(ServeSettings, args))
