"""bench/gpu.sh: its dry run (the machine and the plan, no training) and a run end to end (on
the CPU here, with a tiny limit) that records every side and appends its RESULTS.md row."""

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
    assert "step: classify (SST-2)" in out and "gpu.py" in out and "--limit 16" in out
    assert "--results" in out and str(ROOT / "bench" / "RESULTS.md") in out


@pytest.mark.slow  # trains twice and runs a pipeline
def test_gpu_script_runs_on_cpu_with_a_tiny_limit(tiny_bert, tmp_path):
    rows = "".join(f"{w} film\t{i % 2}\n" for i, w in enumerate(["good", "awful", "great", "dull"] * 4))
    data = tmp_path / "sst.tsv"
    data.write_text("sentence\tlabel\n" + rows)
    out, results = tmp_path / "gpu.json", tmp_path / "RESULTS.md"
    results.write_text("# Results\n")
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--train", str(data), "--dev", str(data),
                           "--model", tiny_bert, "--limit", "16", "--batch-size", "8", "--out", str(out),
                           "--results", str(results)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["train_examples"] == 16
    assert result["ours"]["mode"] == "torch fp32 on cpu"  # AVX2 here: auto gives fp32
    for side in ("ours", "trainer"):
        assert result[side]["train_seconds"] > 0 and result[side]["dev_examples"] == 16
    for side in ("ours", "trainer", "pipeline"):
        assert 0 <= result[side]["accuracy"] <= 1 and result[side]["predict_seconds"] > 0
    assert result["training_speedup"] > 0 and result["pipeline_prediction_speedup"] > 0
    text = results.read_text()
    assert text.startswith("# Results\n") and "## GPU recipe (bench/gpu.sh)" in text
    assert text.rstrip().splitlines()[-1].startswith("| ") and "| cpu | CPU: " in text
