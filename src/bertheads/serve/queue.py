"""The server's work queue: requests gathered into model calls under a token budget, with a
bounded queue, per-request deadlines, and the work of clients that went away dropped.

A request's cost is the number of tokens the encoder will run for it (every window of a long
text for tag and qa heads, the truncated text for classify heads), estimated with the
model's tokenizer before it is queued.

Requests are served by cost, not by arrival alone: each waits in order of when it would be done
if the model were shared fairly among the requests waiting when it came, counted in encoder
tokens (`tokens started so far + tokens x (waiting + 1)`: the finish time of processor sharing,
on the virtual clock of self-clocked fair queueing), so a one-word request goes into the next
model call instead of behind every long one queued before it, and a long one keeps its place
against the requests that come after that point (no starvation). A request is admitted only
when the work queued ahead of it in that order can be done within its deadline: under a flood
the long requests are refused at once (503, Retry-After) while short ones still get in.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

SAFETY = 1.5  # a request starts only if 1.5x its estimated model time fits before its deadline
RATE_MIN_TOKENS = 512  # model calls of fewer tokens do not set the measured rate (see Batcher.measure)


class Overloaded(Exception):
    """The request cannot be served in time (queue full, or not started by its deadline): 503."""

    def __init__(self, message: str, retry_after: float = 1.0, reason: str = "busy") -> None:
        super().__init__(message)
        self.retry_after = max(1, math.ceil(retry_after))
        self.reason = reason


class DeadlineExceeded(Exception):
    """The request's model call started but did not finish by its deadline: 504."""


@dataclass
class Job:
    key: tuple  # requests with the same key can run in one model call
    payload: dict
    size: int  # texts
    tokens: int  # estimated encoder tokens
    future: asyncio.Future
    deadline: float | None = None  # loop time by which the answer is due
    state: str = "queued"  # queued -> running -> done; or dropped
    order: int = 0  # when it would be done with the model shared fairly, in tokens (the queue's order)


