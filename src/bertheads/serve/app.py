"""`bertheads serve DIR`: a FastAPI app over a loaded model, with a web page at `/`.

```
POST /analyze          {"texts": [...]} (+ each head form's extra, one per text)  -> {"results": [{head: prediction}]}
POST /predict/{head}   the fields of the head's input form, e.g. {"texts": [...]}  -> {"results": [...]}
GET  /heads            names, kinds, input forms and labels of the heads
GET  /health           status and batching counters
GET  /docs             OpenAPI documentation (schema at /openapi.json)
```
Concurrent requests are gathered for a short window (`window_ms`) up to `max_batch` texts and
`max_batch_tokens` encoder tokens and run as one model call on a single worker thread, so the
encoder sees full batches and requests never compete for the CPU (`serve/queue.py`). The queue is
bounded, each request has a deadline, and the `Host` check, token, body limit and metrics sit in
front of the app (`serve/guard.py`). Bad input is answered 4xx with a one-line `detail`.
"""

from __future__ import annotations

import asyncio
import gzip
import logging
import socket
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

import numpy as np
import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from pydantic import BaseModel

from bertheads.api import load
from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.inference.analyze import analyze_inputs, extras_of
from bertheads.serve.access import AccessLog, open_access_log
from bertheads.serve.bodies import add_body_handlers, blank
from bertheads.serve.connections import Connections, server_config
from bertheads.serve.faults import PUBLIC_DETAIL, add_fault_handlers, model_problem
from bertheads.serve.guard import Control, Guard, Metrics, allowed_hosts
from bertheads.serve.queue import Batcher, DeadlineExceeded, Overloaded, request_tokens, token_counter
from bertheads.serve.requests import analyze_body, given_fields, predict_body
from bertheads.serve.settings import ServeSettings, settings_from_args  # noqa: F401 (re-exported)

__all__ = ["Batcher", "ServeSettings", "create_app", "serve"]

log = logging.getLogger("bertheads.serve.app")


# -- batching (the queue itself is serve/queue.py `Batcher`) -----------------------------
def answer_requests(model, key: tuple, payloads: list[dict], batch_size: int = INFERENCE_BATCH) -> list[list]:
    """One model call for several requests of the same key; results split per request."""
    sizes = [p["size"] for p in payloads]
    if key[0] == "analyze":
        texts = [t for p in payloads for t in p["texts"]]
        extras = {name: [v for p in payloads for v in p["extras"][name]] for name in key[1]}
        results = model.analyze(texts, batch_size=batch_size, **extras)
    else:
        inputs = [x for p in payloads for x in p["inputs"]]
        results = model.predict(inputs, head=key[1], batch_size=batch_size)
    out, start = [], 0
    for n in sizes:
        out.append(plain(results[start : start + n]))
        start += n
    return out


def plain(value: Any) -> Any:
    """Predictions as plain JSON values (numpy scalars and arrays converted)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


class Results(BaseModel):
    results: list[Any]


class Problem(BaseModel):
    detail: str


STATIC = "/static"  # the docs pages' files (open without a token: they hold no data)
ASSETS = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
          "redoc.standalone.js": "text/javascript"}  # each kept as NAME.gz in serve/static/
ERRORS = {code: {"model": Problem} for code in (400, 401, 404, 408, 413, 422, 503, 504)}


# -- the app -----------------------------------------------------------------------------
def describe_heads(model) -> list[dict]:
    return [{"name": name, **plain(task.publishing.describe())} for name, task in model.net.tasks.items()]


def validation_message(exc: RequestValidationError) -> str:
    """FastAPI's validation errors as one readable line."""
    parts = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        where = ""
        for x in loc:
            where += f"[{x}]" if x.isdigit() else (f".{x}" if where else x)
        msg = err.get("msg", "invalid")
        if err.get("type") == "missing" and not where:
            msg = "missing request body; send JSON such as {\"texts\": [\"...\"]}"
        elif err.get("type") == "json_invalid":
            at = f" at character {loc[-1]}" if loc and loc[-1].isdigit() else ""
            where, msg = "", f"malformed JSON{at} ({err.get('ctx', {}).get('error', msg)})"
        elif err.get("type") == "extra_forbidden":
            msg = "unknown field"
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(dict.fromkeys(parts)) or "invalid request"


