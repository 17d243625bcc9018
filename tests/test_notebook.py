"""The Python API as a notebook user and a deployer meet it: one input in gives one prediction
out for every input form, `Model.labels` per head, errors naming the keyword the caller wrote,
and the small frictions of tables without a header, TSVs given to the tagger, the card's licence
and `export -q`."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path

import pytest
import tomllib

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main

FAST = dict(epochs=1, batch_size=8, progress=False)
GOOD = ["a wonderful film", "great acting and a fine story", "I loved it", "superb and moving"]
BAD = ["a dull film", "terrible acting and a weak story", "I hated it", "boring and flat"]


def sentiment_tsv(n: int = 16, header: bool = True) -> str:
    rows = [f"{(GOOD if i % 2 else BAD)[i % 4]}\t{'pos' if i % 2 else 'neg'}" for i in range(n)]
    return ("sentence\tlabel\n" if header else "") + "\n".join(rows) + "\n"


@pytest.fixture(scope="module")
def classifier(tiny_bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("nb")
    (root / "train.tsv").write_text(sentiment_tsv())
    return bertheads.train("classify", str(root / "train.tsv"), str(root / "train.tsv"), root / "model",
                           model=tiny_bert, **FAST)


# -- the pipeline's habits ----------------------------------------------------------------
def test_one_string_gives_one_prediction(classifier):
    one = classifier.predict("a wonderful film")
    assert isinstance(one, dict) and one["label"] in ("neg", "pos")
    assert classifier.predict(["a wonderful film"]) == [one]
    assert bertheads.predict(classifier, "a wonderful film") == one


def test_one_pair_and_one_question_give_one_prediction(tiny_bert, tmp_path):
    rows = [{"text": GOOD[i % 4], "text_b": BAD[i % 4], "label": i % 2} for i in range(12)]
    pairs = bertheads.train("classify", rows, rows, None, model=tiny_bert, **FAST)
    assert pairs.task().reading.form.name == "pair"
    one = pairs.predict(("a wonderful film", "a dull film"))
    assert isinstance(one, dict) and "label" in one
    assert pairs.predict([("a wonderful film", "a dull film")]) == [one]
    context = "The capital is Paris. Rivers run through it."
    squad = {"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": [{"id": f"q{i}", "question": "What is the capital?",
                                      "answers": [{"text": "Paris", "answer_start": context.index("Paris")}]}]}
        for i in range(4)]}]}
    (tmp_path / "train.json").write_text(json.dumps(squad))
    qa = bertheads.train("qa", str(tmp_path / "train.json"), None, None, model=tiny_bert, max_length=64, stride=16,
                         max_question_length=16, **FAST)
    answer = qa.predict({"question": "What is the capital?", "context": context})
    assert isinstance(answer, dict) and "answer" in answer
    assert qa.predict(("What is the capital?", context)) == answer


def test_labels_and_id2label_per_head(classifier):
    assert classifier.labels == {"classify": ["neg", "pos"]}
    assert classifier.id2label == {"classify": {0: "neg", 1: "pos"}}


def test_python_errors_name_the_keyword(classifier, tiny_bert, tmp_path, capsys):
    (tmp_path / "t.tsv").write_text("sentence\tstars\ngood\t1\n")
    with pytest.raises(UserError, match=r"no label column found .*name one with label_column=; if the first line is data"):
        bertheads.train("classify", str(tmp_path / "t.tsv"), None, None, model=tiny_bert, **FAST)
    # the same mistake on the command line names the flag
    code = main(["train", "classify", "--train", str(tmp_path / "t.tsv"), "--out", str(tmp_path / "m"),
                 "--model", tiny_bert, "--epochs", "1"])
    assert code == 2 and "name one with --label-column" in capsys.readouterr().err



def test_settings_errors_name_the_keyword_from_python_and_the_flag_from_the_cli(classifier, tmp_path, capsys):
    from bertheads.serve.settings import ServeSettings
    from bertheads.training import tune

    data = str(classifier.directory.parent / "train.tsv")
    space = tmp_path / "space.yaml"
    space.write_text("lr: {low: 1.0e-5, high: 1.0e-4, log: true}\n")
    with pytest.raises(UserError, match=r"^max_queue=: expected a positive integer, got 0$"):
        ServeSettings(max_queue=0).check()
    with pytest.raises(UserError, match=r"^host='0\.0\.0\.0' is not a loopback address: give token= .* or "
                                        r"insecure=True to serve without one$"):
        ServeSettings().check("0.0.0.0")
    with pytest.raises(UserError, match=r"^tune needs dev=: trials are compared on it$"):
        tune.tune("classify", data, "", tmp_path / "t")
    with pytest.raises(UserError, match=r"space\.yaml: a space with ranges needs trials= \(a grid"):
        tune.tune("classify", data, data, tmp_path / "t", search=tune.TuneSettings(space=str(space)))
    with pytest.raises(UserError, match=r"^precision='int8' needs runtime='onnx' or openvino"):
        bertheads.load(classifier.directory, runtime="torch", precision="int8")
    # the same mistakes on the command line name the flags
    capsys.readouterr()
    for args, said in [(["serve", str(classifier.directory), "--host", "0.0.0.0"],
                        "--host 0.0.0.0 is not a loopback address: give --token (or set BERTHEADS_TOKEN) so that "
                        "clients must authenticate, or --insecure to serve without one"),
                       (["tune", "classify", "--train", data, "--dev", data, "--out", str(tmp_path / "t"),
                         "--space", str(space)], "a space with ranges needs --trials (a grid"),
                       (["predict", str(classifier.directory), "--runtime", "torch", "--precision", "int8"],
                        "--precision int8 needs --runtime onnx or openvino")]:
        assert main(args) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err


def test_no_library_message_names_a_flag_literally():
    """Every error, warning and log line outside the command line's own modules names a setting
    through `said`, so Python callers read `name=` and the command line `--name`. Text in
    backticks is a command to run (`bertheads export DIR --to onnx`), said as such."""
    import ast

    src = Path(bertheads.__file__).parent
    flag = re.compile(r"(?<![\w-])--[a-z][a-z-]*")
    commands = ("export --to onnx",)  # require()'s name for the export command itself
    found = []
    for path in sorted(src.rglob("*.py")):
        if path.relative_to(src).parts[0] == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if name not in ("UserError", "NoEvidence", "require", "warn", "say", "warning", "info", "debug", "write"):
                continue
            text = "".join(n.value for a in node.args for n in ast.walk(a)
                           if isinstance(n, ast.Constant) and isinstance(n.value, str))
            for command in commands:
                text = text.replace(command, "")
            found += [f"{path.relative_to(src)}:{node.lineno}: {m}" for m in flag.findall(re.sub(r"`[^`]*`", "", text))]
    assert not found, found

# -- small frictions ----------------------------------------------------------------------
def test_a_table_without_header_says_add_a_header_row_or_no_header(tiny_bert, tmp_path, capsys):
    (tmp_path / "t.tsv").write_text(sentiment_tsv(header=False))
    with pytest.raises(UserError, match=r"^.*t.tsv:1: no text column found \(columns: a dull film, neg\); .*"
                                        r"add a header row \(e\.g\. sentence<TAB>label\) or give header=False$"):
        bertheads.train("classify", str(tmp_path / "t.tsv"), None, None, model=tiny_bert, **FAST)
    code = main(["train", "classify", "--train", str(tmp_path / "t.tsv"), "--out", str(tmp_path / "m"),
                 "--model", tiny_bert, "--epochs", "1", "-q"])
    assert code == 2 and capsys.readouterr().err.rstrip().endswith("or give --no-header")
    # --no-header reads the first line as data: text, label
    code = main(["train", "classify", "--train", str(tmp_path / "t.tsv"), "--out", str(tmp_path / "m"),
                 "--model", tiny_bert, "--epochs", "1", "-q", "--no-header"])
    assert code == 0, capsys.readouterr().err
    model = bertheads.load(tmp_path / "m")
    assert model.labels == {"classify": ["neg", "pos"]} and model.task().spec.header is False
    metrics = model.evaluate(str(tmp_path / "t.tsv"))
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["loss"] > 0  # 16 rows read, none a header
    model = bertheads.train("classify", str(tmp_path / "t.tsv"), None, None, model=tiny_bert, header=False, **FAST)
    assert model.labels == {"classify": ["neg", "pos"]}


def test_train_tag_on_a_tsv_says_it_is_no_conll(tiny_bert, tmp_path):
    for name, text in [("rows.tsv", sentiment_tsv(header=False)), ("header.tsv", sentiment_tsv())]:
        (tmp_path / name).write_text(text)
        with pytest.raises(UserError, match=rf"{name}:1: this looks like a TSV table .*not CoNLL \(one word and"):
            bertheads.train("tag", str(tmp_path / name), None, None, model=tiny_bert, **FAST)
    (tmp_path / "bad.conll").write_text("EU\tORG\n")  # a CoNLL file's bad tag is still said as such
    with pytest.raises(UserError, match="tag 'ORG' is outside the tagging scheme"):
        bertheads.train("tag", str(tmp_path / "bad.conll"), None, None, model=tiny_bert, **FAST)


def test_the_card_declares_the_license_given_else_none(classifier, tiny_bert, tmp_path):
    card = (classifier.directory / "README.md").read_text()
    assert "\nlicense: other\n" in card and "apache-2.0" not in card.split("---")[1]
    assert "no license declared (give one with `license`)" in card
    (tmp_path / "t.tsv").write_text(sentiment_tsv())
    bertheads.train("classify", str(tmp_path / "t.tsv"), None, tmp_path / "m", model=tiny_bert, license="cc-by-4.0",
                    **FAST)
    card = (tmp_path / "m" / "README.md").read_text()
    assert "\nlicense: cc-by-4.0\n" in card and "declared license: cc-by-4.0" in card


def test_make_demo_installs_what_the_readme_python_imports():
    """`make demo` installs `.[demo]`: every module the README's Python examples import is in it."""
    root = Path(__file__).resolve().parents[1]
    assert "-e '.[demo]'" in (root / "Makefile").read_text()
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]

    def requirements(extra: str) -> set[str]:
        out = set()
        for req in extras[extra]:
            name = re.split(r"[<>=\[; ]", req, maxsplit=1)[0]
            if name == "bertheads":
                for inner in req[req.index("[") + 1:req.index("]")].split(","):
                    out |= requirements(inner)
            else:
                out.add(name.lower())
        return out

    installed = requirements("demo") | {re.split(r"[<>=; ]", r, maxsplit=1)[0].lower() for r in project["dependencies"]}
    blocks = re.findall(r"```python\n(.*?)```", (root / "README.md").read_text(), re.S)
    imported = {m for b in blocks for m in re.findall(r"^\s*(?:import|from) (\w+)", b, re.M)}
    assert "pandas" in imported
    assert imported - {"bertheads"} <= installed, imported - installed


