"""Shared fixtures: a tiny random BERT with the real uncased vocabulary, and data writers."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Every machine runs the suite as an AVX2-only CPU, so `--precision auto` and `--runtime auto` give
# torch fp32 on each kind of CPU the suite meets (AVX2, AVX512_BF16, AMX); tests of the other
# choices pretend to be those machines (`helpers_machine.pretend`), or read the real flags.
os.environ["BERTHEADS_CPU_FLAGS"] = "avx2"
# The suite trains with the kinds' fixed defaults (3 epochs, batch 32, fine-tuning, no held-out
# slice) whatever its tiny data's size; the tests of the recipe by size set `recipe` themselves.
os.environ["BERTHEADS_RECIPE"] = "fixed"
# the suite's caches (features, remembered hashes, the gate's verdicts) are its own, never the user's
os.environ["BERTHEADS_CACHE"] = tempfile.mkdtemp(prefix="bertheads-cache-")
# Under `make test` two worker processes share the cores: each, and the commands it starts, runs
# torch on one thread (tests of thread use set their own count).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def default_model_dir() -> str:
    from bertheads.encoder.pretrained import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory, default_model_dir) -> str:
    """A 2-layer, hidden-32 BERT built from a config, with the default checkpoint's tokenizer."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    out = tmp_path_factory.mktemp("tiny-bert")
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=512, type_vocab_size=2)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(default_model_dir).save_pretrained(str(out))
    return str(out)


@pytest.fixture
def write(tmp_path):
    """write("name.tsv", text) -> path of a new file holding text."""

    def _write(name: str, text: str) -> str:
        path = Path(tmp_path) / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    return _write


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The tests a module lists in `NIGHTLY` (by name, parameters included) marked `nightly`, so
    `make test` leaves them to `make test-nightly`; then files with slow tests first: the two
    workers of `make test` (one file each at a time) end together instead of one waiting for the
    other's long file."""
    for item in items:
        if item.name in getattr(item.module, "NIGHTLY", ()):
            item.add_marker(pytest.mark.nightly)
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    order = {item: i for i, item in enumerate(items)}
    items.sort(key=lambda item: (item.path not in slow, order[item]))