@dataclass
class Batcher:
    """Gathers concurrent requests and runs them together on one worker thread.

    `run(key, payloads)` returns one result list per payload. A model call takes queued
    requests in the queue's order (`Job.order`, the fair-share finish time: equal requests go
    in arrival order, short ones pass long ones) up to `max_batch` texts and `max_tokens`
    tokens (a request larger than that runs alone). If a merged call fails, each request of it is retried
    alone, so one bad request cannot fail its neighbours.

    `submit` refuses at once (`Overloaded`) when `max_queue` requests are waiting or when the
    work queued ahead of it, at the measured rate, would not let it start within its `timeout`; a
    request still queued at its deadline is dropped (`Overloaded`), one whose model call
    outlives it gets `DeadlineExceeded`; cancelling `submit` (the client went away) drops
    the request if it has not started.
    """

    run: Callable[[tuple, list[dict]], list[list]]
    max_batch: int = 64
    window_s: float = 0.005
    max_tokens: int = 4096
    max_queue: int = 64
    observe: Callable[[int, int, float], None] | None = None  # (texts, tokens, seconds) per model call
    requests: int = 0
    batches: int = 0
    largest: int = 0
    largest_tokens: int = 0
    dropped: int = 0  # queued requests whose client went away
    expired: int = 0  # queued requests whose deadline passed
    rate: float | None = None  # tokens per second of recent model calls
    running_tokens: int = 0
    started_tokens: int = 0  # tokens of every model call started: the queue's clock
    _pending: list = field(default_factory=list)  # queued jobs, kept sorted by `Job.order`
    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _task: asyncio.Task | None = None
    _executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="bertheads-model"))

    # -- state ------------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return len(self._pending)

    @property
    def queued_tokens(self) -> int:
        return sum(job.tokens for job in self._pending)

    def expected_wait(self, tokens: int = 0) -> float:
        """Seconds until a request of `tokens` queued now behind everything would be done (0
        before any measurement)."""
        if not self.rate:
            return 0.0
        return (self.queued_tokens + self.running_tokens + tokens) / self.rate

    def wait_ahead(self, order: int) -> float:
        """Seconds until a request placed at `order` in the queue could start (0 before any
        measurement): the running call and the queued work that goes before it."""
        if not self.rate:
            return 0.0
        ahead = sum(job.tokens for job in self._pending if job.order <= order)
        return (ahead + self.running_tokens) / self.rate

    # -- lifecycle ----------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the worker that runs the batches is running (between `start` and `stop`)."""
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done() or self._loop is not loop:
            self._pending, self._wake, self._loop = [], asyncio.Event(), loop
            self._task = loop.create_task(self._work())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        for job in self._pending:
            if not job.future.done():
                job.future.set_exception(Overloaded("the server is shutting down", reason="shutdown"))
        self._pending.clear()

    # -- submitting ------------------------------------------------------------------------
    async def submit(self, key: tuple, payload: dict, size: int, tokens: int | None = None,
                     timeout: float | None = None) -> list:
        self.start()
        tokens = size if tokens is None else tokens
        if len(self._pending) >= self.max_queue:
            raise Overloaded(f"server busy: {len(self._pending)} requests waiting (--max-queue); retry later",
                             self.expected_wait(), "queue_full")
        loop = asyncio.get_running_loop()
        order = self.started_tokens + tokens * (len(self._pending) + 1)
        wait = self.wait_ahead(order)  # until this request could start
        if timeout is not None and wait > timeout:
            raise Overloaded(f"server busy: about {wait:.1f} s of queued work, more than the {timeout:g} s "
                             f"deadline (--timeout); retry later", wait - timeout, "busy")
        job = Job(key, payload, size, tokens, loop.create_future(), None if timeout is None else loop.time() + timeout,
                  order=order)
        bisect.insort(self._pending, job, key=lambda j: j.order)
        self._wake.set()
        try:
            if timeout is None:
                return await asyncio.shield(job.future)
            return await asyncio.wait_for(asyncio.shield(job.future), timeout)
        except TimeoutError:
            if job.state == "queued":
                self._drop(job)
                self.expired += 1
                raise Overloaded(f"server busy: the request did not start within the {timeout:g} s deadline "
                                 f"(--timeout); retry later", self.expected_wait(), "deadline") from None
            job.state = "abandoned"
            raise DeadlineExceeded(f"the request did not finish within the {timeout:g} s deadline "
                                   f"(--timeout); send fewer or shorter texts") from None
        except asyncio.CancelledError:
            if job.state == "queued":
                self._drop(job)
                self.dropped += 1
            raise

    def _drop(self, job: Job) -> None:
        job.state = "dropped"
        try:
            self._pending.remove(job)
        except ValueError:
            pass
        if not job.future.done():
            job.future.cancel()

    # -- the worker --------------------------------------------------------------------------
    def _fits(self, texts: int, tokens: int, job: Job) -> bool:
        return texts + job.size <= self.max_batch and tokens + job.tokens <= self.max_tokens

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                self._wake.clear()
                await self._wake.wait()
            deadline = loop.time() + self.window_s
            while loop.time() < deadline and self._pending_fit():
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), max(0.0, deadline - loop.time()))
                except TimeoutError:
                    break
            jobs, texts, tokens = [], 0, 0
            while self._pending and (not jobs or self._fits(texts, tokens, self._pending[0])):
                job = self._pending.pop(0)
                if job.future.done():
                    continue
                if self._too_late(job, tokens, loop.time()):
                    self.expired += 1
                    finish(job, error=Overloaded("server busy: the request would not finish within its deadline "
                                                 "(--timeout); retry later", self.expected_wait(), "deadline"))
                    continue
                job.state = "running"
                self.started_tokens += job.tokens
                jobs.append(job)
                texts, tokens = texts + job.size, tokens + job.tokens
            if not jobs:
                continue
            groups: dict[tuple, list[Job]] = {}
            for job in jobs:
                groups.setdefault(job.key, []).append(job)
            self.running_tokens = tokens
            try:
                for key, group in groups.items():
                    await self._run_group(key, group)
                    self.running_tokens -= sum(job.tokens for job in group)
            finally:
                self.running_tokens = 0

    def measure(self, tokens: int, seconds: float) -> None:
        """Update the rate from one model call. A small call is mostly fixed overhead, so its rate
        understates what a large one runs at: it may raise the estimate, never set or lower it."""
        rate = tokens / seconds
        if tokens >= RATE_MIN_TOKENS:
            self.rate = rate if self.rate is None else 0.7 * self.rate + 0.3 * rate
        elif self.rate is not None:
            self.rate = max(self.rate, rate)

    def _too_late(self, job: Job, tokens_before: int, now: float) -> bool:
        """Whether the job, started now after `tokens_before` tokens, would miss its deadline
        (estimated at 1.5 times the measured rate, so that a started request finishes in time)."""
        if job.deadline is None or not self.rate:
            return False
        return now + SAFETY * (tokens_before + job.tokens) / self.rate > job.deadline

    def _pending_fit(self) -> bool:
        """Whether the queued requests still leave room in one model call."""
        texts = sum(job.size for job in self._pending)
        tokens = sum(job.tokens for job in self._pending)
        return texts < self.max_batch and tokens < self.max_tokens

    async def _run_group(self, key: tuple, jobs: list[Job]) -> None:
        loop = asyncio.get_running_loop()
        jobs = [j for j in jobs if not j.future.done()]
        if not jobs:
            return
        self.requests += len(jobs)
        self.batches += 1
        self.largest = max(self.largest, sum(j.size for j in jobs))
        texts, tokens = sum(j.size for j in jobs), sum(j.tokens for j in jobs)
        self.largest_tokens = max(self.largest_tokens, tokens)
        started = time.perf_counter()
        try:
            results = await loop.run_in_executor(self._executor, self.run, key, [j.payload for j in jobs])
            seconds = time.perf_counter() - started
            if seconds > 0:  # the rate of successful calls predicts waits and deadlines
                self.measure(tokens, seconds)
            if self.observe is not None:
                self.observe(texts, tokens, seconds)
        except Exception as exc:
            if len(jobs) == 1:
                finish(jobs[0], error=exc)
                return
            for job in jobs:
                try:
                    result = (await loop.run_in_executor(self._executor, self.run, key, [job.payload]))[0]
                except Exception as single:
                    finish(job, error=single)
                else:
                    finish(job, result)
            return
        for job, result in zip(jobs, results):
            finish(job, result)


