"""Load and fault tests of `bertheads serve` on 127.0.0.1 (bounded in requests and time).

```bash
.venv/bin/python bench/serve_load.py            # trains bench/out/serve-sentiment once, then runs the tests
.venv/bin/python bench/serve_load.py --parts load,kill,drain,verify
```

- load: `--requests` (2,000) from `--clients` (32) concurrent clients, mixed sizes, a share
  `--malformed` (5%) of malformed or hostile requests; a one-word probe every second during
  the flood. Passes when no answer is a 5xx other than 503, every malformed request gets a 4xx,
  every probe is answered within the server's `--timeout` (or refused with 503 at once), and
  the server's peak RSS stays under `--rss-bound-mb`.
- kill: SIGKILL the server in the middle of a load, start it again, time until it serves.
- drain: SIGTERM with requests in flight: each is answered, new connections are refused.
- verify: what checking the encoder hash costs when loading the model (`--no-verify` against the default).
- slow: `--slow-clients` (140) connections from another address (`--slow-source`, 127.0.0.2) sending request
  headers a byte every 65 ms, reconnecting when closed, for `--slow-seconds` (20), while a
  real client (127.0.0.1) sends `--slow-probes` (40) one-text requests spread over that time,
  each on a new connection. Passes when every real request is answered 200; `--baseline-src`
  runs the same against another checkout's server.

The model is the default checkpoint (MiniLM-L6) with a sentiment head fine-tuned for one epoch
on examples/sentiment (100 sentences): cheap to train, real-sized to serve.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT, environment, median, save_json  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
TOKEN = "bench-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
HEAD = "classify"  # the head `bertheads train classify` names
WORDS = ("the film is a warm funny and wonderfully acted story about a family in Paris whose plot never quite "
         "holds together but the cast makes every scene worth watching even when the script is dull and slow").split()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def train_model(out: Path) -> Path:
    if (out / "bertheads.json").is_file():
        return out
    subprocess.run([PY, "-m", "bertheads", "train", "classify", "--train", str(ROOT / "examples/sentiment/train.tsv"),
                    "--dev", str(ROOT / "examples/sentiment/dev.tsv"), "--out", str(out), "--epochs", "1",
                    "--no-progress"], check=True)
    return out


class Server:
    """`bertheads serve` in a subprocess on a loopback port, with its RSS sampled."""

    def __init__(self, model: Path, port: int, extra: list[str], src: str | None = None) -> None:
        self.model, self.port, self.extra, self.src = model, port, extra, src
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.peak_rss = 0
        self._sampling = False

    def start(self, wait: float = 120.0) -> float:
        """Start and wait until /health answers; returns the seconds that took."""
        started = time.monotonic()
        env = dict(os.environ)
        if self.src:  # the baseline: another checkout's code, without the flags it lacks
            env["PYTHONPATH"] = self.src
        flags = [] if self.src else ["--token", TOKEN, *self.extra]
        self.proc = subprocess.Popen([PY, "-m", "bertheads", "serve", str(self.model), "--port", str(self.port),
                                      *flags], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.proc.stdout.read()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() - started > wait:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        self._sampling = True
        threading.Thread(target=self._sample, daemon=True).start()
        return time.monotonic() - started

    def _sample(self) -> None:
        import psutil

        try:
            proc = psutil.Process(self.proc.pid)
            while self._sampling and self.proc.poll() is None:
                self.peak_rss = max(self.peak_rss, proc.memory_info().rss)
                time.sleep(0.1)
        except psutil.NoSuchProcess:
            pass

    def stop(self, sig=signal.SIGTERM) -> None:
        self._sampling = False
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# -- the requests -------------------------------------------------------------------------------
def text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def valid_request(rng: random.Random) -> dict:
    roll = rng.random()
    if roll < 0.75:  # one short text
        texts = [text(rng, rng.randint(1, 20))]
    elif roll < 0.96:  # a few medium texts
        texts = [text(rng, rng.randint(20, 80)) for _ in range(rng.randint(2, 8))]
    else:  # many long texts (truncated to 128 tokens by the classify head)
        texts = [text(rng, rng.randint(100, 300)) for _ in range(rng.randint(16, 64))]
    path = "/analyze" if rng.random() < 0.5 else f"/predict/{HEAD}"
    return {"kind": "valid", "path": path, "json": {"texts": texts}, "texts": len(texts)}


def big_chunks(size: int):
    yield b'{"texts": ["'
    block = b"x" * 65536
    for _ in range(size // len(block) + 1):
        yield block
    yield b'"]}'


MALFORMED = {
    "bad-json": lambda rng: {"content": b'{"texts": ["a"'},
    "missing-field": lambda rng: {"json": {"text": ["a"]}},
    "empty-list": lambda rng: {"json": {"texts": []}},
    "lone-surrogate": lambda rng: {"content": b'{"texts": ["bad \\ud800 text"]}'},
    "unknown-head": lambda rng: {"json": {"texts": ["a"]}, "path": "/predict/nope"},
    "too-many-texts": lambda rng: {"json": {"texts": ["a"] * 65}},
    "too-long-text": lambda rng: {"json": {"texts": ["x" * 10001]}},
    "chunked-9MB": lambda rng: {"stream": 9 * 1024 * 1024},
    "foreign-host": lambda rng: {"json": {"texts": ["a"]}, "headers": {"host": "evil.example"}},
    "no-token": lambda rng: {"json": {"texts": ["a"]}, "headers": {"authorization": ""}},
    "deep-json": lambda rng: {"content": b'{"texts": ' + b"[" * 20000},
}


def malformed_request(rng: random.Random) -> dict:
    kind = rng.choice(sorted(MALFORMED))
    req = {"kind": kind, "path": "/analyze", "texts": 0, **MALFORMED[kind](rng)}
    return req


async def send(client: httpx.AsyncClient, req: dict) -> dict:
    headers = {**AUTH, "content-type": "application/json", **req.get("headers", {})}
    headers = {k: v for k, v in headers.items() if v}
    start = time.perf_counter()
    try:
        if "stream" in req:
            response = await client.post(req["path"], content=async_iter(big_chunks(req["stream"])), headers=headers)
        elif "content" in req:
            response = await client.post(req["path"], content=req["content"], headers=headers)
        else:
            response = await client.post(req["path"], json=req["json"], headers=headers)
        status = response.status_code
        retry_after = response.headers.get("retry-after")
    except httpx.HTTPError as exc:
        status, retry_after = f"error:{type(exc).__name__}", None
    return {"kind": req["kind"], "status": status, "seconds": time.perf_counter() - start, "texts": req["texts"],
            "retry_after": retry_after}


async def async_iter(chunks):
    for chunk in chunks:
        yield chunk


async def flood(url: str, requests: list[dict], clients: int, max_seconds: float, probe_every: float,
                stop_after=None) -> tuple[list[dict], list[dict], float]:
    """Send `requests` from `clients` workers; probes run alongside. Returns (results, probes, seconds)."""
    queue = list(reversed(requests))
    results, probes = [], []
    started = time.perf_counter()
    done = asyncio.Event()
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def worker():
            while queue and time.perf_counter() - started < max_seconds:
                results.append(await send(client, queue.pop()))
                if stop_after is not None and len(results) >= stop_after:
                    return

        async def prober():
            async with httpx.AsyncClient(base_url=url, timeout=120) as own:
                try:
                    await asyncio.wait_for(done.wait(), probe_every)
                except TimeoutError:
                    pass
                while not done.is_set():
                    probes.append(await send(own, {"kind": "probe", "path": "/analyze", "json": {"texts": ["Fine."]},
                                                   "texts": 1}))
                    try:
                        await asyncio.wait_for(done.wait(), probe_every)
                    except TimeoutError:
                        pass

        probe_task = asyncio.create_task(prober())
        await asyncio.gather(*(worker() for _ in range(clients)))
        done.set()
        await probe_task
    return results, probes, time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def summarize(results: list[dict], probes: list[dict], seconds: float, timeout: float) -> dict:
    by_status: dict[str, int] = {}
    for r in results:
        by_status[str(r["status"])] = by_status.get(str(r["status"]), 0) + 1
    ok = [r for r in results if r["status"] == 200]
    malformed = [r for r in results if r["kind"] != "valid"]
    bad_5xx = [r for r in results if isinstance(r["status"], int) and r["status"] >= 500 and r["status"] != 503]
    errors = [r for r in results if not isinstance(r["status"], int)]
    malformed_not_4xx = [r for r in malformed if not (isinstance(r["status"], int) and 400 <= r["status"] < 500)]
    refused = [r for r in results if r["status"] == 503]
    probe_fail = [p for p in probes if not ((p["status"] == 200 and p["seconds"] <= timeout + 0.5)
                                            or p["status"] == 503)]
    malformed_kinds: dict[str, dict] = {}
    for r in malformed:
        malformed_kinds.setdefault(r["kind"], {})
        malformed_kinds[r["kind"]][str(r["status"])] = malformed_kinds[r["kind"]].get(str(r["status"]), 0) + 1
    return {
        "requests": len(results), "seconds": round(seconds, 2), "requests_per_s": round(len(results) / seconds, 2),
        "answered_200_per_s": round(len(ok) / seconds, 2), "texts_answered": sum(r["texts"] for r in ok),
        "by_status": by_status, "malformed": len(malformed), "malformed_by_kind": malformed_kinds,
        "latency_200_p50_ms": round(1000 * percentile([r["seconds"] for r in ok], 50), 1),
        "latency_200_p99_ms": round(1000 * percentile([r["seconds"] for r in ok], 99), 1),
        "latency_503_p50_ms": round(1000 * percentile([r["seconds"] for r in refused], 50), 1),
        "latency_503_p99_ms": round(1000 * percentile([r["seconds"] for r in refused], 99), 1),
        "refused_503_with_retry_after": sum(1 for r in refused if r["retry_after"]),
        "fivexx_other_than_503": len(bad_5xx), "transport_errors": len(errors),
        "malformed_not_4xx": len(malformed_not_4xx),
        "probes": [{"status": p["status"], "ms": round(1000 * p["seconds"], 1)} for p in probes],
        "probe_failures": len(probe_fail),
    }


def metrics_text(url: str) -> str:
    return httpx.get(f"{url}/metrics", headers=AUTH, timeout=10).text


# -- the parts ----------------------------------------------------------------------------------
def part_load(args, model: Path) -> dict:
    rng = random.Random(args.seed)
    requests = [malformed_request(rng) if rng.random() < args.malformed else valid_request(rng)
                for _ in range(args.requests)]
    server = Server(model, free_port(), ["--timeout", str(args.timeout)], args.baseline_src)
    startup = server.start()
    time.sleep(0.5)
    idle_rss = server.peak_rss
    try:
        results, probes, seconds = asyncio.run(flood(server.url, requests, args.clients, args.max_seconds, 1.0))
        try:
            metrics = metrics_text(server.url)
            health = httpx.get(f"{server.url}/health", timeout=10).json()
        except httpx.HTTPError as exc:  # the baseline can still be busy with abandoned work
            metrics, health = "", {"after_flood": f"no answer within 10 s ({type(exc).__name__})"}
    finally:
        time.sleep(0.3)
        peak = server.peak_rss
        server.stop()
    out = summarize(results, probes, seconds, args.timeout)
    out.update(startup_s=round(startup, 2), idle_rss_mb=round(idle_rss / 2**20), peak_rss_mb=round(peak / 2**20),
               rss_bound_mb=args.rss_bound_mb, health=health,
               metrics_sample=[line for line in metrics.splitlines()
                               if line.startswith(("bertheads_http_requests_total", "bertheads_refused",
                                                   "bertheads_batch_texts_count", "bertheads_batch_texts_sum",
                                                   "bertheads_batch_tokens_sum"))])
    out["passed"] = (out["fivexx_other_than_503"] == 0 and out["malformed_not_4xx"] == 0 and out["probe_failures"] == 0
                     and out["transport_errors"] == 0 and out["peak_rss_mb"] < args.rss_bound_mb
                     and out["requests"] == args.requests)
    return out


def part_kill(args, model: Path) -> dict:
    """SIGKILL during a load, restart on the same port, time until /health and /analyze answer."""
    rng = random.Random(args.seed + 1)
    port = free_port()
    server = Server(model, port, ["--timeout", str(args.timeout)])
    server.start()
    requests = [valid_request(rng) for _ in range(400)]
    box: dict = {}
    loader = threading.Thread(target=lambda: box.update(r=asyncio.run(
        flood(server.url, requests, args.clients, 60, 1000.0))))
    loader.start()
    time.sleep(3.0)
    killed = time.monotonic()
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    loader.join(120)
    results = box["r"][0]
    restart = Server(model, port, ["--timeout", str(args.timeout)])
    health_s = restart.start()
    first = time.monotonic()
    analyze = httpx.post(f"{restart.url}/analyze", json={"texts": ["Back again."]}, headers=AUTH, timeout=60)
    analyze_s = time.monotonic() - first + health_s
    restart.stop()
    statuses: dict[str, int] = {}
    for r in results:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    return {"requests_before_kill": len(results), "statuses_during_kill": statuses,
            "restart_to_health_s": round(health_s, 2), "restart_to_first_answer_s": round(analyze_s, 2),
            "first_answer_status": analyze.status_code, "kill_to_answer_s": round(time.monotonic() - killed, 2),
            "passed": analyze.status_code == 200}


def part_drain(args, model: Path) -> dict:
    """SIGTERM while requests are in flight: each in-flight request is answered; new ones refused."""
    server = Server(model, free_port(), ["--timeout", str(args.timeout), "--batch-window-ms", "300"])
    server.start()
    rng = random.Random(args.seed + 2)
    in_flight = [valid_request(rng) for _ in range(args.clients)]
    for req in in_flight:
        req["json"]["texts"] = req["json"]["texts"][:8]
        req["texts"] = len(req["json"]["texts"])

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
            tasks = [asyncio.create_task(send(client, r)) for r in in_flight]
            await asyncio.sleep(0.15)
            signalled = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.2)
            async with httpx.AsyncClient(base_url=server.url, timeout=10) as fresh:
                late = await send(fresh, {"kind": "late", "path": "/analyze", "json": {"texts": ["late"]}, "texts": 1})
            answers = await asyncio.gather(*tasks)
            return answers, late, signalled

    answers, late, signalled = asyncio.run(scenario())
    server.proc.wait(60)
    exit_s = time.monotonic() - signalled
    statuses: dict[str, int] = {}
    for r in answers:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    return {"in_flight": len(answers), "in_flight_statuses": statuses, "late_request": late["status"],
            "exit_after_sigterm_s": round(exit_s, 2), "exit_code": server.proc.returncode,
            "passed": statuses.get("200", 0) == len(answers) and late["status"] != 200}


def part_verify(args, model: Path) -> dict:
    """Seconds to load the model with and without the encoder hash check, rounds alternating."""
    code = ("import sys, time; from bertheads.api import load; from bertheads.saved.bundle import encoder_hash; "
            "t = time.perf_counter(); m = load(sys.argv[1], verify=sys.argv[2] == '1'); "
            "load_s = time.perf_counter() - t; t = time.perf_counter(); encoder_hash(m.net.encoder); "
            "print(load_s, time.perf_counter() - t)")
    rows = {"verify": [], "no_verify": [], "hash_alone": []}
    for _ in range(args.rounds):
        for side, flag in (("verify", "1"), ("no_verify", "0")):
            out = subprocess.run([PY, "-c", code, str(model), flag], capture_output=True, text=True, check=True)
            load_s, hash_s = map(float, out.stdout.split())
            rows[side].append(load_s)
            rows["hash_alone"].append(hash_s)
    v, n, h = median(rows["verify"]), median(rows["no_verify"]), median(rows["hash_alone"])
    return {"rounds": args.rounds, "load_verify_s": round(v, 3), "load_no_verify_s": round(n, 3),
            "hash_s": round(h, 3), "ratio": round(v / n, 3), "raw": rows}


async def slow_header_client(host: str, port: int, source: str, until: float, counts: dict) -> None:
    """Open a connection, send a request's headers a byte every 65 ms, and open another when the
    server closes it, until `until` (the loop's clock)."""
    loop = asyncio.get_running_loop()
    request = b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Padding: " + b"a" * 4000 + b"\r\n\r\n"
    while loop.time() < until:
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
        except OSError:
            counts["connect_failed"] += 1
            await asyncio.sleep(0.065)
            continue
        counts["opened"] += 1
        answer = asyncio.ensure_future(reader.read(64))
        try:
            for byte in request:
                if loop.time() >= until or answer.done():
                    break
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.065)
            if loop.time() < until:
                head = await asyncio.wait_for(answer, max(0.01, until - loop.time()))
                status = head[9:12].decode(errors="replace") if head.startswith(b"HTTP/1.1") else "closed"
                counts[status] = counts.get(status, 0) + 1
        except (OSError, TimeoutError):
            counts["closed"] = counts.get("closed", 0) + 1
        finally:
            answer.cancel()
            writer.close()
        await asyncio.sleep(0.065)


