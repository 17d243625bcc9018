"""Packing: the BERT layouts, truncation, dynamic padding, length grouping, order restoring."""

from contextlib import contextmanager

import numpy as np
import pytest

from bertheads.compute.batching import length_grouped_batches, shard, sorted_batches
from bertheads.text.encoding import collate, encode_texts


@pytest.fixture(scope="module")
def tok(default_model_dir):
    from bertheads.encoder.pretrained import load_tokenizer

    return load_tokenizer(default_model_dir)


def test_single_text_layout(tok):
    (f,) = encode_texts(tok, ["Hello world"])
    assert tok.convert_ids_to_tokens(f["input_ids"]) == ["[CLS]", "hello", "world", "[SEP]"]
    assert f["token_type_ids"] == [0, 0, 0, 0]


def test_pair_layout_with_segment_ids(tok):
    (f,) = encode_texts(tok, ["a cat"], ["the dog"])
    assert tok.convert_ids_to_tokens(f["input_ids"]) == ["[CLS]", "a", "cat", "[SEP]", "the", "dog", "[SEP]"]
    assert f["token_type_ids"] == [0, 0, 0, 0, 1, 1, 1]


def test_pair_truncation_is_longest_first(tok):
    long_a = " ".join(["alpha"] * 50)
    (f,) = encode_texts(tok, [long_a], ["beta gamma"], max_length=16)
    tokens = tok.convert_ids_to_tokens(f["input_ids"])
    assert len(tokens) == 16
    assert tokens[-3:] == ["beta", "gamma", "[SEP]"]  # the short side is kept whole
    assert tokens.count("alpha") == 16 - 5


def test_mixed_singles_and_pairs_keep_order(tok):
    feats = encode_texts(tok, ["one", "two", "three"], [None, "x", None])
    assert [tok.convert_ids_to_tokens(f["input_ids"])[1] for f in feats] == ["one", "two", "three"]
    assert sum(feats[1]["token_type_ids"]) == 2 and sum(feats[0]["token_type_ids"]) == 0


def test_collate_pads_to_longest_in_batch_only(tok):
    feats = encode_texts(tok, ["a", "a b c d"])
    for f, y in zip(feats, (0, 1)):
        f["labels"] = y
        f["tok_tags"] = [1] * len(f["input_ids"])
    batch = collate(feats, pad_id=0)
    assert batch["input_ids"].shape == (2, 6)
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]
    assert batch["labels"].tolist() == [0, 1]
    assert batch["tok_tags"][0].tolist() == [1, 1, 1, -100, -100, -100]


def test_length_grouped_batches_cover_everything_once_and_group_lengths():
    import random

    rng = random.Random(0)
    lengths = [rng.randint(3, 120) for _ in range(2000)]
    batches = length_grouped_batches(lengths, 32, seed=1)
    flat = sorted(i for b in batches for i in b)
    assert flat == list(range(2000))
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    assert spread < 10  # random batches of 32 would spread ~100
    assert length_grouped_batches(lengths, 32, seed=2) != batches  # shuffled groups
    assert length_grouped_batches(lengths, 32, seed=1) == batches  # reproducible


def test_length_grouped_batches_keep_groups_together():
    import random

    rng = random.Random(0)
    groups = [g for g in range(300) for _ in range(rng.randint(1, 3))] + [999] * 20  # one group > batch
    lengths = [rng.randint(3, 120) for _ in groups]
    batches = length_grouped_batches(lengths, 16, seed=1, groups=groups)
    assert sorted(i for b in batches for i in b) == list(range(len(groups)))
    where = {}
    for n, b in enumerate(batches):
        for i in b:
            where.setdefault(groups[i], set()).add(n)
    assert all(len(v) == 1 for v in where.values())  # no group split
    assert sorted(len(b) for b in batches)[-1] == 20 and sorted(len(b) for b in batches)[-2] <= 16


def test_sorted_batches_and_token_cap():
    lengths = [5, 50, 7, 49, 6]
    batches = sorted_batches(lengths, batch_size=2)
    assert batches == [[1, 3], [2, 4], [0]]
    capped = sorted_batches([100] * 10, batch_size=8, max_tokens=300)
    assert all(len(b) <= 3 for b in capped) and sum(len(b) for b in capped) == 10


def test_shard_splits_batches_between_processes():
    batches = [[i] for i in range(7)]
    a, b = list(shard(batches, 0, 2)), list(shard(batches, 1, 2))
    assert not set(map(tuple, a)) & set(map(tuple, b))
    assert len(a) == len(b) == 3
    assert list(shard(batches, 0, 1)) == batches


