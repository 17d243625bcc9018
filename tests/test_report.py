"""`bertheads report`: the page for classify (from log.jsonl and from metrics.json history),
tag, qa v2 and a multi-head model, every figure shown in headless Chromium; bad input."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import bertheads
from bertheads.cli.main import main
from bertheads.inference.report import report

CHROMIUM = os.environ.get("BERTHEADS_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
SETTINGS = dict(epochs=2, batch_size=8, progress=False)


def images_shown(page_path) -> list[int]:
    """naturalWidth of every image on the page, loaded in headless Chromium."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the test extra")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"],
            timeout=30000)
        try:
            page = browser.new_page()
            page.goto(page_path.resolve().as_uri())
            page.wait_for_load_state("load")
            return page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
        finally:
            browser.close()


needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")


@pytest.fixture(scope="module")
def classify_model(tiny_bert, tmp_path_factory):
    d = tmp_path_factory.mktemp("rep")
    rows = "".join(f"a {w} film\t{y}\n" for w, y in [("fine", "pos"), ("bad", "neg"), ("great", "pos"),
                                                     ("dull", "neg"), ("long", "mixed")] * 4)
    (d / "data.tsv").write_text("sentence\tlabel\n" + rows)
    bertheads.train("classify", str(d / "data.tsv"), str(d / "data.tsv"), d / "model", model=tiny_bert,
                    settings=bertheads.TrainSettings(**SETTINGS))
    return d


@needs_chromium
def test_classify_page_from_history_shows_every_figure(classify_model, capsys, tmp_path):
    d = classify_model
    model = tmp_path / "model"  # a model without a training log: the curves come from metrics.json
    shutil.copytree(d / "model", model)
    (model / "log.jsonl").unlink(missing_ok=True)
    assert main(["report", str(model), "--data", str(d / "data.tsv"), "--out", str(d / "page")]) == 0
    page = d / "page" / "index.html"
    text = page.read_text()
    for part in ("training curves by epoch", "confusion matrix", "per class", "reliability", "risk-coverage",
                 "The 10 worst-scored examples", "a long film", "at the temperature in use"):
        assert part in text
    widths = images_shown(page)
    assert len(widths) == 5 and all(w > 0 for w in widths)  # curves, confusion, per class, reliability, coverage
    assert sorted(p.name for p in (d / "page").glob("*.png")) == sorted(
        ["curves-classify.png", "classify-confusion.png", "classify-per-class.png", "classify-reliability.png",
         "classify-risk-coverage.png"])


@needs_chromium
def test_page_reads_the_training_log_when_present(classify_model, tmp_path):
    d = classify_model
    model = tmp_path / "model"
    shutil.copytree(d / "model", model)
    lines = [{"type": "train", "step": s, "epoch": 1 + s // 3, "loss": 1.0 / s, "lr": 5e-5 * (1 - s / 6),
              "examples_per_second": 10.0} for s in range(1, 7)]
    lines += [{"type": "eval", "step": s, "epoch": s // 3, "dev": {"classify": {"accuracy": a, "f1": a, "loss": 1 - a}},
               "kept": k} for s, a, k in ((3, 0.4, True), (6, 0.6, True))]
    (model / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    page = report(model)  # default page directory: MODEL/report
    assert page == model / "report" / "index.html"
    assert "training curves (log.jsonl)" in page.read_text()
    widths = images_shown(page)
    assert len(widths) == 1 and widths[0] > 0


@needs_chromium
def test_multi_head_tag_and_qa_v2_page(tiny_bert, tmp_path, write):
    conll = write("ner.txt", "".join("John B-PER\nlives O\nin O\nParis B-LOC\n\nMary B-PER\nvisited O\nBerlin B-LOC\n\n"
                                     for _ in range(3)))
    ctx = "The cat sat on the mat in Paris."
    squad = {"data": [{"paragraphs": [{"context": ctx, "qas": [
        {"id": "1", "question": "Where did the cat sit?", "answers": [{"text": "on the mat", "answer_start": ctx.index("on the mat")}]},
        {"id": "2", "question": "Who sat?", "answers": [{"text": "The cat", "answer_start": 0}]},
        {"id": "3", "question": "When did the dog bark?", "answers": [], "is_impossible": True}]}]}]}
    qa = write("qa.json", json.dumps(squad))
    settings = bertheads.TrainSettings(**SETTINGS)
    frozen = dict(mode="features", cache_dir=str(tmp_path / "cache"))  # one encoder, so combine works
    bertheads.train("tag", conll, conll, tmp_path / "ner", model=tiny_bert, settings=settings, **frozen)
    bertheads.train("qa", qa, qa, tmp_path / "qa", model=tiny_bert, settings=settings, max_length=64, stride=16,
                    max_question_length=16, **frozen)
    bertheads.combine([tmp_path / "ner", tmp_path / "qa"], tmp_path / "both")
    page = report(tmp_path / "ner", conll, tmp_path / "ner-page")
    text = page.read_text()
    assert "per entity type" in text and "entity type confusion" in text and "spurious" in text
    assert "tag-reliability.png" in text and "tag-risk-coverage.png" in text  # over the words' tags
    assert "answering the most confident inputs" in text  # entity F1 over the surest sentences
    assert all(w > 0 for w in images_shown(page))
    page = report(tmp_path / "qa", qa, tmp_path / "qa-page")
    text = page.read_text()
    for part in ("by answer length", "by question word", "no-answer trade-off", "Where did the cat sit?"):
        assert part in text
    widths = images_shown(page)
    assert len(widths) == 6 and all(w > 0 for w in widths)  # 4 of qa's own, reliability, risk-coverage
    assert "qa-reliability.png" in text
    page = report(tmp_path / "both", qa, tmp_path / "both-page")
    text = page.read_text()
    assert "Head tag (tag)" in text and "Head qa (qa)" in text and "the data does not fit this head" in text
    assert all(w > 0 for w in images_shown(page))


def test_bad_input_is_one_line_exit_2(classify_model, tmp_path, write, capsys):
    d = classify_model
    cases = [
        (["report", str(tmp_path)], "not a bertheads model"),
        (["report", str(d / "model"), "--data", write("x.tsv", "sentence\tlabel\nhi\tunknown\n")],
         "was not seen in training"),
        (["report", str(d / "model"), "--out", str(d)], "holds the model"),
    ]
    for argv, message in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1
