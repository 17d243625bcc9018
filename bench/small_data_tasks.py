"""bench/small_data.py's tasks: each benchmark task's kind, files, default sizes and arms and
metrics (`TASKS`); drawing N training examples and writing them in the kind's own format; the
dev set and its scoring with bertheads' own metric code."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from common import DATA


@dataclass(frozen=True)
class Task:
    """A benchmark task: its kind, files (under DATA), default sizes and arms, and metrics (the
    first is the main one; `percent`: they are in percent already)."""

    kind: str
    train: str
    dev: str
    sizes: tuple[int, ...]
    arms: tuple[str, ...]
    metrics: tuple[str, ...]
    unit: str
    dev_first: int | None = None  # a fixed slice of the dev file: its first N examples
    pairs: bool = False
    percent: bool = False


TASKS = {
    "sst2": Task("classify", "sst2/train.tsv", "sst2/dev.tsv", (32, 64, 200, 800, 2000),
                 ("old", "new", "trainer", "setfit"), ("accuracy",), "rows"),
    "mrpc": Task("classify", "glue/MRPC/train.tsv", "glue/MRPC/dev.tsv", (200, 800),
                 ("old", "new", "trainer", "feat"), ("accuracy", "f1"), "rows", pairs=True),
    "conll": Task("tag", "conll2003/train.txt", "conll2003/dev.txt", (50, 200, 1000),
                  ("new", "trainer", "ft8", "ft16", "feat"), ("f1",), "sentences"),
    "squad": Task("qa", "squad/train-split.json", "squad/eval-split.json", (200, 1000),
                  ("new", "trainer", "ft8", "ft16", "feat"), ("f1", "exact_match"), "questions", dev_first=1000,
                  percent=True),
}



# -- data: sampling, files in each kind's format ----------------------------------------------------
def sample(items: list, n: int, seed: int) -> list:
    """N training examples drawn at random (seed 0: the first N, as a user's first labels would be)."""
    if n > len(items):
        raise SystemExit(f"asked for {n} training examples, the file has {len(items)}")
    if seed == 0:
        return items[:n]
    return random.Random(seed).sample(items, n)


def read_lines(path: Path) -> list[str]:
    """A TSV's rows as lines; the header is `header_of`'s."""
    return [line for line in path.read_text(encoding="utf-8").split("\n")[1:] if line.strip()]


def header_of(path: Path) -> str:
    with open(path, encoding="utf-8") as f:
        return f.readline().rstrip("\n")


def read_squad(path: Path) -> list[dict]:
    """A SQuAD file's questions, each with its passage and where it came from."""
    data = json.loads(path.read_text(encoding="utf-8"))["data"]
    return [{"article": a, "title": article.get("title", ""), "paragraph": p, "context": para["context"], "qa": qa}
            for a, article in enumerate(data) for p, para in enumerate(article["paragraphs"]) for qa in para["qas"]]


def write_squad(items: list[dict], path: Path) -> None:
    """SQuAD v1.1 JSON of `items` (`read_squad`'s), grouped by article and passage again."""
    articles: dict = {}
    for item in items:
        title, paragraphs = articles.setdefault(item["article"], (item["title"], {}))
        paragraphs.setdefault(item["paragraph"], {"context": item["context"], "qas": []})["qas"].append(item["qa"])
    data = [{"title": title, "paragraphs": list(paragraphs.values())} for title, paragraphs in articles.values()]
    path.write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")


def read_items(task: Task, path: Path) -> list:
    """The examples of a file of the task's format that sampling draws from."""
    if task.kind == "tag":
        from tag import read_conll

        return read_conll(path)
    return read_squad(path) if task.kind == "qa" else read_lines(path)


def write_items(task: Task, items: list, path: Path, source: Path) -> Path:
    if task.kind == "tag":
        from tag import write_conll

        write_conll(path, items)
    elif task.kind == "qa":
        write_squad(items, path)
    else:
        path.write_text("\n".join([header_of(source), *items]) + "\n", encoding="utf-8")
    return path


def dev_file(task: Task, limit: int | None, work: Path) -> Path:
    """The dev file: the task's own, or its first N examples (the task's fixed slice, or
    `--limit-dev`, whichever is smaller) written to `work`."""
    source = DATA / task.dev
    first = min(n for n in (task.dev_first, limit) if n) if (task.dev_first or limit) else None
    if first is None:
        return source
    suffix = {"classify": ".tsv", "tag": ".txt", "qa": ".json"}[task.kind]
    return write_items(task, read_items(task, source)[:first], work / f"dev_{first}{suffix}", source)


# -- scoring (bertheads' own metric code) -----------------------------------------------------------
@dataclass
class Dev:
    """The dev set as the peers see it, and how predictions are scored."""

    path: Path
    inputs: list  # classify: texts or (text, pair); tag: (words, tags); qa: QAExample
    gold: list = field(default_factory=list)  # classify: label indices
    labels: list = field(default_factory=list)  # classify: the label names


def read_dev(task: Task, path: Path) -> Dev:
    if task.kind == "classify":
        texts, gold, labels = classify_rows(path)
        return Dev(path, texts, gold, labels)
    return Dev(path, read_items(task, path) if task.kind == "tag" else qa_examples(path))


def classify_rows(path: Path, labels: list | None = None) -> tuple[list, list[int], list]:
    """Texts (a (text, pair) tuple for pairs) and label indices of a GLUE TSV, as bertheads reads it."""
    from classify import read_split

    texts, pairs, gold, labels = read_split(path, labels)
    return (texts if pairs is None else list(zip(texts, pairs))), gold, labels


def qa_examples(path: Path) -> list:
    from bertheads.tasks.qa.formats import read_examples

    return read_examples(str(path))


def score(task: Task, dev: Dev, predicted: list) -> dict:
    """The task's metrics of `predicted` (label indices, tag lists or answers) on `dev`."""
    if task.kind == "classify":
        from bertheads.tasks.classify.metrics import label_metrics

        got = label_metrics(predicted, dev.gold, len(dev.labels))
        return {"accuracy": got["accuracy"], "f1": got["f1"], "mcc": got["mcc"],
                "one_class": len(set(predicted)) == 1}
    if task.kind == "tag":
        from bertheads.tasks.tag.scheme import entity_metrics

        got = entity_metrics([t for _, t in dev.inputs], predicted)
        return {k: got[k] for k in ("f1", "precision", "recall")}
    from bertheads.tasks.qa.metrics import squad_v1_scores

    got = squad_v1_scores(predicted, dev.inputs)
    return {"f1": got["f1"], "exact_match": got["exact_match"]}


