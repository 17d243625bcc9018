"""bench/gpu.sh: its dry run (the machine and the plan of every kind, no training) and a run end
to end (on the CPU here, with tiny files and a tiny limit) that records every side of every kind
and appends their RESULTS.md rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_dry_run_shows_the_machine_and_the_plan(tmp_path):
    assert subprocess.run(["bash", "-n", str(ROOT / "bench" / "gpu.sh")]).returncode == 0
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--dry-run", "--limit", "16"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "no GPU: running on CPU" in out and "CPU: " in out and "flags: " in out  # bertheads env
    assert "train --device auto --precision auto: cpu" in out
    for step in ("step: classify (SST-2)", "step: tag (CoNLL-2003)", "step: qa (SQuAD"):
        assert step in out
    assert "token-classification" in out and "AutoModelForQuestionAnswering" in out
    assert "sst2/train.tsv (first 16)" in out and "squad/eval-split.json (first 1000)" in out
    assert "gpu.py" in out and "--limit 16" in out
    assert "--results" in out and str(ROOT / "bench" / "RESULTS.md") in out
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--dry-run", "--kinds", "tag,nope"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "--kinds" in done.stderr


def write_data(folder: Path) -> None:
    """Tiny SST-2, CoNLL-2003 and SQuAD files in the layout of the shared data folder."""
    (folder / "sst2").mkdir()
    rows = "".join(f"{w} film\t{i % 2}\n" for i, w in enumerate(["good", "awful", "great", "dull"] * 5))
    for name in ("train.tsv", "dev.tsv"):
        (folder / "sst2" / name).write_text("sentence\tlabel\n" + rows)
    (folder / "conll2003").mkdir()
    people, places = ["John Smith", "Mary Jones", "Ann Lee", "Tom Hardy"], ["Paris", "Berlin", "Rome", "Oslo"]
    sentences = []
    for i in range(20):
        first, last = people[i % 4].split()
        sentences.append(f"{first} NNP B-NP B-PER\n{last} NNP I-NP I-PER\nvisited VBD B-VP O\n"
                         f"{places[i % 4]} NNP B-NP B-LOC\n. . O O")
    for name in ("train.txt", "dev.txt"):
        (folder / "conll2003" / name).write_text("\n\n".join(sentences))
    (folder / "squad").mkdir()
    paragraphs = []
    for i in range(10):
        context = f"{people[i % 4]} was born in {places[i % 4]} in {1900 + i}. The river there is long."
        paragraphs.append({"context": context, "qas": [
            {"id": f"q{i}a", "question": f"Where was {people[i % 4]} born?",
             "answers": [{"text": places[i % 4], "answer_start": context.index(places[i % 4])}]},
            {"id": f"q{i}b", "question": f"When was {people[i % 4]} born?",
             "answers": [{"text": str(1900 + i), "answer_start": context.index(str(1900 + i))}]}]})
    doc = json.dumps({"version": "1.1", "data": [{"title": "People", "paragraphs": paragraphs}]})
    for name in ("train-split.json", "eval-split.json"):
        (folder / "squad" / name).write_text(doc)


@pytest.mark.bench  # trains every kind twice and runs each prediction peer: `make test-bench`
def test_gpu_script_runs_every_kind_on_cpu_with_a_tiny_limit(tiny_bert, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_data(data)
    out, results = tmp_path / "gpu.json", tmp_path / "RESULTS.md"
    results.write_text("# Results\n")
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--data", str(data), "--model", tiny_bert,
                           "--limit", "16", "--dev-limit", "8", "--batch-size", "8", "--out", str(out),
                           "--results", str(results)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and list(result["kinds"]) == ["classify", "tag", "qa"]
    metrics = {"classify": ("accuracy", 1), "tag": ("f1", 1), "qa": ("f1", 100)}
    for kind, got in result["kinds"].items():
        assert got["kind"] == kind and got["train_examples"] == 16 and got["dev_examples"] == 8
        assert got["ours"]["mode"] == "torch fp32 on cpu"  # AVX2 here: auto gives fp32
        for side in ("ours", "trainer"):
            assert got[side]["train_seconds"] > 0 and got[side]["train_examples_per_second"] > 0
        assert got["ours"]["train_call_seconds"] >= got["ours"]["train_seconds"]
        name, top = metrics[kind]
        for side in ("ours", "trainer", "peer"):
            assert got[side]["predict_seconds"] > 0
            assert 0 <= got[side][got["peer_metric"] if side == "peer" else name] <= top
        for ratio in ("training_speedup", "prediction_speedup", "peer_prediction_speedup"):
            assert got[ratio] > 0
        assert got["metric"] == name and isinstance(got["metric_difference_points"], float)
    assert "raw_text_f1" in result["kinds"]["tag"]["ours"] and "raw_text_f1" in result["kinds"]["tag"]["peer"]
    assert "exact_match" in result["kinds"]["qa"]["peer"] and "pipeline" in result["kinds"]["tag"]["peer"]["name"]
    assert result["kinds"]["qa"]["trainer"]["train_windows"] >= 16
    text = results.read_text()
    assert text.startswith("# Results\n") and "## GPU recipe (bench/gpu.sh)" in text
    rows = text.rstrip().splitlines()[-3:]
    for line, kind in zip(rows, ("classify", "tag", "qa")):
        assert line.startswith("| ") and f"| {kind} | cpu | CPU: " in line and line.count("|") == 11
