"""The access log: one line per answered request in the Combined Log Format (Apache's and
nginx's default), which log tools (GoAccess, AWStats, Elastic's and Datadog's parsers) read as
it is:

```
127.0.0.1 - - [04/Dec/2026:10:53:25 +0000] "POST /analyze HTTP/1.1" 200 412 "-" "curl/8.5.0" 0.012
```
(the last field, the seconds taken, is the common `%T`-style extension those parsers skip).
The user field is always `-`: a bearer token is never written."""

from __future__ import annotations

import logging
import sys
import time
from logging.handlers import WatchedFileHandler

log = logging.getLogger("bertheads.access")


def open_access_log(target: str | None) -> logging.Logger | None:
    """The access logger writing to `target` (a file, appended to and reopened when a log
    rotator moves it; "-": stdout), or None for no access log."""
    if not target:
        return None
    handler = logging.StreamHandler(sys.stdout) if target == "-" else WatchedFileHandler(target, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


def quoted(value: str) -> str:
    """A request field inside the format's double quotes (quotes and control characters escaped)."""
    out = value.replace("\\", "\\\\").replace('"', '\\"')
    return "".join(c if 32 <= ord(c) < 127 else f"\\x{ord(c):02x}" for c in out) or "-"


def combined_line(scope: dict, status: int, size: int, seconds: float, now: float | None = None) -> str:
    """One request as a Combined Log Format line."""
    client = (scope.get("client") or ("-",))[0]
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
    target = scope.get("raw_path", b"").decode("latin-1") or scope.get("path", "")
    if scope.get("query_string"):
        target += "?" + scope["query_string"].decode("latin-1")
    request = f"{scope.get('method', '-')} {target} HTTP/{scope.get('http_version', '1.1')}"
    stamp = time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(time.time() if now is None else now))
    return (f'{client} - - [{stamp}] "{quoted(request)}" {status} {size if size else "-"} '
            f'"{quoted(headers.get("referer", ""))}" "{quoted(headers.get("user-agent", ""))}" {seconds:.3f}')


class AccessLog:
    """ASGI middleware: each HTTP request's line once its answer has been sent (the outermost
    layer, so refusals by the guard are logged too)."""

    def __init__(self, app, logger: logging.Logger) -> None:
        self.app, self.logger = app, logger

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.monotonic()
        seen = {"status": 500, "size": 0}

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
            elif message["type"] == "http.response.body":
                seen["size"] += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            self.logger.info(combined_line(scope, seen["status"], seen["size"], time.monotonic() - start))