def test_export_quiet_prints_nothing_from_other_libraries(classifier, tmp_path, capfd):
    capfd.readouterr()
    assert main(["export", str(classifier.directory), "--to", "hf", "--out", str(tmp_path / "hf"), "-q"]) == 0
    out, err = capfd.readouterr()
    assert err == "", err  # transformers' "Writing model shards" bar, among others
    assert (tmp_path / "hf").is_dir()


# -- MLflow's python_function flavour, with the real mlflow -------------------------------
def test_a_saved_and_logged_model_loads_with_mlflow_pyfunc(classifier, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    pd = pytest.importorskip("pandas")
    from mlflow.tracking import MlflowClient

    texts = ["a wonderful film", "a dull film"]
    expected = classifier.predict(texts)
    local = mlflow.pyfunc.load_model(str(classifier.directory))  # the directory itself is an MLflow model
    assert local.predict(texts) == expected
    # logged to a run (as --track mlflow logs it), then loaded as the registry and `mlflow models serve` do
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("nb", artifact_location=str(tmp_path / "artifacts")))
    client.log_artifacts(run.info.run_id, str(classifier.directory), artifact_path="model")
    mlflow.set_tracking_uri(uri)
    try:
        logged = mlflow.pyfunc.load_model(f"runs:/{run.info.run_id}/model")
    finally:
        mlflow.set_tracking_uri(None)
    assert logged.predict(texts) == expected
    frame = logged.predict(pd.DataFrame({"sentence": texts}))
    assert list(frame["label"]) == [p["label"] for p in expected]
    assert logged.predict({"text": texts}) == expected
    # what `mlflow models serve` runs for POST /invocations: its loader, then its JSON bodies
    from mlflow.pyfunc import scoring_server

    served = scoring_server.load_model(str(classifier.directory))
    for body in ({"inputs": texts}, {"dataframe_records": [{"text": t} for t in texts]}):
        answer = scoring_server.invocations(json.dumps(body), "application/json", served, None)
        assert answer.status == 200, answer.response
        labels = [p["label"] for p in json.loads(answer.response)["predictions"]]
        assert labels == [p["label"] for p in expected]