async def slow_scenario(url: str, clients: int, seconds: float, probes: int,
                        source: str = "127.0.0.2") -> tuple[dict, list[dict]]:
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1])
    loop = asyncio.get_running_loop()
    until = loop.time() + seconds
    counts = {"opened": 0, "connect_failed": 0}
    attackers = [asyncio.create_task(slow_header_client(host, port, source, until, counts))
                 for _ in range(clients)]
    await asyncio.sleep(2.0)  # the slow connections are open before the first real request
    answers = []
    for _ in range(probes):
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:  # a new connection each time
            answers.append(await send(client, {"kind": "real", "path": "/analyze", "json": {"texts": ["Fine."]},
                                               "texts": 1}))
        await asyncio.sleep(max(0.0, (seconds - 2.0) / probes - answers[-1]["seconds"]))
    await asyncio.gather(*attackers)
    return counts, answers


def part_slow(args, model: Path) -> dict:
    """Slow-header clients from one address against real requests from another."""
    server = Server(model, free_port(), ["--timeout", str(args.timeout)], args.baseline_src)
    server.start()
    try:
        counts, answers = asyncio.run(slow_scenario(server.url, args.slow_clients, args.slow_seconds,
                                                    args.slow_probes, args.slow_source))
        try:
            metrics = metrics_text(server.url)
        except httpx.HTTPError:
            metrics = ""
    finally:
        server.stop()
    statuses: dict[str, int] = {}
    for r in answers:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    ok = [r["seconds"] for r in answers if r["status"] == 200]
    return {"slow_clients": args.slow_clients, "slow_source": args.slow_source, "seconds": args.slow_seconds,
            "slow_connections": counts,
            "real_requests": len(answers), "real_statuses": statuses, "real_in_order": [r["status"] for r in answers],
            "real_200_p50_ms": round(1000 * percentile(ok, 50), 1), "real_200_p99_ms": round(1000 * percentile(ok, 99), 1),
            "refused_metrics": [line for line in metrics.splitlines()
                                if line.startswith(("bertheads_refused_requests_total", "bertheads_http_connections "))],
            "passed": statuses.get("200", 0) == len(answers)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="load,kill,drain,verify,slow")
    parser.add_argument("--model-dir", default=str(OUT / "serve-sentiment"))
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--malformed", type=float, default=0.05)
    parser.add_argument("--timeout", type=float, default=10.0, help="the server's --timeout")
    parser.add_argument("--max-seconds", type=float, default=900.0, help="stop sending after this long")
    parser.add_argument("--rss-bound-mb", type=int, default=1536)
    parser.add_argument("--rounds", type=int, default=5, help="verify: load rounds per side")
    parser.add_argument("--slow-clients", type=int, default=140, help="slow: slow-header connections at a time")
    parser.add_argument("--slow-seconds", type=float, default=20.0, help="slow: how long they keep at it")
    parser.add_argument("--slow-probes", type=int, default=40, help="slow: real requests meanwhile")
    parser.add_argument("--slow-source", default="127.0.0.2", help="slow: the slow clients' address (127.0.0.1: "
                                                                     "the real client's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="serve_load")
    parser.add_argument("--baseline-src", help="load and slow parts only: serve with this src/ (e.g. an older "
                                               "checkout) instead")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    model = train_model(Path(args.model_dir))
    result = {"environment": environment(), "loadavg_start": open("/proc/loadavg").read().split()[:3],
              "args": vars(args)}
    parts = {"load": part_load, "kill": part_kill, "drain": part_drain, "verify": part_verify, "slow": part_slow}
    for name in args.parts.split(","):
        result[name] = parts[name](args, model)
        shown = {k: v for k, v in result[name].items() if k not in ("probes", "raw", "metrics_sample")}
        print(name, json.dumps(shown), flush=True)
    result["loadavg_end"] = open("/proc/loadavg").read().split()[:3]
    print("saved", save_json(args.name, result))


if __name__ == "__main__":
    main()