def check_texts(field_name: str, values: list, settings: ServeSettings, kind: str = "text") -> None:
    if not values:
        raise HTTPException(422, f"{field_name}: empty list; send at least one {kind}")
    if len(values) > settings.max_texts:
        raise HTTPException(413, f"{field_name}: {len(values)} items in one request; at most {settings.max_texts} "
                                 f"(--max-texts)")
    for i, value in enumerate(values):
        for j, text in enumerate(value if isinstance(value, (list, tuple)) else (value,)):
            at = f"{field_name}[{i}]" + (f"[{j}]" if isinstance(value, (list, tuple)) else "")
            if blank(text):
                raise HTTPException(422, f"{at}: empty {kind}" + (" (only invisible characters)" if text.strip() else ""))
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise HTTPException(422, f"{at}: not valid Unicode (a lone surrogate at character {exc.start}); "
                                         f"send text that UTF-8 can encode") from None
            if len(text) > settings.max_text_chars:
                raise HTTPException(413, f"{at}: {len(text)} characters; at most {settings.max_text_chars} "
                                         f"(--max-text-chars)")


def same_length(name: str, values: list | None, texts: list, texts_name: str) -> None:
    if values is not None and len(values) != len(texts):
        raise HTTPException(422, f"{name}: {len(values)} items, expected one per {texts_name} ({len(texts)})")


def create_app(model, settings: ServeSettings | None = None, bind_host: str | None = None) -> FastAPI:
    """The FastAPI app serving `model` (a `bertheads.Model`); `bind_host` joins the accepted Host names."""
    settings = settings or ServeSettings()
    settings.check()
    batcher = Batcher(lambda key, payloads: answer_requests(model, key, payloads, settings.batch_size),
                      settings.max_batch, settings.window_ms / 1000.0, settings.max_batch_tokens, settings.max_queue)
    metrics = Metrics(batcher)
    batcher.observe = metrics.observe_batch
    control = Control()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="bertheads", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="One BERT encoder, many task heads. `POST /analyze` runs every single-text head "
                              "in one encoder pass; `POST /predict/{head}` runs one head.")
    app.state.model, app.state.batcher, app.state.settings = model, batcher, settings
    app.state.metrics, app.state.control = metrics, control
    app.state.connections = Connections(settings, metrics)
    control.check = lambda: model_problem(model)
    add_middleware(app, settings, bind_host, control, metrics)
    add_error_handlers(app, metrics)
    add_fault_handlers(app, control)
    add_body_handlers(app)
    heads = describe_heads(model)
    add_info_routes(app, heads, settings, batcher, metrics, control)
    add_docs_routes(app)
    add_model_routes(app, model, heads, settings, batcher, metrics)
    return app


def add_middleware(app: FastAPI, settings: ServeSettings, bind_host: str | None, control: Control,
                   metrics: Metrics) -> None:
    """CORS (when origins are allowed), then the guard: Host check, token, body limit, counters."""
    if settings.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins, allow_methods=["GET", "POST"],
                           allow_headers=["content-type", "authorization"], max_age=600)
    app.add_middleware(Guard, hosts=allowed_hosts(settings.allowed_hosts, bind_host), token=settings.token,
                       body_limit=settings.body_limit(), body_timeout=settings.timeout, control=control,
                       metrics=metrics)
    access = open_access_log(settings.access_log)
    if access is not None:  # added last: the outermost layer, so the guard's refusals are logged too
        app.add_middleware(AccessLog, logger=access)


