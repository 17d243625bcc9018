"""What a classify head shows: its labels, figures, card and transformers class."""

from __future__ import annotations

from torch import nn

from bertheads.base.errors import UserError
from bertheads.base.schema import said
from bertheads.tasks.calibration import fold_into_output_layer
from bertheads.tasks.classify.report import classify_section
from bertheads.tasks.families import FAMILIES, copy_into
from bertheads.tasks.parts import CardText, Exporting, ListOf, Publishing, Struct, set_labels

HF_PROBLEM_TYPES = {"single_label": "single_label_classification", "regression": "regression",
                    "multi_label": "multi_label_classification"}


class ClassifyPublishing(Publishing):
    """A classify head as `GET /heads`, the report, the model card and `export --to hf` show it."""

    shows = "scores"

    def describe(self) -> dict:
        return {**super().describe(), "labels": [str(x) if not isinstance(x, (int, str)) else x
                                                 for x in self.spec.shown_labels()], "problem": self.spec.problem}

    def output_columns(self) -> Struct:
        """label (or labels, or value), the best label's score, and every label's score."""
        problem = self.spec.problem
        if problem == "regression":
            return Struct.of(value=float)
        scores = Struct(tuple((str(label), float) for label in self.spec.shown_labels()))
        if problem == "multi_label":
            return Struct.of(labels=ListOf(str), scores=scores)
        return Struct.of(label=str, score=float, scores=scores)

    def output_row(self, prediction: dict) -> dict:
        if "value" in prediction:
            return {"value": prediction["value"]}
        scores = prediction["scores"]
        if "labels" in prediction:
            return {"labels": [str(x) for x in prediction["labels"]], "scores": scores}
        label = prediction["label"]
        return {"label": None if label is None else str(label),
                "score": None if label is None else scores[str(label)], "scores": scores}

    def report_section(self, outputs: list, examples: list, metrics: dict, section) -> None:
        classify_section(self.task, outputs, examples, metrics, section)

    # -- the model card ------------------------------------------------------------------------
    def card_text(self) -> CardText:
        spec = self.spec
        labels = [str(label) for label in spec.shown_labels()]
        inputs = "texts and pairs" if spec.pair else "texts"
        longer = (f"{inputs} longer than {spec.max_length} tokens are cut into overlapping windows whose scores "
                  f"are pooled ({spec.pool})" if spec.long_input == "windows"
                  else f"{inputs} longer than {spec.max_length} tokens are cut at that length")
        limits = [longer[0].upper() + longer[1:] + "."]
        if spec.pair:
            limits.append("It reads a pair of texts (the second after the separator); a single text is not "
                          "what it was trained on.")
        if spec.problem == "regression":
            return CardText(outputs="`value`: a number on the scale of the training labels",
                            raw_outputs="`[batch, 1]`: the value", pipeline_tag=self.task.exporting.hf_pipeline,
                            limits=["The value is learned from the training labels; nothing keeps it within "
                                    "their range.", *limits], example=self.task.reading.form.example)
        if spec.problem == "multi_label":
            return CardText(outputs="`labels`: every label whose probability passes its threshold, and `scores`: "
                                    "a probability per label (sigmoid)",
                            raw_outputs=f"`[batch, {len(labels)}]`: one score (logit) per label, in the order listed",
                            pipeline_tag=self.task.exporting.hf_pipeline, labels=labels,
                            limits=["Only the labels of the training file exist; each is chosen when its "
                                    "probability passes its threshold (tuned on the dev set for F1 unless one "
                                    "was fixed).", *limits], example=self.task.reading.form.example)
        return CardText(outputs="`label`: the most probable label, and `scores`: a probability per label (softmax)",
                        raw_outputs=f"`[batch, {len(labels)}]`: one score (logit) per label, in the order listed",
                        pipeline_tag=self.task.exporting.hf_pipeline, labels=labels,
                        limits=[f"Every input gets one of the {len(labels)} training labels, also an input that "
                                f"fits none of them (`--min-score` leaves an unsure one without a label).", *limits],
                        example=self.task.reading.form.example)

    def output_labels(self) -> list:
        return [] if self.spec.problem == "regression" else list(self.spec.shown_labels())


class ClassifyExporting(Exporting):
    """A classify head in `export --to hf`: the family's sequence classification class, its
    layers copied by the family's key map (`families.py`)."""

    hf_auto_class = "AutoModelForSequenceClassification"
    hf_pipeline = "text-classification"

    def usage(self, path: str) -> str:
        """The text-classification pipeline; a pair as `text` and `text_pair`, every label's
        score for a multi-label head."""
        example = self.task.reading.form.example
        if isinstance(example, tuple):
            example = {"text": example[0], "text_pair": example[1]}
        options = ", top_k=None" if self.spec.problem == "multi_label" else ""
        return (f"from transformers import pipeline\n\n"
                f"pipe = pipeline({self.hf_pipeline!r}, model={path!r}{options})\n"
                f"print(pipe({example!r}))\n")

    def check(self, name: str, to: str) -> None:
        super().check(name, to)
        if to == "hf" and self.spec.cosine:
            raise UserError(f"head {name!r} compares the L2-normalised vector of the text with its label descriptions' "
                            f"(one linear layer over it), which no transformers {self.hf_auto_class} computes, so it has "
                            f"no transformers equivalent; export it with {said('to', 'onnx')}")
        if to == "hf" and self.task.head.pooling != self.task.head.family_pooling:
            raise UserError(f"head {name!r} reads the {self.task.head.pooling} of its tokens (pooling {self.task.head.pooling}), "
                            f"but the transformers {self.hf_auto_class} of its family reads "
                            f"{'the first token' if self.task.head.family_pooling == 'cls' else 'their ' + self.task.head.family_pooling}, "
                            f"so it has no transformers equivalent; export it with {said('to', 'onnx')}")

    def configure(self, config) -> None:
        """The labels as predictions show them (their `--label-names` when given), so the
        transformers pipeline answers with the same names; regression has its one output."""
        set_labels(config, ["value"] if self.spec.problem == "regression" else
                   [str(label) for label in self.spec.shown_labels()])
        config.problem_type = HF_PROBLEM_TYPES[self.spec.problem]

    def fold_temperature(self, model: nn.Module) -> str | None:
        """Exact: the pipeline's scores are a softmax (sigmoid for multi-label) of the logits."""
        return fold_into_output_layer(model, self.task.head.out, self.task.scoring.temperature() if self.spec.temperature else None)

    def copy_head(self, model: nn.Module, name: str) -> None:
        family = FAMILIES[self.spec.head_family or "bert"]
        copy_into(model, self.task.head, family.sequence_keys, f"head {name!r}")
