"""End to end on the real embedded checkpoint: the demo sample is learnt, predictions make sense."""

import json
from pathlib import Path

import pytest

import bertheads

pytestmark = pytest.mark.slow

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sentiment"


def test_default_checkpoint_learns_the_demo_sample(tmp_path):
    model = bertheads.train("classify", str(SAMPLE / "train.tsv"), str(SAMPLE / "dev.tsv"), tmp_path / "m",
                            model="default", settings=bertheads.TrainSettings(epochs=3, batch_size=16, lr=1e-4,
                                                                              progress=False))
    dev = json.loads((tmp_path / "m" / "metrics.json").read_text())["dev"]
    assert dev["accuracy"] >= 0.875, dev
    preds = model.predict(["An utterly delightful and moving film.", "Dull, clumsy and far too long."])
    assert [p["label"] for p in preds] == [1, 0]
    manifest = json.loads((tmp_path / "m" / "bertheads.json").read_text())
    assert manifest["source_model"] == "default"