def add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    """Bad input answered 422, a full queue 503 (with Retry-After), a late answer 504: one-line `detail`s."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return JSONResponse({"detail": validation_message(exc)}, status_code=422)

    @app.exception_handler(UserError)
    async def user_error(request: Request, exc: UserError):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(Overloaded)
    async def overloaded(request: Request, exc: Overloaded):
        metrics.refused.labels(exc.reason).inc()
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Retry-After": str(exc.retry_after)})

    @app.exception_handler(DeadlineExceeded)
    async def too_slow(request: Request, exc: DeadlineExceeded):
        metrics.refused.labels("timeout").inc()
        return JSONResponse({"detail": str(exc)}, status_code=504)


def add_info_routes(app: FastAPI, heads: list[dict], settings: ServeSettings, batcher: Batcher, metrics: Metrics,
                    control: Control) -> None:
    """`/` (the page), `/health` (liveness), `/ready` (readiness), `/metrics` and `/heads`."""

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(resources.files("bertheads.serve").joinpath("page.html").read_text(encoding="utf-8"))

    @app.get("/health", summary="liveness, batching and queue counters (503 while the model cannot run)")
    async def health() -> Any:
        failing = control.problem() is not None
        counters = {"status": "draining" if control.draining else "failing" if failing else "ok", "heads": len(heads),
                    "requests": batcher.requests, "batches": batcher.batches, "largest_batch": batcher.largest,
                    "largest_batch_tokens": batcher.largest_tokens, "queued": batcher.queued,
                    "dropped": batcher.dropped, "expired": batcher.expired}
        return JSONResponse({**counters, "detail": PUBLIC_DETAIL}, status_code=503) if failing else counters

    @app.get("/ready", summary="readiness: 200 while new requests are taken; 503 while starting, draining, failing "
                               "or with a full queue (`/health` is liveness)")
    async def ready() -> Any:
        reason = ("draining" if control.draining else "failing" if control.problem() is not None
                  else "starting" if not batcher.running else "queue full" if batcher.queued >= batcher.max_queue
                  else None)
        if reason is None:
            return {"ready": True}
        return JSONResponse({"ready": False, "detail": reason}, status_code=503, headers={"Retry-After": "1"})

    @app.get("/metrics", include_in_schema=False)
    async def prometheus() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/heads", summary="the model's heads: names, kinds, inputs, labels")
    async def list_heads() -> dict:
        return {"heads": heads, "limits": {"max_texts": settings.max_texts,
                                           "max_text_chars": settings.max_text_chars,
                                           "timeout_s": settings.timeout}}


def add_docs_routes(app: FastAPI) -> None:
    """`/docs` (Swagger UI) and `/redoc` (ReDoc) from their files shipped with the package,
    gzip-compressed (`serve/static/`), never a CDN: they work offline. Swagger UI's validator
    badge (an image from validator.swagger.io for a schema not on localhost) is turned off."""

    @app.get(STATIC + "/{name}", include_in_schema=False)
    async def asset(name: str, request: Request) -> Response:
        if name not in ASSETS:
            raise HTTPException(404, f"no file {name!r} here")
        data = resources.files("bertheads.serve").joinpath("static", name + ".gz").read_bytes()
        headers = {"Cache-Control": "public, max-age=86400", "Vary": "Accept-Encoding"}
        if accepts_gzip(request.headers.get("accept-encoding")):
            headers["Content-Encoding"] = "gzip"
        else:  # identity asked for (or no gzip offered): the file as it is
            data = gzip.decompress(data)
        return Response(data, media_type=ASSETS[name], headers=headers)

    @app.get("/docs", include_in_schema=False)
    async def swagger() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url, title="bertheads: API",
                                   swagger_js_url=f"{STATIC}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{STATIC}/swagger-ui.css", swagger_favicon_url="data:,",
                                   swagger_ui_parameters={"validatorUrl": None})

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url=app.openapi_url, title="bertheads: API",
                              redoc_js_url=f"{STATIC}/redoc.standalone.js", redoc_favicon_url="data:,",
                              with_google_fonts=False)


def accepts_gzip(header: str | None) -> bool:
    """Whether an `Accept-Encoding` header takes gzip: named (or `*`) with a q above 0; without
    the header, identity."""
    if not header:
        return False
    weights = {}
    for part in header.split(","):
        coding, _, params = part.strip().partition(";")
        q = 1.0
        for param in params.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        weights[coding.strip().lower()] = q
    return weights.get("gzip", weights.get("x-gzip", weights.get("*", 0.0))) > 0


async def queued(request: Request, batcher: Batcher, settings: ServeSettings, metrics: Metrics, key: tuple,
                 payload: dict, size: int, cost) -> list | Response:
    """Queue the request; drop it if the client goes away before its answer."""
    tokens = await asyncio.get_running_loop().run_in_executor(None, cost)
    task = asyncio.ensure_future(batcher.submit(key, payload, size, tokens, settings.timeout))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.1)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                metrics.refused.labels("client_gone").inc()
                return Response(status_code=499)
    finally:
        if not task.done():
            task.cancel()


def add_model_routes(app: FastAPI, model, heads: list[dict], settings: ServeSettings, batcher: Batcher,
                     metrics: Metrics) -> None:
    """`POST /analyze` (every head, one encoder pass) and `POST /predict/{head}`; their bodies
    hold the fields of the heads' input forms (`serve/requests.py`)."""
    count = token_counter(model.net.encoder.tokenizer)
    tasks = model.net.tasks
    extras = extras_of(model.net)

    async def analyze(body, request: Request) -> Any:
        check_texts("texts", body.texts, settings)
        given = {name: value for name, value in given_fields(body).items() if name != "texts"}
        for name, values in given.items():
            same_length(name, values, body.texts, "text")
            check_texts(name, values, settings, extras[name].noun)
        payload = {"texts": body.texts, "extras": given, "size": len(body.texts)}

        def cost() -> int:
            return request_tokens(model.net, analyze_inputs(model.net, body.texts, given), lengths=count)

        results = await queued(request, batcher, settings, metrics, ("analyze", tuple(sorted(given))), payload,
                               len(body.texts), cost)
        if not isinstance(results, Response):
            for name in tasks:
                metrics.count_abstained(name, [r.get(name) for r in results])
        return results if isinstance(results, Response) else {"results": results}

    async def predict(head: str, body, request: Request) -> Any:
        if head not in tasks:
            raise HTTPException(404, f"no head named {head!r} (heads: {', '.join(tasks)})")
        form = tasks[head].reading.form
        given = given_fields(body)
        inputs = form.request_inputs(given, head, tasks[head].kind)
        for f in form.fields:
            check_texts(f.name, given[f.name], settings, f.noun)

        def cost() -> int:
            return request_tokens(model.net, {head: inputs}, lengths=count)

        results = await queued(request, batcher, settings, metrics, ("predict", head), {"inputs": inputs,
                               "size": len(inputs)}, len(inputs), cost)
        if not isinstance(results, Response):
            metrics.count_abstained(head, results)
        return results if isinstance(results, Response) else {"results": results}

    # the bodies are built for this model's forms: their types are set here, not written in the signatures
    analyze.__annotations__["body"] = analyze_body(extras)
    predict.__annotations__["body"] = predict_body(list({t.reading.form.name: t.reading.form for t in tasks.values()}.values()))
    app.post("/analyze", response_model=Results, responses=ERRORS,
             summary="every head on each text, one encoder pass")(analyze)
    app.post("/predict/{head}", response_model=Results, responses=ERRORS,
             summary="one head's predictions, in the shapes `bertheads predict` writes")(predict)


