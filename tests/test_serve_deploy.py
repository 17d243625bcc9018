"""`bertheads serve` as a deployment meets it: the API docs (Swagger UI, ReDoc) from the
package with no network, readiness apart from liveness, the access log in the Combined Log
Format, and the page's keyboard and error habits, in Chromium."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import urllib.request
from html.parser import HTMLParser
from urllib.parse import urljoin, urlparse

import pytest
from fastapi.testclient import TestClient
from helpers_multi import save_heads
from helpers_serve import running_server

import bertheads
from bertheads.serve.app import ServeSettings, create_app

PASSAGE = "The Eiffel Tower was finished in 1889 and stands in Paris."
CHROMIUM = os.environ.get("BERTHEADS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
COMBINED = re.compile(r'^(\S+) - - \[\d\d/[A-Z][a-z]{2}/\d{4}:\d\d:\d\d:\d\d \+0000\] "([A-Z]+) (\S+) HTTP/[\d.]+" '
                      r'(\d{3}) (\d+|-) "([^"]*)" "([^"]*)" \d+\.\d{3}$')


@pytest.fixture(scope="module")
def model(tiny_bert, tmp_path_factory):
    heads = {"sentiment": ("classify", 1, {"labels": ["negative", "positive"]}),
             "qa": ("qa", 4, {"max_length": 64, "stride": 16})}
    return bertheads.load(save_heads(tiny_bert, tmp_path_factory.mktemp("deploy") / "model", heads))


def test_ready_is_apart_from_health(model):
    app = create_app(model, ServeSettings())
    client = TestClient(app, base_url="http://localhost")  # lifespan not run: the batcher is not started
    assert client.get("/health").status_code == 200
    starting = client.get("/ready")
    assert starting.status_code == 503 and starting.json() == {"ready": False, "detail": "starting"}
    with TestClient(app, base_url="http://localhost") as client:
        assert client.get("/ready").json() == {"ready": True}
        app.state.batcher.max_queue = 0  # every place in the queue taken
        full = client.get("/ready")
        assert full.status_code == 503 and full.json()["detail"] == "queue full"
        assert client.get("/health").status_code == 200  # alive all the same


def test_access_log_in_combined_log_format(model, tmp_path):
    log = tmp_path / "access.log"
    app = create_app(model, ServeSettings(access_log=str(log), token="s3cret"))
    with TestClient(app, base_url="http://localhost") as client:
        assert client.post("/analyze", json={"texts": ["good"]}, headers={"Authorization": "Bearer s3cret",
                                                                           "User-Agent": "probe/1.0"}).status_code == 200
        assert client.get("/heads?x=1").status_code == 401  # refused by the guard: logged too
    lines = log.read_text().splitlines()
    assert len(lines) == 2, lines
    first, second = (COMBINED.match(line) for line in lines)
    assert first and first.group(2, 3, 4, 7) == ("POST", "/analyze", "200", "probe/1.0")
    assert int(first.group(5)) > 0
    assert second and second.group(2, 3, 4) == ("GET", "/heads?x=1", "401")
    assert "s3cret" not in log.read_text()


class Links(HTMLParser):
    """Every src and href of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs) -> None:
        self.links += [value for name, value in attrs if name in ("src", "href") and value]


def test_docs_pages_name_nothing_outside_the_server(model):
    """/docs and /redoc from a real server on 127.0.0.1: every src and href is the server's own
    (or a data: URI), each of those answers 200, and the files they load fetch nothing else
    (ReDoc's sidebar logo and Swagger UI's validator badge were the last)."""
    with running_server(create_app(model, ServeSettings())) as url:
        for page in ("/docs", "/redoc"):
            with urllib.request.urlopen(url + page, timeout=10) as answer:
                html = answer.read().decode()
            parser = Links()
            parser.feed(html)
            assert parser.links and not re.search(r"https?://", html), (page, html)
            local = [link for link in parser.links if not link.startswith("data:")]
            assert local and all(link.startswith("/static/") for link in local), (page, parser.links)
            for link in local:
                request = urllib.request.Request(urljoin(url, link), headers={"Accept-Encoding": "gzip"})
                with urllib.request.urlopen(request, timeout=10) as answer:
                    assert answer.status == 200
                    body = answer.read()
                    text = (gzip.decompress(body) if answer.headers.get("Content-Encoding") == "gzip" else body).decode()
                assert "cdn.redoc.ly" not in text and not re.search(r"url\(\s*['\"]?(https?:)?//", text), link
            if page == "/docs":
                assert '"validatorUrl": null' in html  # else a badge from validator.swagger.io off localhost


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM} (make install-test installs it)")
def test_docs_offline_and_the_page_habits_in_chromium(model):
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    with running_server(create_app(model, ServeSettings(max_text_chars=500))) as url, \
            sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--disable-background-networking", "--no-first-run", "--disable-extensions"], timeout=30000)
        try:
            page = browser.new_page()
            page.set_default_timeout(20000)
            elsewhere = []

            def offline(route) -> None:  # no network but the server: a CDN would fail here
                if urlparse(route.request.url).hostname == "127.0.0.1":
                    route.continue_()
                else:
                    elsewhere.append(route.request.url)
                    route.abort()

            page.route("**/*", offline)
            page.goto(url + "/docs")
            page.wait_for_selector(".swagger-ui .info .title")
            assert "bertheads" in page.inner_text(".swagger-ui .info .title")
            page.wait_for_selector("text=/analyze")
            page.goto(url + "/redoc")
            page.wait_for_function("document.body.innerText.includes('every head on each text')")
            assert page.locator("img[alt='redocly logo']").count() == 0  # its image loads nothing: hidden
            assert elsewhere == [], elsewhere  # nothing from anywhere but the server

            page.goto(url + "/")
            page.wait_for_function("document.getElementById('heads').textContent.includes('sentiment')")
            assert "Ctrl+Enter in any box" in page.inner_text(".hint")
            page.fill("#text", PASSAGE)
            page.fill("#question", "Where is it?")
            page.focus("#question")
            page.keyboard.press("Control+Enter")  # from the Question field, as the hint says
            page.wait_for_selector("section[data-head='qa'] mark.answer, section[data-head='qa'] .empty")
            assert page.locator("#results section").count() == 2
            page.fill("#text", "x" * 501)
            page.focus("#text")
            page.keyboard.press("Control+Enter")
            page.wait_for_function("document.getElementById('error').textContent.includes('at most 500')")
            assert page.locator("#results section").count() == 0  # the earlier text's results are gone
        finally:
            browser.close()
