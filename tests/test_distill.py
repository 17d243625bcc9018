"""`distill`: a student of a tiny teacher learns its scores (classify, tag, multi-head), the
teacher's scores are kept in the cache, the student is a normal model folder."""

import json
from pathlib import Path

import numpy as np
import pytest

import bertheads
from bertheads.cli.main import main
from bertheads.text.encoding import collate
from bertheads.training import distill as distill_module

FAST = dict(epochs=8, batch_size=8, lr=3e-3, progress=False)
GOOD = ["great", "wonderful", "superb", "lovely"]
BAD = ["awful", "boring", "terrible", "dreadful"]


def sentences(n: int, offset: int = 0) -> list[tuple[str, int]]:
    rows = []
    for i in range(offset, offset + n):
        rows.append((f"a {GOOD[i % 4]} movie", 1))
        rows.append((f"a {BAD[i % 4]} movie", 0))
    return rows


@pytest.fixture(scope="module")
def teacher(tiny_bert, tmp_path_factory):
    """A tiny classify teacher trained for a few steps, and unlabelled and labelled files."""
    d = tmp_path_factory.mktemp("distill")
    (d / "train.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in sentences(24)))
    (d / "pool.txt").write_text("".join(f"{t}\n" for t, _ in sentences(12, offset=100)))
    bertheads.train("classify", str(d / "train.tsv"), str(d / "train.tsv"), d / "teacher", model=tiny_bert,
                    settings=bertheads.TrainSettings(**FAST))
    return d


def counting(monkeypatch) -> list:
    """The teacher's passes, counted."""
    calls = []
    real = distill_module.run_heads

    def run_heads(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(distill_module, "run_heads", run_heads)
    return calls


def agreement(a, b, texts) -> float:
    return float(np.mean([p["label"] == q["label"] for p, q in zip(a.predict(texts), b.predict(texts))]))


def test_classify_student_agrees_with_its_teacher_and_is_a_normal_model_folder(teacher, tiny_bert,
                                                                                     monkeypatch, tmp_path):
    d = teacher
    passes = counting(monkeypatch)
    before = {p.name: p.stat().st_mtime_ns for p in (d / "teacher").rglob("*")}
    student = bertheads.distill(d / "teacher", tmp_path / "student", data=str(d / "pool.txt"),
                                train=str(d / "train.tsv"), dev=str(d / "train.tsv"), model=tiny_bert,
                                **{**FAST, "epochs": 5})
    assert len(passes) == 2  # the unlabelled file and the labelled one, once each
    tutor = bertheads.load(d / "teacher")
    held = [f"this {w} story" for w in GOOD + BAD] + [t for t, _ in sentences(6)]
    assert agreement(student, tutor, held) >= 0.85
    metrics = json.loads((tmp_path / "student" / "metrics.json").read_text())
    assert metrics["dev"]["accuracy"] >= 0.9
    manifest = json.loads((tmp_path / "student" / "bertheads.json").read_text())
    assert manifest["distilled_from"]["heads"] == {"classify": "classify"}
    assert (tmp_path / "student" / "README.md").is_file() and (tmp_path / "student" / "config.yaml").is_file()
    assert student.net.tasks["classify"].spec.temperature is not None or "calibration" in metrics["dev"]
    # the teacher folder is read, never written
    assert {p.name: p.stat().st_mtime_ns for p in (d / "teacher").rglob("*")} == before


def test_classify_from_the_command_line_and_a_config_file(teacher, tiny_bert, tmp_path, capsys):
    d = teacher
    config = tmp_path / "distill.yaml"
    config.write_text(f"teacher: {d / 'teacher'}\ndata: {d / 'pool.txt'}\nmodel: {tiny_bert}\nepochs: 1\n"
                      f"batch_size: 8\nlr: 0.003\nsoft_weight: 1.0\n")
    assert main(["distill", "--config", str(config), "--out", str(tmp_path / "s"), "--epochs", "2",
                 "--no-progress"]) == 0
    record = json.loads((tmp_path / "s" / "bertheads.json").read_text())
    assert record["settings"]["epochs"] == 2 and record["settings"]["soft_weight"] == 1.0
    json.loads((tmp_path / "s" / "metrics.json").read_text())
    config.write_text(f"teacher: {d / 'teacher'}\ndata: {d / 'pool.txt'}\nsoft_wieght: 1\n")
    assert main(["distill", "--config", str(config), "--out", str(tmp_path / "t")]) != 0
    assert "soft_weight" in capsys.readouterr().err
    assert main(["distill", str(tmp_path / "nothing"), "--data", str(d / "pool.txt"), "--out",
                 str(tmp_path / "u")]) != 0
    assert not Path(tmp_path / "u").exists()


PEOPLE = ["Merkel", "Smith", "Garcia", "Yeltsin"]
PLACES = ["Paris", "Berlin", "Madrid", "Moscow"]


def tagged(n: int, offset: int = 0) -> list[list[tuple[str, str]]]:
    out = []
    for i in range(offset, offset + n):
        out.append([("Mr", "O"), (PEOPLE[i % 4], "B-PER"), ("visited", "O"), (PLACES[(i // 4) % 4], "B-LOC"),
                    ("on", "O"), ("Monday", "O")])
    return out


def test_every_head_of_a_multi_head_teacher_from_one_pass_and_a_second_student_from_the_cache(
        teacher, tiny_bert, monkeypatch, tmp_path):
    """A classify head and a tag head on one encoder (combined from two models on the frozen
    tiny BERT) teach one student: one teacher pass for both; the next student reads the cache."""
    d = teacher
    conll = "\n\n".join("\n".join(f"{w} {t}" for w, t in s) for s in tagged(32)) + "\n"
    (tmp_path / "tags.txt").write_text(conll)
    features = dict(FAST, lr=1e-2, epochs=12)
    bertheads.train("classify", str(d / "train.tsv"), None, tmp_path / "c", model=tiny_bert, mode="features",
                    settings=bertheads.TrainSettings(**features))
    bertheads.train("tag", str(tmp_path / "tags.txt"), None, tmp_path / "t", model=tiny_bert, mode="features",
                    settings=bertheads.TrainSettings(**features))
    two = bertheads.combine([tmp_path / "c", tmp_path / "t"], tmp_path / "two", names=["sentiment", "ner"])
    texts = [" ".join(w for w, _ in s) for s in tagged(16, offset=40)] + [t for t, _ in sentences(8)]
    (tmp_path / "pool.txt").write_text("".join(f"{t}\n" for t in texts))
    passes = counting(monkeypatch)
    student = bertheads.distill(tmp_path / "two", tmp_path / "student", data=str(tmp_path / "pool.txt"),
                                model=tiny_bert, **{**FAST, "epochs": 6})
    assert passes == [["sentiment", "ner"]]  # one encoder pass for both heads
    assert student.heads == {"sentiment": "classify", "ner": "tag"}
    words = [t.split() for t in texts]
    taught, learnt = ([t for p in m.predict(words, head="ner") for t in p["tags"]] for m in (two, student))
    assert 0 < taught.count("O") < 0.75 * len(taught)  # the teacher finds entities (and not everywhere)
    assert np.mean([a == b for a, b in zip(taught, learnt)]) >= 0.85  # above the 'O' share
    # a second student (other settings) costs no teacher pass
    bertheads.distill(tmp_path / "two", tmp_path / "second", data=str(tmp_path / "pool.txt"), model=tiny_bert,
                      soft_temperature=1.0, **{**FAST, "epochs": 1})
    assert len(passes) == 1


def test_qa_targets_follow_the_teachers_characters_into_the_students_own_windows(tiny_bert):
    """A teacher reading a passage in one window and a student reading it in short overlapping
    ones: the student's window holding the answer points where the teacher does (the same
    characters), the others at [CLS]; the loss is least at the teacher's scores."""
    import torch

    from bertheads.encoder.pretrained import Encoder
    from bertheads.tasks.parts import Distilling
    from bertheads.tasks.qa.spec import QASpec
    from bertheads.tasks.qa.task import QATask

    encoder = Encoder.load(tiny_bert)
    tutor = QATask.build(QASpec(max_length=160, stride=32), encoder)
    context = " ".join(f"word{i}" for i in range(30)) + " the answer is Berlin in Germany . " + \
        " ".join(f"tail{i}" for i in range(20))
    examples = tutor.reading.from_inputs([{"question": "where is it?", "context": context}])
    features, owner = tutor.modeling.encode_for_inference(examples, encoder.tokenizer)
    assert len(features) == 1
    start = context.index("Berlin")
    offsets = features[0]["_offsets"]
    c0, c1 = features[0]["_context"]
    at = next(i for i in range(c0, c1 + 1) if offsets[i][0] == start)
    outputs = [np.zeros((len(features[0]["input_ids"]), 2), dtype=np.float32)]
    outputs[0][at] = 9.0  # the teacher is sure: "Berlin" starts and ends the answer
    scores = Distilling.of(tutor).teacher_scores(outputs, owner, examples, features)

    student = QATask(QASpec(max_length=32, stride=8, paragraph_windows=False), None)
    taught = Distilling.of(student).soft_targets(examples, scores, encoder.tokenizer, with_labels=False)
    assert len(taught) > 2
    pointed = []
    for f in taught:
        best = f["soft_tok_spans"].argmax(0)
        pointed.append(tuple(int(f["_offsets"][b][side]) if b else None for b, side in zip(best, (0, 1))))
    assert (start, start + len("Berlin")) in pointed
    assert sum(p == (None, None) for p in pointed) >= len(taught) - 2  # the windows without it: [CLS]
    student = QATask.build(student.spec, encoder)
    batch = collate(taught, 0)
    close = torch.as_tensor(batch["soft_tok_spans"])
    near = Distilling.of(student).loss(close, batch, 1.0, 1.0)
    far = Distilling.of(student).loss(torch.zeros_like(close), batch, 1.0, 1.0)
    assert float(near) < 0.05 < float(far)
