"""The command line's own settings: what a command reads and writes (files, directories, the
head it names) and how loud it is. Every flag of `bertheads` is a field of a dataclass, here
or in the library (training, runtime, stream, serve and extract settings, each kind's spec);
`cli/parser.py` builds the parsers from them."""

from __future__ import annotations

from dataclasses import dataclass

from bertheads.base.schema import setting

DATA_FORMATS_DOC = "docs/classify.md, docs/tag.md, docs/qa.md"


@dataclass
class Verbosity:
    verbose: bool = setting(False, "more messages (debug level)", short="-v", exclusive="verbosity")
    quiet: bool = setting(False, "only warnings and errors", short="-q", exclusive="verbosity")


@dataclass
class SavedModel:
    """A command that reads one saved model."""

    model_dir: str = setting(help="a model directory written by `bertheads train` (or `tune`, `combine`)",
                             positional=True)


@dataclass
class Head:
    head: str | None = setting(None, "which head, for a model with several (export --to hf: the head to write)")


@dataclass
class AsJson:
    json: bool = setting(False, "one JSON object on stdout")


# -- train and tune ------------------------------------------------------------------------------
@dataclass
class TrainRun:
    """`bertheads train --config F` (no kind: the file names it)."""

    config: str | None = setting(None, "YAML (or TOML) holding the run's task(s) and settings (docs/multi.md); a "
                                       "saved model's DIR/config.yaml re-runs it")
    out: str | None = setting(None, "model directory to write (replaced atomically)")


@dataclass
class TrainFiles:
    """`bertheads train KIND`."""

    train: str | None = setting(None, f"training file (formats: {DATA_FORMATS_DOC})")
    dev: str | None = setting(None, "labelled file evaluated after every epoch; the best epoch is kept")
    out: str = setting(None, "model directory to write (replaced atomically; one of another run only with "
                            "--overwrite)", required=True)
    config: str | None = setting(None, "YAML (or TOML) holding this run's settings (and --train, --dev); flags "
                                       "given override it")


@dataclass
class MultiFiles:
    """`bertheads train multi`."""

    config: str = setting(None, "YAML (or TOML) naming the tasks (docs/multi.md)", required=True)
    out: str = setting(None, "model directory to write (replaced atomically)", required=True)


@dataclass
class TuneFiles:
    train: str = setting(None, "training file", required=True)
    dev: str = setting(None, "labelled file the trials are compared on", required=True)
    out: str = setting(None, "directory for the best model, trials.jsonl and the search's storage", required=True)


@dataclass
class DistillFiles:
    """`bertheads distill TEACHER`."""

    out: str | None = setting(None, "the student's model directory to write (replaced atomically; one of another "
                                    "run only with --overwrite)")
    config: str | None = setting(None, "YAML (or TOML) holding the distillation's settings (teacher, data, train, "
                                       "dev, model, soft_temperature, epochs, ...); flags given override it")


@dataclass
class AuditFiles:
    """`bertheads audit KIND`."""

    train: str = setting(None, f"the labelled training file to audit (formats: {DATA_FORMATS_DOC})", required=True)
    dev: str | None = setting(None, "labelled file each fold's head is evaluated on (its metrics go to summary.json)")
    out: str = setting(None, "directory to write issues.jsonl and summary.json into (replaced atomically)",
                       required=True)


@dataclass
class SelectFiles:
    """`bertheads select MODEL`."""

    pool: str = setting(None, "unlabelled inputs in one of the head's formats (labels, if any, are ignored)",
                        required=True)
    out: str = setting(None, "JSONL file of the chosen inputs in the kind's training format, label empty, with id "
                             "and score (written atomically)", required=True)


# -- prediction ---------------------------------------------------------------------------------
@dataclass
class EvaluateFiles:
    data: str = setting(None, "labelled file in one of the task's formats, or Parquet (a file, folder or glob)",
                        required=True)


@dataclass
class PredictFiles:
    input: str | None = setting(None, "file in a training format or plain lines (TAB separates a pair), or Parquet "
                                      "(a file, folder or glob, read a row group at a time); default stdin")
    output: str | None = setting(None, "JSONL file, or .parquet (typed columns; written atomically); with --engine "
                                       "ray a new folder; default stdout")
    # the choices are the kinds' formats (`cli/parser.py` fills them in)
    format: str = setting("auto", "input format (a tag head given --format conll also writes CoNLL columns)")


@dataclass
class AnalyzeFiles:
    input: str | None = setting(None, "JSONL records with \"text\" (and the field each head's input form adds: "
                                      "see GET /heads), or plain lines (TAB separates a second text), or Parquet "
                                      "with those columns; default stdin")
    output: str | None = setting(None, "JSONL file, or .parquet (a HEAD_FIELD column per head and field; written "
                                       "atomically); default stdout")


# -- the other commands --------------------------------------------------------------------------
@dataclass
class ExportFiles:
    to: str = setting(None, "the format to write", choices=("hf", "onnx"), required=True)
    out: str | None = setting(None, "hf: the new directory (required); onnx: default MODEL_DIR/onnx")
    quantize: str | None = setting(None, "onnx: also write the int8 graphs (dynamic for ONNX Runtime; static QDQ, "
                                         "calibrated on dev data, for OpenVINO)", choices=("int8",))
    openvino: bool = setting(True, "onnx: do not also write the fp32 graph as OpenVINO IR converted from torch "
                                   "(written where openvino is installed; faster than OpenVINO reading the ONNX "
                                   "graph, and as large as the weights)", negate=True)


@dataclass
class CalibrateFiles:
    data: str = setting(None, "labelled file (a format of the head's kind) the temperature is fitted on",
                        required=True)
    out: str = setting(None, "the new model directory to write, with the refitted temperature (never the model "
                             "read)", required=True)


@dataclass
class ReportFiles:
    data: str | None = setting(None, "labelled file: confusion matrices, per-class scores, worst examples")
    out: str | None = setting(None, "page directory; default: MODEL_DIR/report")
    audit: str | None = setting(None, "a `bertheads audit` output folder: a section of its top suspects with their "
                                      "text, given and suggested labels")


@dataclass
class CombineFiles:
    model_dirs: list[str] = setting(help="model directories whose encoders are identical", positional=True,
                                    nargs="+")
    out: str = setting(None, "model directory to write (replaced atomically)", required=True)
    names: list[str] | None = setting(None, "new head names, one per head in input order", nargs="+")


@dataclass
class ReferenceSettings:
    """`python -m bertheads.cli.reference`."""

    check: bool = setting(False, "compare with docs/cli.md instead of printing; exit 1 when it differs")
    file: str | None = setting(None, "the file --check compares with (default: docs/cli.md)")
