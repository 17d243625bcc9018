"""One settings schema: unknown names refused with a suggestion everywhere, config files that
hold every training setting, a saved model's config.yaml that trains it again, and the renamed
flags' old spellings."""

from __future__ import annotations

import json

import pytest
import yaml

import bertheads
from bertheads.base.errors import UserError
from bertheads.cli.main import main
from bertheads.cli.parser import build_parser
from bertheads.saved import bundle
from bertheads.tasks import TASKS
from bertheads.training import checkpoint, flags, tune
from bertheads.training.config import read_config, run_settings

ROWS = "sentence\tlabel\n" + "".join(f"a great movie {i}\t1\na boring movie {i}\t0\n" for i in range(8))


@pytest.fixture
def data(write):
    return write("t.tsv", ROWS)


# -- unknown names ------------------------------------------------------------------------
def test_python_train_refuses_a_typo_with_a_suggestion(data, tmp_path):
    with pytest.raises(UserError, match=r"^unknown setting 'max_lenght' \(did you mean 'max_length'\?\)$"):
        bertheads.train("classify", data, out=tmp_path / "m", max_lenght=8)
    with pytest.raises(UserError, match=r"unknown setting 'epoch' \(did you mean 'epochs'\?\)"):
        bertheads.train("classify", data, epoch=2)
    # a kind's own option is refused for another kind
    with pytest.raises(UserError, match=r"unknown setting 'text_column'"):
        bertheads.train("tag", data, text_column="sentence")


def test_train_multi_refuses_a_typo(tmp_path, write, data):
    config = write("c.yaml", f"tasks:\n  s: {{kind: classify, train: {data}}}\n")
    with pytest.raises(UserError, match=r"unknown setting 'lr_rate'"):
        bertheads.train_multi(config, tmp_path / "m", lr_rate=1e-3)
    with pytest.raises(UserError, match=r"unknown setting 'max_lenght' \(did you mean 'max_length'\?\)"):
        bertheads.train_multi(config, tmp_path / "m", max_lenght=8)


@pytest.mark.parametrize("text, message", [
    ("kind: classify\ntrain: t.tsv\nmax_lenght: 8\n", "c.yaml:3: max_lenght: unknown setting 'max_lenght' (did you "
                                                      "mean 'max_length'?)"),
    ("kind: classify\ntrain: t.tsv\nepochs: 0\n", "c.yaml:3: epochs: expected a positive integer"),
    ("kind: tag\ntrain: t.tsv\ntext_column: s\n", "c.yaml:3: text_column: unknown setting 'text_column'"),
    ("kind: classify\ntrain: t.tsv\ntasks: {}\n", "not both"),
    ("epochs: 2\n", "expected a mapping of head names"),
])
def test_config_errors_name_the_line(write, data, text, message):
    with pytest.raises(UserError) as info:
        read_config(write("c.yaml", text))
    assert message in str(info.value)


# -- config files ---------------------------------------------------------------------------
def test_a_config_holds_every_setting_yaml_and_toml(write, data, tmp_path):
    text = ("kind: classify\ntrain: t.tsv\ndev: t.tsv\nmodel: default\nepochs: 2\nlr: 1.0e-3\nseed: 7\n"
            "batch_size: 4\nmax_length: 32\nmode: features\nlayers: [-1, -2]\nlayer_combine: mean\n"
            "text_column: sentence\nlimit: 6\n")
    config = read_config(write("c.yaml", text))
    settings, run, options = run_settings(config, given={"epochs": 1})
    assert (settings.epochs, settings.lr, settings.seed, settings.batch_size) == (1, 1e-3, 7, 4)  # the flag wins
    assert run == {"model": "default"} and config.tasks[0].limit == 6 and config.single
    assert options == {"max_length": 32, "mode": "features", "layers": "-1,-2", "layer_combine": "mean",
                       "text_column": "sentence"}
    toml = ('kind = "classify"\ntrain = "t.tsv"\nepochs = 2\nseed = 7\n')
    config = read_config(write("c.toml", toml))
    assert config.training == {"epochs": 2, "seed": 7}
    with pytest.raises(UserError, match=r"c2.toml: epoch: unknown setting 'epoch' \(did you mean 'epochs'\?\)"):
        read_config(write("c2.toml", 'kind = "classify"\ntrain = "t.tsv"\nepoch = 2\n'))
    # the batch size is left to the kind's recipe (qa: batches of 16) unless the file or a flag says otherwise
    qa = read_config(write("q.yaml", "kind: qa\ntrain: t.tsv\n"))
    assert run_settings(qa)[0].batch_size is None and TASKS["qa"].parts.modeling.recipes[-1].batch_size == 16