def test_mlflow_scoring_server_serves_a_model_on_loopback(classifier, monkeypatch):
    """What `mlflow models serve -m DIR --env-manager local` runs (uvicorn on
    `mlflow.pyfunc.scoring_server.app`: `init(load_model_with_mlflow_config(DIR))`), started
    here in the test's process on 127.0.0.1 (the command itself takes about 15 s to start on two
    cores: two fresh Pythons importing torch). `params` reach the model: its MLmodel declares them."""
    pytest.importorskip("mlflow")
    import socket
    import threading
    import time
    import urllib.error
    import urllib.request

    import uvicorn
    from mlflow.pyfunc import scoring_server

    monkeypatch.setenv("_MLFLOW_IS_IN_SERVING_ENVIRONMENT", "")  # init sets it; put back afterwards
    app = scoring_server.init(scoring_server.load_model_with_mlflow_config(str(classifier.directory)))
    texts = ["a wonderful film", "a dull film"]
    expected = classifier.predict(texts)

    def post(url: str, body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(url + "/invocations", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive():
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}"
        assert urllib.request.urlopen(url + "/ping", timeout=10).status == 200
        for body in ({"inputs": texts}, {"dataframe_split": {"columns": ["text"], "data": [[t] for t in texts]}},
                     {"inputs": texts, "params": {"head": "classify", "calibrate": True}}):
            status, answer = post(url, body)
            assert status == 200 and answer["predictions"] == expected, (body, answer)
        status, answer = post(url, {"inputs": texts, "params": {"head": "nope"}})
        assert status == 400 and "no head named 'nope'" in json.dumps(answer), answer  # (its stack_trace)
    finally:
        server.should_exit = True
        thread.join(10)

# -- progress from Python -----------------------------------------------------------------
SCRIPT = """
import json, sys
import bertheads
steps, evaluations = [], []
loud = sys.argv[4] == "loud"
model = bertheads.train("classify", sys.argv[1], sys.argv[1], sys.argv[2] if loud else None, model=sys.argv[3],
                        epochs=2, batch_size=4, verbose=loud,
                        on_step=lambda step, loss: steps.append((step, loss)),
                        on_evaluate=lambda epoch, dev: evaluations.append((epoch, dev["classify"]["accuracy"])))
metrics = model.evaluate(sys.argv[1])
print(json.dumps({"steps": steps, "evaluations": evaluations, "mode": metrics.get("mode")}))
"""



class Terminal(io.StringIO):
    """stderr as a terminal shows it: tqdm draws its bars here."""

    def isatty(self) -> bool:
        return True


def test_evaluate_shows_a_bar_of_lines_and_one_of_each_chunk(classifier, tmp_path, monkeypatch):
    from bertheads.inference.stream import StreamSettings

    (tmp_path / "dev.tsv").write_text(sentiment_tsv(20))
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    metrics = classifier.evaluate(str(tmp_path / "dev.tsv"), settings=StreamSettings(chunk_size=12))
    shown = screen.getvalue()
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert re.search(r"evaluate: +0%.*0/21 ", shown), shown  # the file's lines, its header included
    assert re.search(r"chunk 1: +0%.*0/12 ", shown) and re.search(r"chunk 2: +0%.*0/8 ", shown), shown

@pytest.fixture(scope="module")
def forks(tmp_path_factory):
    """Script processes forked from one that imported everything (tests/forkserver.py)."""
    from forkserver import ForkServer

    server = ForkServer(tmp_path_factory.mktemp("forks"))
    yield server
    server.close()


@pytest.mark.slow  # a Python process of its own each (as a script user runs it)
@pytest.mark.parametrize("loudness", ["loud", "quiet"])
def test_a_script_hears_progress_and_callbacks_see_every_step(tiny_bert, tmp_path, loudness, forks):
    (tmp_path / "t.tsv").write_text(sentiment_tsv())
    done = forks.run_script(SCRIPT, [tmp_path / "t.tsv", tmp_path / "m", tiny_bert, loudness])
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert [s for s, _ in result["steps"]] == list(range(1, 9))  # 16 rows, batches of 4, 2 epochs
    assert [e for e, _ in result["evaluations"]] == [1, 2]
    if loudness == "loud":  # saved and loaded: evaluate says the mode; stderr is a pipe: lines with an ETA
        assert result["mode"] == "torch fp32 on cpu"
        assert re.search(r"^bertheads: epoch 1/2: batch 4/4, loss=[\d.]+, ex_s=[\d.]+, [\d.]+ s, ETA 0 s$",
                         done.stderr, re.M), done.stderr
        assert re.search(r"^bertheads: epoch 2: classify: accuracy=", done.stderr, re.M)
    else:  # warnings only (a tiny model learns nothing: that one is said)
        lines = [line for line in done.stderr.splitlines() if line.startswith("bertheads:")]
        assert all(line.startswith("bertheads: warning:") for line in lines), done.stderr
