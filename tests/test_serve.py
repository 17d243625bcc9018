"""`bertheads serve`: the HTTP API (every 4xx case), request batching, and the web page in Chromium."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers_multi import EncoderCalls, save_heads
from helpers_serve import running_server

import bertheads
from bertheads.serve.app import Batcher, ServeSettings, create_app

TEXTS = ["Angela Merkel visited Paris last week.", "A warm, funny and wonderfully acted film."]
PASSAGE = "The Eiffel Tower was finished in 1889 and stands in Paris."


@pytest.fixture(scope="module")
def model_dir(tiny_bert, tmp_path_factory):
    heads = {"sentiment": ("classify", 1, {"labels": ["negative", "positive"]}),
             "topic": ("classify", 2, {"labels": ["food", "politics", "sports"]}),
             "nli": ("classify", 3, {"labels": ["contradiction", "entailment"], "pair": True}),
             "qa": ("qa", 4, {"max_length": 64, "stride": 16}),
             "ner": ("tag", 5, {"tags": ["O", "B-LOC", "B-PER", "I-LOC", "I-PER"]})}
    return save_heads(tiny_bert, tmp_path_factory.mktemp("serve") / "model", heads)


@pytest.fixture(scope="module")
def model(model_dir):
    return bertheads.load(model_dir)


SETTINGS = ServeSettings(max_texts=8, max_text_chars=500, window_ms=2)


@pytest.fixture(scope="module")
def client(model):
    with TestClient(create_app(model, SETTINGS), base_url="http://localhost") as c:
        yield c


def test_health_heads_docs_and_page(client):
    assert client.get("/health").json()["status"] == "ok"
    heads = {h["name"]: h for h in client.get("/heads").json()["heads"]}
    assert heads["sentiment"] == {"name": "sentiment", "kind": "classify", "inputs": "text",
                                  "labels": ["negative", "positive"], "problem": "single_label", "shows": "scores"}
    assert heads["nli"]["inputs"] == "pair" and heads["qa"]["inputs"] == "question"
    assert heads["ner"]["shows"] == "entities" and heads["qa"]["shows"] == "answer"  # how the page draws them
    assert heads["ner"]["inputs"] == "text" and heads["ner"]["entity_types"] == ["LOC", "PER"]
    schema = client.get("/openapi.json").json()
    assert {"/analyze", "/predict/{head}", "/heads", "/health"} <= set(schema["paths"])
    assert client.get("/docs").status_code == 200
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'id="analyze"' in page.text and "/analyze" in page.text


@pytest.mark.parametrize("accept, encoded", [("identity", False), ("gzip;q=0, identity", False), (None, False),
                                             ("gzip, deflate", True), ("*", True), ("br;q=1.0, gzip;q=0.5", True)])
def test_static_files_are_gzip_only_for_a_client_that_takes_it(client, accept, encoded):
    """`Accept-Encoding: identity` gets the file as it is (it got gzip)."""
    headers = {"Accept-Encoding": accept} if accept else {}
    with client.stream("GET", "/static/swagger-ui.css", headers=headers) as answer:
        raw = b"".join(answer.iter_raw())
        if accept is None:  # httpx adds its own Accept-Encoding; the header left out entirely
            request = client.build_request("GET", "/static/swagger-ui.css")
            del request.headers["accept-encoding"]
            answer = client.send(request, stream=True)
            raw = b"".join(answer.iter_raw())
    assert answer.status_code == 200 and answer.headers.get("vary") == "Accept-Encoding"
    assert (answer.headers.get("content-encoding") == "gzip") is encoded
    assert raw.startswith(b"\x1f\x8b") is encoded


def test_analyze_matches_the_python_api(client, model):
    body = client.post("/analyze", json={"texts": TEXTS}).json()
    assert body["results"] == model.analyze(TEXTS)
    assert set(body["results"][0]) == {"sentiment", "topic", "ner"}  # single-text heads only
    full = client.post("/analyze", json={"texts": [PASSAGE], "second_texts": ["Paris has a tower."],
                                         "questions": ["When was the tower finished?"]}).json()["results"][0]
    assert set(full) == {"sentiment", "topic", "ner", "nli", "qa"}
    assert full["qa"]["answer"] == PASSAGE[full["qa"]["start"]:full["qa"]["end"]]


def test_predict_each_input_shape(client, model):
    texts = client.post("/predict/topic", json={"texts": TEXTS}).json()["results"]
    assert texts == model.predict(TEXTS, head="topic")
    pairs = client.post("/predict/nli", json={"pairs": [[TEXTS[0], TEXTS[1]]]}).json()["results"]
    assert pairs == model.predict([(TEXTS[0], TEXTS[1])], head="nli")
    qa = client.post("/predict/qa", json={"questions": ["Where is the tower?"], "contexts": [PASSAGE]}).json()
    expected = model.predict([{"question": "Where is the tower?", "context": PASSAGE}], head="qa")
    assert qa["results"] == expected and set(expected[0]) >= {"answer", "start", "end", "score"}


BAD_REQUESTS = [
    # (method, path, json body or raw bytes, status, words the message must hold)
    ("post", "/analyze", {}, 422, "texts: Field required"),
    ("post", "/analyze", {"text": ["a"]}, 422, "texts: Field required"),
    ("post", "/analyze", {"texts": "one text"}, 422, "texts: Input should be a valid list"),
    ("post", "/analyze", {"texts": [3]}, 422, "texts[0]: Input should be a valid string"),
    ("post", "/analyze", {"texts": []}, 422, "texts: empty list"),
    ("post", "/analyze", {"texts": ["ok", "  "]}, 422, "texts[1]: empty text"),
    ("post", "/analyze", {"texts": ["x" * 501]}, 413, "texts[0]: 501 characters; at most 500"),
    ("post", "/analyze", {"texts": ["a"] * 9}, 413, "texts: 9 items in one request; at most 8"),
    ("post", "/analyze", {"texts": ["a", "b"], "questions": ["q"]}, 422, "questions: 1 items, expected one per text"),
    ("post", "/analyze", {"texts": ["a"], "colour": "red"}, 422, "colour: unknown field"),
    ("post", "/analyze", b'{"texts": ["a"', 422, "malformed JSON"),
    ("post", "/analyze", None, 422, "missing request body"),
    ("post", "/analyze", b"x" * 200_000, 413, "request body of 200000 bytes"),
    ("get", "/analyze", None, 405, "Method Not Allowed"),
    ("post", "/predict/nope", {"texts": ["a"]}, 404, "no head named 'nope' (heads: sentiment, topic, nli, qa, ner)"),
    ("post", "/predict/topic", {"pairs": [["a", "b"]]}, 422, "missing field 'texts': head 'topic'"),
    ("post", "/predict/nli", {"texts": ["a"]}, 422, "missing field 'pairs': head 'nli'"),
    ("post", "/predict/nli", {"pairs": [["a"]]}, 422, "pairs[0]"),
    ("post", "/predict/qa", {"questions": ["q"]}, 422, "missing field 'contexts': head 'qa'"),
    ("post", "/predict/qa", {"questions": ["q", "r"], "contexts": ["c"]}, 422, "contexts: 1 items"),
    ("post", "/predict/qa", {"questions": ["q"], "contexts": ["c" * 600]}, 413, "contexts[0]: 600 characters"),
    ("post", "/predict/topic", {"texts": ["a"], "contexts": ["c"]}, 422, "unexpected field 'contexts'"),
]


@pytest.mark.parametrize("method,path,body,status,message", BAD_REQUESTS)
def test_bad_requests_get_a_clear_4xx(client, method, path, body, status, message):
    if isinstance(body, bytes):
        response = client.request(method, path, content=body, headers={"content-type": "application/json"})
    else:
        response = client.request(method, path, json=body) if body is not None else client.request(method, path)
    assert response.status_code == status, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, str) and message in detail


def test_concurrent_requests_are_batched(model):
    settings = ServeSettings(window_ms=300, max_batch=64)
    app = create_app(model, settings)
    calls = EncoderCalls(model.net)
    try:
        with running_server(app) as url, httpx.Client(base_url=url, timeout=30) as http:
            http.get("/health")

            start = threading.Barrier(8)

            def one(i: int) -> dict:
                start.wait(30)  # the eight requests leave together
                return http.post("/analyze", json={"texts": [f"request number {i} about {TEXTS[i % 2]}"]}).json()

            with ThreadPoolExecutor(8) as pool:
                answers = list(pool.map(one, range(8)))
            health = http.get("/health").json()
    finally:
        calls.close()
    assert all(set(a["results"][0]) == {"sentiment", "topic", "ner"} for a in answers)
    expected = model.analyze([f"request number {i} about {TEXTS[i % 2]}" for i in range(8)])
    assert [a["results"][0] for a in answers] == expected  # each request got its own answer back
    assert health["requests"] == 8 and health["batches"] < 8 and health["largest_batch"] > 1
    assert calls.count == health["batches"]  # one encoder pass per batch of requests


def test_serve_command_errors(model_dir, tmp_path, capsys):
    from bertheads.cli.main import main

    assert main(["serve", str(tmp_path / "missing")]) == 2
    assert "no such model directory" in capsys.readouterr().err
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        assert main(["serve", str(model_dir), "--port", str(busy.getsockname()[1])]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertheads: error: cannot serve on 127.0.0.1:") and "choose another --port" in err


def test_batcher_isolates_a_failing_request():
    calls = []

    def run(key, payloads):
        calls.append(len(payloads))
        if any(p["bad"] for p in payloads):
            raise ValueError("bad input")
        return [[p["n"] * 2] for p in payloads]

    async def main():
        batcher = Batcher(run, max_batch=10, window_s=0.05)
        jobs = [batcher.submit(("k",), {"n": i, "bad": i == 2}, 1) for i in range(4)]
        out = await asyncio.gather(*jobs, return_exceptions=True)
        await batcher.stop()
        return out

    out = asyncio.run(main())
    assert out[0] == [0] and out[1] == [2] and out[3] == [6]
    assert isinstance(out[2], ValueError)
    assert calls[0] == 4  # the four ran together first, then each alone


# -- the web page in a real browser -----------------------------------------------------------
CHROMIUM = os.environ.get("BERTHEADS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def cli_server(model_dir):
    """`bertheads serve` in a subprocess on a free loopback port (stopped after the test)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bertheads", "serve", str(model_dir), "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180  # a loaded machine starts slowly
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"bertheads serve exited: {proc.stdout.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("bertheads serve did not start within 180 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM} (make install-test installs it)")
def test_page_in_headless_chromium(cli_server):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    expected = httpx.post(f"{cli_server}/analyze", json={"texts": [PASSAGE], "questions": ["Where is it?"]},
                          timeout=30).json()["results"][0]
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-background-networking", "--no-first-run", "--disable-extensions"], timeout=30000)
        try:
            page = browser.new_page()
            page.set_default_timeout(15000)
            page.goto(cli_server + "/")
            page.wait_for_function("document.getElementById('heads').textContent.includes('sentiment')")
            assert page.is_visible("#question")  # the model has a qa head
            page.fill("#text", PASSAGE)
            page.fill("#question", "Where is it?")
            page.click("#analyze")
            page.wait_for_selector("section[data-head='qa'] mark.answer")
            for head in ("sentiment", "topic"):
                rows = page.locator(f"section[data-head='{head}'] .bar-row")
                shown = {rows.nth(i).get_attribute("data-label"): rows.nth(i).inner_text()
                         for i in range(rows.count())}
                scores = expected[head]["scores"]
                assert set(shown) == set(scores)
                for label, score in scores.items():
                    assert f"{100 * score:.1f}%" in shown[label]
                    bar = page.locator(f"section[data-head='{head}'] .bar-row[data-label='{label}'] .bar")
                    drawn = bar.evaluate("e => e.getBoundingClientRect().width / e.parentElement.getBoundingClientRect().width")
                    assert drawn == pytest.approx(score, abs=0.01)  # the bar's length is the score
                best = page.locator(f"section[data-head='{head}'] .bar-row.best").get_attribute("data-label")
                assert best == str(expected[head]["label"])
            # entities highlighted inline, by type, exactly as the API returns them
            marks = page.locator("section[data-head='ner'] mark.ent")
            entities = expected["ner"]["entities"]
            assert entities and marks.count() == len(entities)
            for i, entity in enumerate(entities):
                assert marks.nth(i).get_attribute("data-type") == entity["type"]
                assert marks.nth(i).evaluate("e => e.firstChild.textContent") == entity["text"]
                assert marks.nth(i).locator(".ent-type").inner_text() == entity["type"]
            passage = page.locator("section[data-head='ner'] .passage").evaluate(
                "e => Array.from(e.childNodes).map(n => n.nodeType === 3 ? n.textContent : n.firstChild.textContent).join('')")
            assert passage == PASSAGE  # the text around the marks is the text as typed
            answer = page.locator("section[data-head='qa'] mark.answer").inner_text()
            assert answer == expected["qa"]["answer"]
            assert page.locator("section[data-head='nli']").count() == 0  # no second text given
            # a bad request shows the server's message, not a crash
            page.fill("#text", "x" * 10001)
            page.click("#analyze")
            page.wait_for_function("document.getElementById('error').textContent.includes('at most 10000')")
        finally:
            browser.close()
