"""bench/gpu.sh runs end to end (on the CPU here, with a tiny limit) and records both sides."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # runs extra processes (torchrun, kills, signals)
def test_gpu_script_runs_on_cpu_with_a_tiny_limit(tiny_bert, tmp_path):
    rows = "".join(f"{w} film\t{i % 2}\n" for i, w in enumerate(["good", "awful", "great", "dull"] * 4))
    data = tmp_path / "sst.tsv"
    data.write_text("sentence\tlabel\n" + rows)
    out = tmp_path / "gpu.json"
    env = {**os.environ, "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(["bash", str(ROOT / "bench" / "gpu.sh"), "--train", str(data), "--dev", str(data),
                           "--model", tiny_bert, "--limit", "16", "--batch-size", "8", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["train_examples"] == 16
    for side in ("ours", "trainer"):
        assert result[side]["train_seconds"] > 0 and result[side]["dev_examples"] == 16
        assert 0 <= result[side]["accuracy"] <= 1
    assert result["training_speedup"] > 0 and result["prediction_speedup"] > 0
