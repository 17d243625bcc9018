"""What a qa head shows: figures, card, transformers class and pipeline options."""

from __future__ import annotations

import torch
from torch import nn

from bertheads.tasks.base import CardText
from bertheads.tasks.families import FAMILIES, copy_into
from bertheads.tasks.parts import Exporting, Publishing, Struct, set_labels
from bertheads.tasks.qa.report import qa_section


class QAPublishing(Publishing):
    """A qa head as the report, the model card and `export --to hf` show it."""

    shows = "answer"

    def output_columns(self) -> Struct:
        """The answer's text, its characters in the passage, its probability and raw score."""
        return Struct.of(answer=str, start=int, end=int, score=float, raw_score=float)

    def output_row(self, prediction: dict) -> dict:
        return {k: prediction.get(k) for k, _ in self.output_columns().fields}

    def report_section(self, outputs: list, examples: list, metrics: dict, section) -> None:
        qa_section(self.task, outputs, examples, metrics, section)

    # -- the model card ------------------------------------------------------------------------
    def card_text(self) -> CardText:
        spec = self.spec
        limits = ["Answers are spans of the passage: it copies text and never composes, sums up or paraphrases "
                  f"an answer; a span is at most {spec.max_answer_length} tokens.",
                  f"Passages longer than {spec.max_length} tokens are read in overlapping windows "
                  f"({spec.stride} tokens shared); questions are cut at {spec.max_question_length} tokens."]
        if spec.unanswerable:
            limits.append("It may answer nothing (an empty answer) when no span of the passage scores above "
                          "its no-answer score by the threshold (SQuAD v2.0).")
        else:
            limits.append("Every question of its training data had an answer: it always gives a span, also "
                          "when the passage does not answer the question.")
        return CardText(outputs="`answer`: the answer's text, its `start` and `end` characters in the passage "
                                "and its `score`",
                        raw_outputs="`[batch, seq, 2]`: the start and end score of each token",
                        pipeline_tag=self.task.exporting.hf_pipeline, limits=limits,
                        example={"question": "Where does the tower stand?",
                                 "context": "The tower was finished in 1889 and stands in Paris."})


class QAExporting(Exporting):
    """A qa head in `export --to hf`: the family's question answering class, its linear layer
    as `qa_outputs`."""

    hf_auto_class = "AutoModelForQuestionAnswering"
    hf_pipeline = "question-answering"

    def usage(self, path: str) -> str:
        """`AutoModelForQuestionAnswering` and the best span of one window (transformers 5 has no
        question-answering pipeline)."""
        example = self.task.publishing.card_text().example
        return (f"import torch\n"
                f"from transformers import AutoModelForQuestionAnswering, AutoTokenizer\n\n"
                f"tokenizer = AutoTokenizer.from_pretrained({path!r})\n"
                f"model = AutoModelForQuestionAnswering.from_pretrained({path!r}).eval()\n"
                f"question, context = {example['question']!r}, {example['context']!r}\n"
                f"inputs = tokenizer(question, context, return_tensors='pt', truncation='only_second', "
                f"max_length={int(self.spec.max_length)})\n"
                f"with torch.no_grad():\n"
                f"    out = model(**inputs)\n"
                f"start, end = int(out.start_logits[0].argmax()), int(out.end_logits[0].argmax())\n"
                f"print(tokenizer.decode(inputs['input_ids'][0][start:end + 1]))\n")

    def configure(self, config) -> None:
        set_labels(config, ["start", "end"])

    def fold_temperature(self, model: nn.Module) -> str | None:
        """Not exact for qa: not folded."""
        if not self.spec.temperature or not self.spec.calibrate:
            return None
        return (f"temperature {self.spec.temperature:g} not folded: the pipeline's score is P(start) x P(end) in a "
                "window, bertheads' calibrated score the probability of the answer among the question's candidate "
                "spans and its null answer")

    def copy_head(self, model: nn.Module, name: str) -> None:
        copy_into(model, self.task.head, FAMILIES[self.spec.head_family or "bert"].span_keys, f"head {name!r}")

    def outputs(self, out) -> torch.Tensor:
        return torch.stack([out.start_logits, out.end_logits], dim=-1)

    def pipeline_options(self) -> dict:
        spec = self.spec
        return {"max_answer_len": spec.max_answer_length, "doc_stride": spec.stride, "max_seq_len": spec.max_length,
                "max_question_len": spec.max_question_length}
