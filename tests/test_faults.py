"""Faults of the environment, for real: a full disk (a small tmpfs the test mounts) at each write
(model, checkpoint, export, predict output), two runs into one --out, a stale lock, and one huge
input line. Each gives one line and leaves a usable folder."""

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bertheads.cli.main import main
from bertheads.store import lock

ROWS = "sentence\tlabel\n" + "".join(f"a {w} movie {i}\t{y}\n" for i in range(12)
                                     for w, y in (("great", 1), ("awful", 0)))
SRC = str(Path(__file__).resolve().parents[1] / "src")


@pytest.fixture
def disk(tmp_path):
    """A 48 MB tmpfs at tmp_path/disk; `fill(free_bytes)` leaves that much room, `empty()` frees it."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip() or 'not root'})")

    class Disk:
        path = mount

        def fill(self, free: int) -> None:
            ballast = mount / f"ballast-{uuid.uuid4().hex}"
            room = shutil.disk_usage(mount).free - free
            with open(ballast, "wb") as fh:
                while room > 0:
                    chunk = min(room, 1 << 20)
                    fh.write(b"\0" * chunk)
                    room -= chunk

        def empty(self) -> None:
            for ballast in mount.glob("ballast-*"):
                ballast.unlink()

    yield Disk()
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def train_argv(tiny_bert, data, out, *extra):
    return ["train", "classify", "--train", data, "--dev", data, "--out", str(out), "--model", tiny_bert,
            "--epochs", "1", "--batch-size", "8", "--no-progress", *extra]


def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) >= 1
    assert err[-1].startswith("bertheads: error: "), err
    return err[-1]


@pytest.mark.parametrize("extra", [[], ["--save-every", "1"]], ids=["model", "checkpoint"])
def test_disk_full_in_training_leaves_no_out(tiny_bert, write, disk, capsys, extra):
    data = write("t.tsv", ROWS)
    out = disk.path / "runs" / "m"
    disk.fill(600_000)
    assert main(train_argv(tiny_bert, data, out, *extra)) == 1
    line = one_error_line(capsys)
    assert "no space left on the device" in line and "free there" in line, line
    assert not out.exists() and not (disk.path / "runs").exists()
    assert [p.name for p in disk.path.iterdir() if not p.name.startswith("ballast-")] == []
    disk.empty()
    assert main(train_argv(tiny_bert, data, out, *extra)) == 0
    assert (out / "bertheads.json").is_file()


def test_disk_full_keeps_the_earlier_model(tiny_bert, write, disk, capsys):
    data = write("t.tsv", ROWS)
    out = disk.path / "m"
    assert main(train_argv(tiny_bert, data, out)) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "log.jsonl"}
    capsys.readouterr()
    disk.fill(600_000)
    assert main(train_argv(tiny_bert, data, out, "--overwrite", "--seed", "7")) == 1
    assert "no space left on the device" in one_error_line(capsys)
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "log.jsonl"}
    assert after == before
    assert main(["predict", str(out), "--input", write("x.txt", "a great movie\n")]) == 0


def test_disk_full_in_export_and_predict_output(tiny_bert, write, disk, tmp_path, capsys):
    data = write("t.tsv", ROWS)
    model = tmp_path / "m"
    assert main(train_argv(tiny_bert, data, model)) == 0
    capsys.readouterr()
    disk.fill(300_000)
    exported = disk.path / "exports" / "hf"
    assert main(["export", str(model), "--to", "hf", "--out", str(exported)]) == 1
    assert "no space left on the device" in one_error_line(capsys)
    assert not (disk.path / "exports").exists()
    texts = write("many.txt", "".join(f"a great movie number {i}\n" for i in range(6000)))
    output = disk.path / "preds" / "p.jsonl"
    assert main(["predict", str(model), "--input", texts, "--output", str(output)]) == 1
    line = one_error_line(capsys)
    assert "no space left on the device" in line and str(output) in line, line
    assert not (disk.path / "preds").exists()
    disk.empty()
    assert main(["export", str(model), "--to", "hf", "--out", str(exported)]) == 0


def test_permission_denied_is_one_line(tiny_bert, write, tmp_path, capsys):
    if os.geteuid() == 0:
        readonly = tmp_path / "ro"
        readonly.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(readonly)],
                              capture_output=True)
        if done.returncode != 0:
            pytest.skip("cannot mount a read-only tmpfs here")
        try:
            code = main(train_argv(tiny_bert, write("t.tsv", ROWS), readonly / "m"))
            line = one_error_line(capsys)
        finally:
            subprocess.run(["umount", "-l", str(readonly)], capture_output=True)
        assert code == 1 and "read-only file system" in line, line
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert main(train_argv(tiny_bert, write("t.tsv", ROWS), locked / "m")) == 1
        assert "permission denied" in one_error_line(capsys)


def test_one_run_per_out(tiny_bert, write, tmp_path, capsys):
    """A second run into a folder another live process holds is refused at once, naming it."""
    out = tmp_path / "m"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from bertheads.store import lock; "
                               f"lock.hold({str(out)!r}); print('held', flush=True); time.sleep(60)"],
                              env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        start = time.monotonic()
        assert main(train_argv(tiny_bert, write("t.tsv", ROWS), out)) == 2
        line = one_error_line(capsys)
        assert time.monotonic() - start < 30
        assert f"another bertheads run is writing here (pid {holder.pid}" in line, line
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    # the holder was killed: its lock went with it, and the next run proceeds
    assert main(train_argv(tiny_bert, write("t.tsv", ROWS), out)) == 0
    assert (out / "bertheads.json").is_file()


def test_lock_is_per_process_and_released(tmp_path):
    out = tmp_path / "x"
    assert lock.hold(out) == out.absolute()
    assert lock.hold(out) == out.absolute()  # again in the same process: no-op
    lock.release(out)
    probe = subprocess.run([sys.executable, "-c", f"from bertheads.store import lock; lock.hold({str(out)!r})"],
                           env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr


def test_a_finished_run_leaves_no_lock_file(tiny_bert, write, tmp_path):
    out = tmp_path / "m"
    assert main(train_argv(tiny_bert, write("t.tsv", ROWS), out)) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m", "t.tsv"]


# -- one huge input ---------------------------------------------------------------------------
def test_truncated_texts_are_tokenized_only_as_far_as_they_are_read(default_model_dir):
    from transformers import AutoTokenizer

    from bertheads.text.encoding import encode_texts, readable_prefix

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    texts = ["a warm, funny film " * 500,
             "x" * 150 + " " + "word " * 1000,  # a word over WordPiece's 100 characters near the start
             "東京は日本の首都です。" * 500,  # no spaces at all
             "Zoë's café, naïve — " * 300 + "y" * 5000,
             "short text"]
    for max_length in (8, 128, 512):
        whole = tok(texts, truncation=True, max_length=max_length)["input_ids"]
        assert [f["input_ids"] for f in encode_texts(tok, texts, max_length=max_length)] == whole
        # (the tokenizer's own longest-first cut of long pairs takes memory that grows with the
        # square of their length: the reference pairs are kept short)
        firsts, pairs = [text[:2000] for text in texts], ["the second text " * 60] * len(texts)
        whole = tok(firsts, pairs, truncation="longest_first", max_length=max_length)["input_ids"]
        assert [f["input_ids"] for f in encode_texts(tok, firsts, pairs, max_length)] == whole
    assert len(readable_prefix(tok, texts[0], 128)) < 5000

    seen = []

    def counting(texts_or_text, *args, **kwargs):
        batch = texts_or_text if isinstance(texts_or_text, list) else [texts_or_text]
        seen.extend(len(t) for t in batch)
        return tok(texts_or_text, *args, **kwargs)

    encode_texts(counting, ["word " * 2_000_000], max_length=128)
    assert max(seen) < 10_000  # of a 10-million-character text


def test_a_line_over_the_limit_is_refused_with_its_number(tiny_bert, write, tmp_path, capsys, monkeypatch):
    model = tmp_path / "m"
    assert main(train_argv(tiny_bert, write("t.tsv", ROWS), model)) == 0
    lines = ['{"text": "a great movie"}', '{"text": "' + "long " * 400 + '"}', '{"text": "an awful movie"}']
    data = write("in.jsonl", "\n".join(lines) + "\n")
    monkeypatch.setenv("BERTHEADS_MAX_LINE_MB", "0.001")  # 1,000 characters
    capsys.readouterr()
    assert main(["predict", str(model), "--input", data]) == 2
    line = one_error_line(capsys)
    assert f"{data}:2: a line of 2,013 characters is longer than the limit of 1,000" in line, line
    assert main(["predict", str(model), "--input", data, "--skip-bad-lines"]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2 and f"{data}:2:" in captured.err


@pytest.mark.parametrize("fault", [MemoryError(), RuntimeError("[enforce fail at alloc_cpu.cpp:121] "
                                                               "DefaultCPUAllocator: can't allocate memory")])
def test_out_of_memory_while_loading_is_one_line(tiny_bert, write, tmp_path, capsys, monkeypatch, fault):
    from bertheads.encoder.pretrained import Encoder

    model = tmp_path / "m"
    assert main(train_argv(tiny_bert, write("t.tsv", ROWS), model)) == 0
    capsys.readouterr()

    def no_memory(*args, **kwargs):
        raise fault

    monkeypatch.setattr(Encoder, "load", classmethod(no_memory))
    assert main(["predict", str(model), "--input", write("x.txt", "a great movie\n")]) == 1
    line = one_error_line(capsys)
    assert line.startswith("bertheads: error: out of memory (") and "available" in line, line


def test_a_feature_cache_being_built_is_not_built_twice(tiny_bert, write, tmp_path, capsys):
    data, cache = write("t.tsv", ROWS), tmp_path / "cache"
    features = ["--mode", "features", "--cache-dir", str(cache)]
    assert main(train_argv(tiny_bert, data, tmp_path / "a", *features)) == 0
    entry = next(p for p in (cache / "features").iterdir() if p.is_dir())
    shutil.rmtree(entry)
    holder = subprocess.Popen([sys.executable, "-c", "import time; from bertheads.store import lock; "
                               f"lock.hold({str(entry)!r}, 'feature-cache build'); print('held', flush=True); "
                               "time.sleep(60)"], env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert main(train_argv(tiny_bert, data, tmp_path / "b", *features)) == 2
        line = one_error_line(capsys)
        assert "another bertheads feature-cache build is writing here" in line and str(holder.pid) in line, line
    finally:
        holder.kill()
        holder.wait()
    assert main(train_argv(tiny_bert, data, tmp_path / "b", *features)) == 0
    assert (entry / "meta.json").is_file() and not list((cache / "features").glob(".*.lock"))