def test_the_old_combine_key_is_read_with_a_warning(write, data, capsys):
    config = read_config(write("c.yaml", "kind: classify\ntrain: t.tsv\ncombine: mean\n"))
    assert config.options == {"layer_combine": "mean"}
    assert "'combine' is deprecated; use 'layer_combine'" in capsys.readouterr().err


# -- a model says how it was made; its config trains it again ------------------------------------
def test_a_saved_config_trains_the_same_model_again(tiny_bert, data, tmp_path, capsys):
    first, again, shorter = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    assert main(["train", "classify", "--train", data, "--dev", data, "--out", str(first), "--model", tiny_bert,
                 "--epochs", "2", "--batch-size", "4", "--lr", "1e-3", "--seed", "7", "--max-length", "24",
                 "--no-progress", "-q"]) == 0
    manifest = bundle.read_manifest(first)
    assert set(manifest["made_with"]) >= {"bertheads", "torch", "transformers"}
    saved = yaml.safe_load((first / "config.yaml").read_text())
    assert saved["kind"] == "classify" and saved["train"] == str(tmp_path / "t.tsv")
    assert (saved["epochs"], saved["batch_size"], saved["lr"], saved["seed"], saved["max_length"]) == (2, 4, 1e-3, 7, 24)
    assert saved["model"] == tiny_bert and "resume" not in saved and saved["made_with"] == manifest["made_with"]
    assert {k: v for k, v in saved.items() if k not in ("made_with", "chosen")} == manifest["settings"]
    assert saved["chosen"] == manifest["chosen"] and "batch 4 (given)" in saved["chosen"]

    assert main(["train", "--config", str(first / "config.yaml"), "--out", str(again), "--no-progress", "-q"]) == 0
    assert bundle.read_manifest(again)["settings"] == manifest["settings"]
    metrics = [json.loads((d / "metrics.json").read_text())["dev"] for d in (first, again)]
    assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], rel=1e-5)
    assert {k: v for k, v in metrics[0].items() if k != "loss"} == {k: v for k, v in metrics[1].items() if k != "loss"}

    # flags given override the file; `train KIND --config` takes the same file
    assert main(["train", "classify", "--config", str(first / "config.yaml"), "--out", str(shorter), "--epochs", "1",
                 "--no-progress", "-q"]) == 0
    assert bundle.read_manifest(shorter)["settings"]["epochs"] == 1
    assert main(["train", "tag", "--config", str(first / "config.yaml"), "--out", str(tmp_path / "x")]) == 2
    assert "not a tag task" in capsys.readouterr().err


def test_train_needs_a_kind_or_a_config(capsys):
    assert main(["train", "--out", "x"]) == 2
    assert "give a task kind" in capsys.readouterr().err
    assert main(["train", "classify", "--out", "x"]) == 2
    assert "required: --train" in capsys.readouterr().err


# -- renamed flags ------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, dest, value, old, new", [
    (["extract", "--out", "x", "--format", "npy"], "output_format", "npy", "--format", "--output-format"),
    (["extract", "--out", "x", "--pool", "cls"], "vector_pool", "cls", "--pool", "--vector-pool"),
    (["extract", "--out", "x", "--combine", "sum"], "layer_combine", "sum", "--combine", "--layer-combine"),
    (["train", "classify", "--train", "t", "--out", "o", "--combine", "mean"], "layer_combine", "mean", "--combine",
     "--layer-combine"),
    (["tune", "classify", "--train", "t", "--dev", "d", "--out", "o", "--combine", "sum"], "layer_combine", "sum",
     "--combine", "--layer-combine"),
])
def test_old_flag_spellings_still_work_with_one_warning(argv, dest, value, old, new, capsys):
    args = build_parser().parse_args(argv)
    assert getattr(args, dest) == value
    assert capsys.readouterr().err == f"bertheads: warning: {old} is deprecated; use {new}\n"
    args = build_parser().parse_args([new if a == old else a for a in argv])
    assert getattr(args, dest) == value and capsys.readouterr().err == ""


