"""`bertheads serve DIR`: a FastAPI app over a loaded model, with a web page at `/`.

```
POST /analyze          {"texts": [...]} (+ "second_texts", "questions")  -> {"results": [{head: prediction}]}
POST /predict/{head}   {"texts": [...]} | {"pairs": [[a, b]]} | {"questions": [...], "contexts": [...]}
GET  /heads            names, kinds, inputs and labels of the heads
GET  /health           status and batching counters
GET  /docs             OpenAPI documentation (schema at /openapi.json)
```
Concurrent requests are gathered for a short window (`window_ms`) up to `max_batch` texts
and run as one model call on a single worker thread, so the encoder sees full batches and
requests never compete for the CPU. Bad input is answered 4xx with a one-line `detail`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from bertheads.errors import UserError
from bertheads.multi import head_input
from bertheads.packing import INFERENCE_BATCH

log = logging.getLogger("bertheads.serve")


@dataclass
class ServeSettings:
    max_batch: int = 64  # most texts run together in one model call
    window_ms: float = 5.0  # how long the first request of a batch waits for company
    max_texts: int = 64  # most texts in one request
    max_text_chars: int = 10000  # longest text (or question, or passage) accepted
    batch_size: int = INFERENCE_BATCH  # encoder batch size inside a model call
    max_body_bytes: int = 0  # 0: derived from max_texts and max_text_chars

    def body_limit(self) -> int:
        return self.max_body_bytes or 3 * 4 * self.max_texts * self.max_text_chars + 65536


# -- batching ------------------------------------------------------------------------------
@dataclass
class Job:
    key: tuple  # requests with the same key can run in one model call
    payload: dict
    size: int
    future: asyncio.Future


@dataclass
class Batcher:
    """Gathers concurrent requests and runs them together on one worker thread.

    `run(key, payloads)` returns one result list per payload. If a merged call fails, each
    request of it is retried alone, so one bad request cannot fail its neighbours.
    """

    run: Callable[[tuple, list[dict]], list[list]]
    max_batch: int = 64
    window_s: float = 0.005
    requests: int = 0
    batches: int = 0
    largest: int = 0
    _queue: asyncio.Queue | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _task: asyncio.Task | None = None
    _carry: Job | None = None
    _executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="bertheads-model"))

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._queue, self._loop, self._carry = asyncio.Queue(), loop, None
            self._task = loop.create_task(self._work())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def submit(self, key: tuple, payload: dict, size: int) -> list:
        self.start()
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(Job(key, payload, size, future))
        return await future

    async def _next(self, timeout: float | None) -> Job | None:
        if self._carry is not None:
            job, self._carry = self._carry, None
            return job
        if timeout is None:
            return await self._queue.get()
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            return None

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = await self._next(None)
            jobs, size = [first], first.size
            deadline = loop.time() + self.window_s
            while size < self.max_batch:
                job = await self._next(max(0.0, deadline - loop.time()))
                if job is None:
                    break
                if size + job.size > self.max_batch:
                    self._carry = job  # starts the next batch
                    break
                jobs.append(job)
                size += job.size
            groups: dict[tuple, list[Job]] = {}
            for job in jobs:
                groups.setdefault(job.key, []).append(job)
            for key, group in groups.items():
                await self._run_group(key, group)

    async def _run_group(self, key: tuple, jobs: list[Job]) -> None:
        loop = asyncio.get_running_loop()
        jobs = [j for j in jobs if not j.future.done()]  # clients that went away
        if not jobs:
            return
        self.requests += len(jobs)
        self.batches += 1
        self.largest = max(self.largest, sum(j.size for j in jobs))
        try:
            results = await loop.run_in_executor(self._executor, self.run, key, [j.payload for j in jobs])
        except Exception as exc:
            if len(jobs) == 1:
                if not jobs[0].future.done():
                    jobs[0].future.set_exception(exc)
                return
            for job in jobs:
                try:
                    result = (await loop.run_in_executor(self._executor, self.run, key, [job.payload]))[0]
                except Exception as single:
                    if not job.future.done():
                        job.future.set_exception(single)
                else:
                    if not job.future.done():
                        job.future.set_result(result)
            return
        for job, result in zip(jobs, results):
            if not job.future.done():
                job.future.set_result(result)


def run_batch(model, key: tuple, payloads: list[dict], batch_size: int = INFERENCE_BATCH) -> list[list]:
    """One model call for several requests of the same key; results split per request."""
    sizes = [p["size"] for p in payloads]
    if key[0] == "analyze":
        _, with_second, with_questions = key
        texts = [t for p in payloads for t in p["texts"]]
        second = [t for p in payloads for t in p["second_texts"]] if with_second else None
        questions = [q for p in payloads for q in p["questions"]] if with_questions else None
        results = model.analyze(texts, second, questions, batch_size=batch_size)
    else:
        _, head, form = key
        if form == "questions":
            inputs = [{"question": q, "context": c} for p in payloads for q, c in zip(p["questions"], p["contexts"])]
        else:
            inputs = [tuple(x) if form == "pairs" else x for p in payloads for x in p[form]]
        results = model.predict(inputs, head=head, batch_size=batch_size)
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


# -- request bodies --------------------------------------------------------------------
class AnalyzeRequest(BaseModel):
    """Texts to run through every single-text head (pair heads and qa heads when their second input is given)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={
        "examples": [{"texts": ["Angela Merkel visited Paris last week.", "A warm, funny film."]}]})
    texts: list[str] = Field(description="the texts (for qa heads: the passages)")
    second_texts: list[str] | None = Field(None, description="one second text per text, for pair heads")
    questions: list[str] | None = Field(None, description="one question per text, for qa heads")


