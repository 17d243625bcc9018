"""A flood of long requests and one-word requests beside it, against `bertheads serve` on
127.0.0.1 (bounded: a fixed number of requests, each round ends by itself).

```bash
.venv/bin/python bench/serve_flood.py                      # this checkout
.venv/bin/python bench/serve_flood.py --src /tmp/old/src   # another checkout's code, same model
```
A round: `--floods` (24) clients each post `--flood-texts` (64) long texts to /analyze at once;
0.3 s later one-word requests to /predict/HEAD start, one every 0.2 s, until every flood is
answered. Reported per round: the one-word latencies (median, p99, how many were refused with
503), the floods' statuses and their throughput (texts answered per second, from the first post
to the last answer). The model is a classify head on the default checkpoint (one epoch on
examples/sentiment, trained once into bench/out/long-line/model).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LONG = ("the film is a warm funny and wonderfully acted story about a family in Paris whose plot never quite "
        "holds together but the cast makes every scene worth watching even when the script is dull and slow ") * 4


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def model_dir() -> Path:
    out = ROOT / "bench/out/long-line/model"
    if not (out / "bertheads.json").is_file():
        subprocess.run([sys.executable, "-m", "bertheads", "train", "classify", "--train",
                        str(ROOT / "examples/sentiment/train.tsv"), "--out", str(out), "--epochs", "1",
                        "--no-progress", "--overwrite"], check=True)
    return out


async def one_round(url: str, floods: int, flood_texts: int) -> dict:
    limits = httpx.Limits(max_connections=floods + 8)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        start = time.perf_counter()
        flood_tasks = [asyncio.ensure_future(client.post("/analyze", json={"texts": [LONG] * flood_texts}))
                       for _ in range(floods)]
        await asyncio.sleep(0.3)
        probes: list[tuple[int, float]] = []

        async def probe() -> None:
            sent = time.perf_counter()
            response = await client.post("/predict/classify", json={"texts": ["good"]})
            probes.append((response.status_code, time.perf_counter() - sent))
            if response.status_code != 200:
                refusals.append(response.text[:200])

        probe_tasks, refusals = [], []
        while not all(t.done() for t in flood_tasks):
            probe_tasks.append(asyncio.ensure_future(probe()))
            await asyncio.sleep(0.2)
        responses = await asyncio.gather(*flood_tasks)
        flood_end = time.perf_counter()
        await asyncio.gather(*probe_tasks)
    answered = sorted(s for code, s in probes if code == 200)
    ok = [r for r in responses if r.status_code == 200]
    return {"probes": len(probes), "probe_p50": statistics.median(answered) if answered else None,
            "probe_p99": answered[min(len(answered) - 1, int(0.99 * len(answered)))] if answered else None,
            "probe_refused": sum(code == 503 for code, _ in probes),
            "flood_ok": len(ok), "flood_503": sum(r.status_code == 503 for r in responses),
            "flood_texts_per_s": len(ok) * flood_texts / (flood_end - start),
            "probe_refusal": refusals[0] if refusals else None,
            "refusal": next((r.json().get("detail") for r in responses if r.status_code == 503), None)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=str(ROOT / "src"), help="the checkout whose code serves")
    ap.add_argument("--floods", type=int, default=24)
    ap.add_argument("--flood-texts", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    model, port = model_dir(), free_port()
    env = {**os.environ, "PYTHONPATH": args.src, "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen([sys.executable, "-m", "bertheads", "serve", str(model), "--port", str(port), "-q"],
                              env=env, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        print(f"<!-- {cpu_line()}; code: {args.src} -->")
        print("| round | one-word p50 s | p99 s | refused | floods ok / 503 | flood texts/s |\n|---|---|---|---|---|---|")
        for i in range(args.rounds):
            r = asyncio.run(one_round(url, args.floods, args.flood_texts))
            p50 = f"{r['probe_p50']:.2f}" if r["probe_p50"] is not None else "-"
            p99 = f"{r['probe_p99']:.2f}" if r["probe_p99"] is not None else "-"
            print(f"| {i + 1} | {p50} | {p99} | {r['probe_refused']}/{r['probes']} | {r['flood_ok']} / "
                  f"{r['flood_503']} | {r['flood_texts_per_s']:.0f} |", flush=True)
            if r["probe_refusal"]:
                print(f"<!-- a one-word request refused: {r['probe_refusal']} -->")
            if r["refusal"]:
                print(f"<!-- a flood refused: {r['refusal']} -->")
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
