"""The server's own faults told apart from the client's: a model it can no longer run (a file it
reads on first use changed or disappeared after it started) is answered 503 with a detail that
names no server path (the server's log has the whole line), and `/health` then says `failing`
with 503."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from bertheads.base.errors import SystemFault, one_line
from bertheads.serve.guard import Control

log = logging.getLogger("bertheads.serve.faults")

PUBLIC_DETAIL = ("the server cannot run the model: a file it reads changed or went missing after it started "
                 "(the server's log says which)")


def model_problem(model) -> str | None:
    """Why `model` (a `bertheads.Model`) could no longer run, as far as can be seen without
    running it: an encoder whose weights load on first use and whose checkpoint is gone."""
    check = getattr(model.net.encoder, "weights_missing", None)
    return check() if check is not None else None


def add_fault_handlers(app: FastAPI, control: Control) -> None:
    """A `SystemFault` met while answering: 503, a detail without server paths, the fault kept
    for `/health` and logged."""

    @app.exception_handler(SystemFault)
    async def server_fault(request: Request, exc: SystemFault):
        control.fault = one_line(exc)
        log.error(f"bertheads serve: {control.fault}")
        return JSONResponse({"detail": PUBLIC_DETAIL}, status_code=503)