class PredictRequest(BaseModel):
    """Inputs for one head: `texts`, `pairs`, or `questions` with `contexts` (qa)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"texts": ["A warm, funny film."]}]})
    texts: list[str] | None = None
    pairs: list[tuple[str, str]] | None = None
    questions: list[str] | None = None
    contexts: list[str] | None = None


class Results(BaseModel):
    results: list[Any]


class Problem(BaseModel):
    detail: str


ERRORS = {400: {"model": Problem}, 404: {"model": Problem}, 413: {"model": Problem}, 422: {"model": Problem}}


# -- the app -----------------------------------------------------------------------------
def describe_heads(model) -> list[dict]:
    out = []
    for name, task in model.net.tasks.items():
        spec = task.spec
        entry = {"name": name, "kind": task.kind, "inputs": head_input(task)}
        if task.kind == "classify":
            entry["labels"] = plain(list(spec.labels))
            entry["problem"] = spec.problem
        elif task.kind == "tag":
            entry["labels"] = list(spec.tags)
            entry["entity_types"] = sorted({t.split("-", 1)[1] for t in spec.tags if "-" in t})
        out.append(entry)
    return out


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
            if not text.strip():
                raise HTTPException(422, f"{at}: empty {kind}")
            if len(text) > settings.max_text_chars:
                raise HTTPException(413, f"{at}: {len(text)} characters; at most {settings.max_text_chars} "
                                         f"(--max-text-chars)")


def same_length(name: str, values: list | None, texts: list, texts_name: str) -> None:
    if values is not None and len(values) != len(texts):
        raise HTTPException(422, f"{name}: {len(values)} items, expected one per {texts_name} ({len(texts)})")


def create_app(model, settings: ServeSettings | None = None) -> FastAPI:
    """The FastAPI app serving `model` (a `bertheads.Model`)."""
    settings = settings or ServeSettings()
    batcher = Batcher(lambda key, payloads: run_batch(model, key, payloads, settings.batch_size),
                      settings.max_batch, settings.window_ms / 1000.0)
    heads = describe_heads(model)
    forms = {h["name"]: h["inputs"] for h in heads}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="bertheads", version="0.1.0", lifespan=lifespan,
                  description="One BERT encoder, many task heads. `POST /analyze` runs every single-text head "
                              "in one encoder pass; `POST /predict/{head}` runs one head.")
    app.state.model, app.state.batcher, app.state.settings = model, batcher, settings

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return JSONResponse({"detail": validation_message(exc)}, status_code=422)

    @app.exception_handler(UserError)
    async def user_error(request: Request, exc: UserError):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return JSONResponse({"detail": "malformed Content-Length header"}, status_code=400)
            if int(length) > settings.body_limit():
                return JSONResponse({"detail": f"request body of {length} bytes; at most {settings.body_limit()}"},
                                    status_code=413)
        return await call_next(request)

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(resources.files("bertheads").joinpath("page.html").read_text(encoding="utf-8"))

    @app.get("/health", summary="liveness and batching counters")
    async def health() -> dict:
        return {"status": "ok", "heads": len(heads), "requests": batcher.requests, "batches": batcher.batches,
                "largest_batch": batcher.largest}

    @app.get("/heads", summary="the model's heads: names, kinds, inputs, labels")
    async def list_heads() -> dict:
        return {"heads": heads, "limits": {"max_texts": settings.max_texts,
                                           "max_text_chars": settings.max_text_chars}}

    @app.post("/analyze", response_model=Results, responses=ERRORS,
              summary="every single-text head on each text, one encoder pass")
    async def analyze(body: AnalyzeRequest) -> dict:
        check_texts("texts", body.texts, settings)
        payload = {"texts": body.texts, "size": len(body.texts)}
        for name, values in (("second_texts", body.second_texts), ("questions", body.questions)):
            if values is not None:
                same_length(name, values, body.texts, "text")
                check_texts(name, values, settings, "question" if name == "questions" else "text")
                payload[name] = values
        key = ("analyze", body.second_texts is not None, body.questions is not None)
        return {"results": await batcher.submit(key, payload, len(body.texts))}

    @app.post("/predict/{head}", response_model=Results, responses=ERRORS,
              summary="one head's predictions, in the shapes `bertheads predict` writes")
    async def predict(head: str, body: PredictRequest) -> dict:
        if head not in forms:
            raise HTTPException(404, f"no head named {head!r} (heads: {', '.join(forms)})")
        form = {"text": "texts", "pair": "pairs", "question": "questions"}[forms[head]]
        given = [n for n in ("texts", "pairs", "questions", "contexts") if getattr(body, n) is not None]
        wanted = {"texts": '{"texts": ["..."]}', "pairs": '{"pairs": [["first", "second"]]}',
                  "questions": '{"questions": ["..."], "contexts": ["..."]}'}[form]
        expected = ["questions", "contexts"] if form == "questions" else [form]
        if sorted(given) != sorted(expected):
            missing = [n for n in expected if n not in given]
            extra = [n for n in given if n not in expected]
            reason = f"missing field {missing[0]!r}" if missing else f"unexpected field {extra[0]!r}"
            raise HTTPException(422, f"{reason}: head {head!r} ({model.heads[head]}) reads {wanted}")
        values = getattr(body, form)
        check_texts(form, values, settings, "question" if form == "questions" else "text")
        payload = {form: values, "size": len(values)}
        if form == "questions":
            same_length("contexts", body.contexts, values, "question")
            check_texts("contexts", body.contexts, settings, "passage")
            payload["contexts"] = body.contexts
        return {"results": await batcher.submit(("predict", head, form), payload, len(values))}

    return app


# -- running ------------------------------------------------------------------------------
def serve(directory: str, host: str = "127.0.0.1", port: int = 8000, settings: ServeSettings | None = None,
          runtime: str = "torch", precision: str = "fp32") -> None:
    """Load the model in `directory` (with `runtime` and `precision`) and serve it until interrupted."""
    import uvicorn

    from bertheads.api import load

    model = load(directory, runtime=runtime, precision=precision)
    check_port(host, port)
    app = create_app(model, settings)
    print(f"serving {directory} (heads: {', '.join(model.heads)}) on http://{host}:{port}  "
          f"(page at /, API docs at /docs)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def check_port(host: str, port: int) -> None:
    """A clear error when the address cannot be served on (in use, not ours, bad port)."""
    import socket

    if not 0 <= port <= 65535:
        raise UserError(f"--port: expected 0..65535, got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: {exc.strerror}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise UserError(f"cannot serve on {host}:{port}: {exc.strerror}; choose another --port or --host") from None


@contextmanager
def running_server(app: FastAPI, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0) -> Iterator[str]:
    """Serve `app` with uvicorn in a background thread; yields its base URL and stops it after."""
    import socket

    import uvicorn

    if port == 0:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on"))
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
