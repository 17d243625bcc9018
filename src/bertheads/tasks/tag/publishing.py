"""What a tag head shows: its tags and entity types, figures, card and transformers class."""

from __future__ import annotations

from torch import nn

from bertheads.base.errors import UserError
from bertheads.tasks.base import CardText
from bertheads.tasks.calibration import fold_into_output_layer
from bertheads.tasks.families import FAMILIES, copy_into
from bertheads.tasks.parts import Exporting, ListOf, Publishing, Struct
from bertheads.tasks.tag.report import tag_section

ENTITY = Struct.of(text=str, type=str, start=int, end=int, score=float)  # one entity of a raw text


class TagPublishing(Publishing):
    """A tag head as `GET /heads`, the report, the model card and `export --to hf` show it."""

    shows = "entities"

    def output_columns(self) -> Struct:
        """The entities of a raw text: a list of (text, type, start, end, score)."""
        return Struct.of(entities=ListOf(ENTITY))

    def output_row(self, prediction: dict) -> dict:
        return {"entities": [{k: e.get(k) for k, _ in ENTITY.fields} for e in prediction["entities"]]}

    def describe(self) -> dict:
        return {**super().describe(), "labels": list(self.spec.tags),
                "entity_types": sorted({t.split("-", 1)[1] for t in self.spec.tags if "-" in t})}

    def report_section(self, outputs: list, examples: list, metrics: dict, section) -> None:
        tag_section(self.task, outputs, examples, metrics, section)

    # -- the model card ------------------------------------------------------------------------
    def card_text(self) -> CardText:
        spec = self.spec
        types = sorted({t.split("-", 1)[1] for t in spec.tags if "-" in t})
        limits = [f"It finds entities of the types of its training file only ({', '.join(types) or 'none'}), "
                  f"as spans of whole words ({spec.scheme} tags; a word's tag is read from its first piece).",
                  f"Texts longer than {spec.max_length} tokens are read in overlapping windows "
                  f"({spec.stride} tokens shared)."]
        if spec.head_type == "bilstm":
            limits.append("Its BiLSTM layer has no transformers or ONNX form: only the torch runtime runs it.")
        return CardText(outputs="`entities`: each entity's text, type, start and end characters and score (for "
                                "given words: `tokens`, `tags` and entities by word index)",
                        raw_outputs=f"`[batch, seq, {len(spec.tags)}]`: one score per tag for each token",
                        pipeline_tag=self.task.exporting.hf_pipeline, labels=list(spec.tags), labels_title="tags", limits=limits,
                        example="Angela Merkel visited Paris last week.")

    def output_labels(self) -> list:
        return list(self.spec.tags)


class TagExporting(Exporting):
    """A tag head in `export --to hf`: the family's token classification class (a BiLSTM head
    has none, nor an ONNX form)."""

    hf_auto_class = "AutoModelForTokenClassification"
    hf_pipeline = "token-classification"

    def check(self, name: str, to: str) -> None:
        if self.spec.head_type == "linear":
            return
        if to == "hf":
            raise UserError(f"head {name!r}: a BiLSTM tag head has no transformers equivalent")
        raise UserError(f"head {name!r}: a BiLSTM tag head cannot be exported to ONNX "
                        f"(its packed sequences have no ONNX form); use the torch runtime")

    def fold_temperature(self, model: nn.Module) -> str | None:
        """Exact: the pipeline's scores are each token's softmax of the logits."""
        return fold_into_output_layer(model, self.task.head.out, self.task.scoring.temperature() if self.spec.temperature else None)

    def copy_head(self, model: nn.Module, name: str) -> None:
        copy_into(model, self.task.head, FAMILIES[self.spec.head_family or "bert"].token_keys, f"head {name!r}")

    def pipeline_options(self) -> dict:
        return {"aggregation_strategy": "first"}