# -- running ------------------------------------------------------------------------------
def serve(directory: str, host: str = "127.0.0.1", port: int = 8000, settings: ServeSettings | None = None,
          verify: bool = True, runtime: str = "auto", precision: str = "auto", options: dict | None = None,
          device: str = "auto", gate_data: str | None = None, encoder: str | None = None, force: bool = False,
          verbose: bool = True) -> None:
    """Load the model in `directory` and serve it until interrupted; SIGTERM (or Ctrl-C) stops
    taking new work, lets the requests in flight finish (up to `--timeout`), then exits.
    `options`: inference options for the heads whose kinds take them (`Model.set_options`)."""
    settings = settings or ServeSettings()
    settings.check(host)
    model = load(directory, device=device, verify=verify, runtime=runtime, precision=precision, gate_data=gate_data,
                 encoder=encoder, force=force, verbose=verbose)
    model.set_options(**(options or {}))
    check_port(host, port)
    app = create_app(model, settings, bind_host=host)
    control = app.state.control

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            control.draining = True
            super().handle_exit(sig, frame)

    config = server_config(app, host, port, log_level="warning", timeout_graceful_shutdown=int(settings.timeout) + 5)
    auth = "bearer token required" if settings.token else "no token"
    print(f"serving {directory} (heads: {', '.join(model.heads)}) on http://{host}:{port}  "
          f"(page at /, API docs at /docs and /redoc, probes at /health and /ready, metrics at /metrics; {auth})", flush=True)
    DrainingServer(config).run()
    print("bertheads serve: stopped", flush=True)


def check_port(host: str, port: int) -> None:
    """A clear error when the address cannot be served on (in use, not ours, bad port)."""
    if not 0 <= port <= 65535:
        raise UserError(f"{said('port')}: expected 0..65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"{said('host', host)}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise UserError(f"cannot serve on {host}:{port}: {exc.strerror}; choose another "
                            f"{said('port')} or {said('host')}") from None
