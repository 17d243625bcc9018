"""bench/small_data.py: its plan (seed by seed; what an arm cannot take is said once), its samples
(SQuAD questions written back as SQuAD JSON), and a run end to end on the CPU with a tiny model
and tiny files of every task (`make test-bench`): one line per run, resumed, shared by shards,
tabled."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "small_data.py"


@pytest.fixture(scope="module")
def small_data():
    spec = importlib.util.spec_from_file_location("small_data_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)
    while str(SCRIPT.parent) in sys.path:  # (it put bench/ first on the path: its modules stay out of other tests)
        sys.path.remove(str(SCRIPT.parent))


def test_the_plan_goes_seed_by_seed_and_says_once_what_an_arm_cannot_take(small_data, capsys):
    args = SimpleNamespace(seeds=[0, 1], tasks=["conll", "mrpc"], sizes={"conll": [50], "mrpc": [200, 800]},
                           arms={"conll": ["new", "setfit"], "mrpc": ["new", "setfit", "trainer"]})
    runs = small_data.plan(args)
    assert runs[:3] == [(0, "conll", 50, "new"), (0, "mrpc", 200, "new"), (0, "mrpc", 200, "trainer")]
    assert [r[0] for r in runs] == [0] * 5 + [1] * 5  # every run of seed 0 first
    said = capsys.readouterr().out.splitlines()
    assert said == ["skip setfit on conll (50 sentences): it takes classify only (SetFit classifies texts)",
                    "skip setfit on mrpc (200, 800 rows): it takes no text pairs (SetFit embeds one text per input)"]
    assert small_data.skipped("sst2", "setfit", 800).startswith("it runs up to 200 examples")
    assert small_data.skipped("sst2", "setfit", 200) is None


def test_squad_samples_are_questions_written_back_as_squad_json(small_data, tmp_path):
    source = tmp_path / "squad.json"
    source.write_text(json.dumps({"version": "1.1", "data": [
        {"title": t, "paragraphs": [{"context": f"{t} {p}", "qas": [{"id": f"{t}{p}{q}", "question": "?",
                                                                       "answers": [{"text": t, "answer_start": 0}]}
                                                                      for q in range(3)]} for p in range(2)]}
        for t in ("A", "B")]}))
    tasks = importlib.import_module("small_data_tasks")  # bench/ is on the path once the script is loaded
    items = tasks.read_squad(source)
    assert len(items) == 12 and small_data.sample(items, 4, 0) == items[:4]
    picked = small_data.sample(items, 5, 3)
    assert picked != items[:5] and picked == small_data.sample(items, 5, 3)  # seeded
    tasks.write_squad(picked, tmp_path / "out.json")
    back = tasks.read_squad(tmp_path / "out.json")
    assert sorted(i["qa"]["id"] for i in back) == sorted(i["qa"]["id"] for i in picked)
    assert all(i["context"] == f"{i['title']} {i['qa']['id'][1]}" for i in back)  # each question with its passage


@pytest.mark.bench  # trains a tiny model some dozen times: `make test-bench`
def test_every_task_runs_resumes_and_is_tabled_on_the_cpu(tiny_bert, tmp_path):
    from test_gpu_script import write_data

    data = tmp_path / "data"
    data.mkdir()
    write_data(data)
    mrpc = data / "glue" / "MRPC"
    mrpc.mkdir(parents=True)
    rows = "".join(f"{i % 2}\t{i}\t{i + 1}\tthe {w} film\ta {w} film{'' if i % 2 else ' not'}\n"
                   for i, w in enumerate(["good", "awful", "great", "dull"] * 5))
    for name in ("train.tsv", "dev.tsv"):
        (mrpc / name).write_text("\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n" + rows)
    env = {**os.environ, "BERTHEADS_DATA": str(data), "CUDA_VISIBLE_DEVICES": ""}
    out = tmp_path / "out"
    command = [sys.executable, str(SCRIPT), "--task", "sst2,mrpc,conll,squad", "--sizes", "8", "--seeds", "0,1",
               "--arms", "new,trainer", "--arms", "squad=feat", "--model", tiny_bert, "--limit-dev", "6",
               "--out-dir", str(out), "--threads", "1"]
    shards = [subprocess.Popen([*command, "--shard", f"{k}/2"], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for k in range(2)]
    logs = [p.communicate(timeout=600)[0] for p in shards]
    assert [p.returncode for p in shards] == [0, 0], "\n".join(logs)[-3000:]
    files = {t: out / f for t, f in (("sst2", "small_data.jsonl"), ("mrpc", "small_data_mrpc.jsonl"),
                                      ("conll", "small_data_conll.jsonl"), ("squad", "small_data_squad.jsonl"))}
    metric = {"sst2": "accuracy", "mrpc": "f1", "conll": "f1", "squad": "exact_match"}
    for task, path in files.items():
        records = [json.loads(line) for line in path.read_text().splitlines()]
        arms = ["feat"] if task == "squad" else ["new", "trainer"]
        assert sorted((r["arm"], r["seed"]) for r in records) == sorted((a, s) for a in arms for s in (0, 1))
        assert all(r["size"] == 8 and r["dev_examples"] == 6 and r["shards"] == 2 and r["seconds"] > 0
                   and r[metric[task]] is not None for r in records)
    again = subprocess.run([*command, "--budget", "600"], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "0 runs to go" in again.stdout  # every line there: nothing runs again
    table = subprocess.run([sys.executable, str(SCRIPT), "--table", "--task", "sst2,mrpc,conll,squad",
                            "--out-dir", str(out), "--per-seed"], env=env, capture_output=True, text=True, timeout=300)
    assert table.returncode == 0, table.stderr[-2000:]
    text = table.stdout
    for heading in ("### sst2 (classify", "### mrpc (classify", "### conll (tag", "### squad (qa", "exact_match:"):
        assert heading in text
    assert "| rows | new | trainer |" in text and "| questions | feat |" in text and "| 8 | 1 |" in text