def finish(job: Job, result=None, error: BaseException | None = None) -> None:
    job.state = "done"
    if job.future.done():
        return
    if error is not None:
        job.future.set_exception(error)
    else:
        job.future.set_result(result)


# -- what a request costs ---------------------------------------------------------------------
def token_counter(tokenizer) -> Callable[[list[str]], list[int]]:
    """Token counts (no special tokens) from a private copy of a fast tokenizer's backend, so that
    counting on request threads never shares state with the model's tokenizer."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()

    def lengths(values: list[str]) -> list[int]:
        return [len(e.ids) for e in backend.encode_batch(list(values), add_special_tokens=False)]

    return lengths


def request_tokens(net, inputs: dict[str, list], lengths: Callable[[list[str]], list[int]] | None = None) -> int:
    """Encoder tokens a request will run: `inputs` holds each head's inputs (one per request
    item, as `Model.predict` takes them); for each item, each distinct pass of those heads
    (`Task.encoder_cost` of the token counts of the input's texts, `form.texts`). Heads whose
    encoding of an item is the same (a text that fits whole) count once. `lengths` counts
    tokens (default: a `token_counter` of the model's tokenizer)."""
    lengths = lengths or token_counter(net.encoder.tokenizer)
    texts = {name: [net.tasks[name].reading.form.texts(x) for x in values] for name, values in inputs.items()}
    unique = list(dict.fromkeys(t for values in texts.values() for item in values for t in item))
    count = dict(zip(unique, lengths(unique))) if unique else {}
    passes: list[dict[tuple, int]] = [{} for _ in range(max((len(v) for v in texts.values()), default=0))]
    for name, values in texts.items():
        for i, item in enumerate(values):
            key, tokens = net.tasks[name].modeling.encoder_cost(tuple(count[t] for t in item))
            passes[i][key] = tokens
    return max(1, sum(sum(p.values()) for p in passes))
