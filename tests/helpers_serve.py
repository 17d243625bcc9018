"""A served app on loopback for the tests that speak HTTP to it: uvicorn in a background thread,
with the settings `bertheads serve` gives it (`serve/connections.py` `server_config`)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from bertheads.serve.connections import server_config


@contextmanager
def running_server(app, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> Iterator[str]:
    """Serve `app` with uvicorn in a background thread; yields its base URL and stops it after."""
    if port == 0:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
    server = uvicorn.Server(server_config(app, host, port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="bertheads-server", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"the server did not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