# -- derived lists --------------------------------------------------------------------------------
def test_what_is_derived_stays_what_it_was():
    # a resume compares the same settings as before (checkpoints of earlier versions still resume)
    assert set(checkpoint.NOT_COMPARED) == {"progress", "resume", "overwrite", "save_every", "log_every",
                                            "tensorboard", "eval_batch_size", "track", "track_uri",
                                            "track_experiment", "device", "verbose", "license", "time_budget"}
    assert set(tune.TRAINING_FLAGS) == {"lr", "batch_size", "epochs", "warmup_ratio", "weight_decay"}
    assert set(tune.WHERE_NOT_WHAT) == {"cache_dir", "cache_max_gb"}
    assert set(tune.searchable("classify")) >= {"lr", "mode", "max_length", "layers", "layer_combine", "text_column"}
    assert not set(tune.searchable("classify")) & {"seed", "cache_dir", "cache_dtype", "model", "limit"}
    assert flags.task_class is bundle.task_class
    assert flags.kind_defaults("qa")["max_length"] == 384 and flags.kind_defaults("tag")["max_length"] == 128


def test_train_kind_with_a_settings_file_and_its_data_on_the_command_line(tiny_bert, data, write, tmp_path):
    config = write("s.yaml", "epochs: 1\nmax_length: 16\nbatch_size: 8\nlayer_combine: mean\n")
    out = tmp_path / "m"
    assert main(["train", "classify", "--config", config, "--train", data, "--out", str(out), "--model", tiny_bert,
                 "--no-progress", "-q"]) == 0
    settings = bundle.read_manifest(out)["settings"]
    assert (settings["epochs"], settings["max_length"], settings["batch_size"]) == (1, 16, 8)
    assert settings["train"] == data and settings["layer_combine"] == "mean" and settings["lr"] == 5e-5
    assert bertheads.load(out).task().spec.max_length == 16


@pytest.mark.parametrize("argv, hint", [
    (["train", "classify", "--train", "t", "--out", "o", "--max-lenght", "8"], "--max-lenght: did you mean --max-length?"),
    (["predict", "m", "--treshold", "0.3"], "--treshold: did you mean --threshold?"),
])
def test_an_unknown_flag_is_refused_with_the_closest_one(argv, hint, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "unrecognized arguments" in err[0] and hint in err[0], err


def test_python_train_takes_the_kinds_own_defaults(monkeypatch):
    """`bertheads.train("qa", ...)` leaves the batch size to the kind's recipe, as `bertheads train qa`
    does, unless it is given."""
    import bertheads.api as api

    seen = {}

    def fake_train_tasks(config, out, model, settings, *rest, **kw):
        seen["settings"] = settings
        raise RuntimeError("stop")

    monkeypatch.setattr(api, "train_tasks", fake_train_tasks)
    for kind, given, batch in (("qa", {}, None), ("classify", {}, None), ("qa", {"batch_size": 4}, 4)):
        with pytest.raises(RuntimeError):
            api.train(kind, "train.json", **given)
        assert seen["settings"].batch_size == batch, kind


# -- one field, every face ---------------------------------------------------------------------
def test_a_new_setting_is_a_flag_a_config_field_and_a_keyword(tiny_bert, data, write, tmp_path):
    """A field added to one dataclass (a kind's spec) is a `train` flag, a config field, a
    keyword of `train(...)`, saved with the head, and (with `at`) an override flag of predict."""
    from dataclasses import dataclass

    from bertheads.base.schema import setting
    from bertheads.tasks import register, unregister
    from bertheads.tasks.classify.spec import ClassifySpec
    from bertheads.tasks.classify.task import ClassifyTask

    @dataclass
    class ColourSpec(ClassifySpec):
        colour: str = setting("red", "what colour the head is", choices=("red", "blue"), at=("predict",))

    class ColourTask(ClassifyTask):
        kind, spec_type, help = "colour", ColourSpec, "classify, in colour"

    register(ColourTask)
    try:
        args = build_parser().parse_args(["train", "colour", "--train", data, "--out", "o", "--colour", "blue"])
        assert args.colour == "blue"
        assert read_config(write("c.yaml", "kind: colour\ntrain: t.tsv\ncolour: blue\n")).options["colour"] == "blue"
        with pytest.raises(UserError, match=r"c2.yaml:3: colour: expected one of red, blue, got 'green'"):
            read_config(write("c2.yaml", "kind: colour\ntrain: t.tsv\ncolour: green\n"))
        with pytest.raises(UserError, match=r"unknown setting 'colur' \(did you mean 'colour'\?\)"):
            bertheads.train("colour", data, colur="blue")
        bertheads.train("colour", data, out=tmp_path / "m", model=tiny_bert, colour="blue", epochs=1, batch_size=8,
                        progress=False)
        assert bertheads.load(tmp_path / "m").task().spec.colour == "blue"
        assert build_parser().parse_args(["predict", "m", "--colour", "red"]).colour == "red"
        assert "--colour" not in build_parser()._subparsers._group_actions[0].choices["evaluate"].format_help()
    finally:
        unregister("colour")