def test_batches_on_worker_threads_match_one_thread(tiny_bert, tmp_path, write):
    """On a CPU with 2 torch threads, inference batches run on 2 single-threaded workers: the
    outputs are those of a serial run, in input order, and the caller's thread count stays."""
    import torch

    import bertheads
    import bertheads.compute.runner as packing_module

    rows = "".join(f"{'good ' * (i % 7 + 1)}film {i}\t{i % 2}\n" for i in range(40))
    model = bertheads.train("classify", write("t.tsv", "sentence\tlabel\n" + rows), None, tmp_path / "m",
                            model=tiny_bert, settings=bertheads.TrainSettings(epochs=1, progress=False))
    texts = [f"{'bad ' * (i % 9)}text number {i}" for i in range(60)]
    used = []
    real = packing_module.cpu_workers
    packing_module.cpu_workers = lambda device, n: used.append(real(device, n)) or used[-1]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        parallel = model.predict(texts, batch_size=4)
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        serial = model.predict(texts, batch_size=4)
    finally:
        packing_module.cpu_workers = real
        torch.set_num_threads(before)
    assert used == [(2, 1), (1, 1)]  # two single-threaded workers, then serial
    assert [p["label"] for p in parallel] == [p["label"] for p in serial]
    assert all(abs(p["scores"][k] - s["scores"][k]) < 1e-5 for p, s in zip(parallel, serial) for k in p["scores"])
    assert real(torch.device("cpu"), 1)[0] == 1 and real(torch.device("cuda"), 9)[0] == 1


def test_worker_threads_do_not_leak_and_are_capped():
    """Threads started after a parallel run get the caller's thread count, not the workers'
    one; past MAX_CPU_WORKERS batches in flight, workers share the threads out."""
    import threading

    import torch

    from bertheads.compute.batching import MAX_CPU_WORKERS, cpu_workers
    from bertheads.compute.runner import run_heads

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        runner = CountingRunner()
        run_heads(runner, [{"input_ids": [1]}, {"input_ids": [1, 2]}, {"input_ids": [1, 2, 3]}], ["sum"], batch_size=1)
        assert runner.threads == [1, 1, 1] and torch.get_num_threads() == 2
        later: list[int] = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert later == [2]
        torch.set_num_threads(4 * MAX_CPU_WORKERS)
        assert cpu_workers(torch.device("cpu"), 1000) == (MAX_CPU_WORKERS, 4)
        assert cpu_workers(torch.device("cpu"), 3) == (3, 4 * MAX_CPU_WORKERS // 3)
    finally:
        torch.set_num_threads(before)


class CountingRunner:
    """A `Runner` whose outputs are the features' ids: one row per token for "tok", their sum
    for "sum"; it reports the threads it ran on and, when `loss` is set, a loss per batch."""

    def __init__(self, workers: int | None = None, loss: bool = True) -> None:
        import torch

        self.pad_id, self.device, self.workers, self.loss, self.threads = 0, torch.device("cpu"), workers, loss, []
        self.tasks, self.tokenizer, self.evaluations = {}, None, 0

    def token_level(self, head: str) -> bool:
        return head == "tok"

    @contextmanager
    def evaluating(self):
        self.evaluations += 1
        yield

    def run_batch(self, features, rows, heads, with_loss=False):
        import torch

        self.threads.append(torch.get_num_threads())
        width = max(len(f["input_ids"]) for f in features)
        tok = np.array([f["input_ids"] + [-1] * (width - len(f["input_ids"])) for f in features])
        outputs = {"tok": tok[:, :, None], "sum": np.array([sum(f["input_ids"]) for f in features])}
        return {h: outputs[h] for h in heads}, ({h: float(len(rows)) for h in heads} if with_loss and self.loss else {})


def test_run_heads_restores_order_trims_tokens_and_sums_losses():
    """The one loop of head outputs: input order back, token rows trimmed to each feature, batch
    losses weighted by batch size, in the runner's evaluation mode; a runner that gives no loss
    reports [nan, 0]; a runner with threads of its own (`workers`) runs side by side and leaves
    torch's thread count alone; a sink gets every batch in order instead."""
    import math

    import torch

    from bertheads.compute.runner import run_heads

    features = [{"input_ids": list(range(1, 2 + (i * 7) % 11))} for i in range(30)]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for runner in (CountingRunner(), CountingRunner(workers=3, loss=False)):
            losses: dict = {}
            got = run_heads(runner, features, ["tok", "sum"], batch_size=4, losses=losses)
            assert runner.evaluations == 1
            assert [a[:, 0].tolist() for a in got["tok"]] == [f["input_ids"] for f in features]
            assert [int(a) for a in got["sum"]] == [sum(f["input_ids"]) for f in features]
            if runner.loss:  # batches of 4, 4, ... 2: each reports its own size as its loss
                assert losses == {"tok": [7 * 4 * 4 + 2 * 2, 30], "sum": [7 * 4 * 4 + 2 * 2, 30]}
                assert runner.threads == [1] * 8  # two single-threaded torch workers
            else:
                assert all(math.isnan(losses[h][0]) and losses[h][1] == 0 for h in ("tok", "sum"))
                assert runner.threads == [2] * 8  # torch's threads left alone
            assert torch.get_num_threads() == 2
        batches: list = []
        assert run_heads(CountingRunner(), features, ["sum"], batch_size=4,
                         sink=lambda rows, out, _: batches.append((rows, out["sum"].tolist()))) == {}
        assert sorted(i for rows, _ in batches for i in rows) == list(range(30))
        assert all(sums == [sum(features[i]["input_ids"]) for i in rows] for rows, sums in batches)
    finally:
        torch.set_num_threads(before)
