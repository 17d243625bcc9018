"""What a tag head is: its settings (`TagSpec`: the `bertheads train tag` flags, config fields
and keywords, saved with the head)."""

from __future__ import annotations

from dataclasses import dataclass

from bertheads.base.schema import setting, settled
from bertheads.base.values import non_negative_int, positive_int
from bertheads.tasks.base import HeadSettings, unique_values


@dataclass
class TagSpec(HeadSettings):
    tag_column: int | None = setting(None, "CoNLL column holding the tag, counted from 1 (negative: from the end); "
                                           "default: last", type=int)
    label_subwords: str = setting("first", "train on each word's first piece (default) or on all its pieces",
                                  choices=("first", "all"))
    stride: int = setting(32, "tokens of overlap between the windows of an input longer than --max-length",
                          type=non_negative_int)
    head_type: str = setting("linear", "linear layer over the token states, or a 2-layer BiLSTM then the linear "
                                       "layer", choices=("linear", "bilstm"), flag="--head", tags=("shape",))
    lstm_size: int | None = setting(None, "bilstm: units per direction (default: the encoder's hidden size)",
                                    type=positive_int, tags=("shape",))
    # what training settled
    tags: list = settled(factory=list, tags=("shape",))  # tag names in output order ("O" first)
    scheme: str = settled("IOB2", tags=("shape",))  # IOB2, IOB1, IOBES or BILOU (found in the training tags)

    @classmethod
    def check_saved(cls, data: dict, num_layers: int | None = None, max_tokens: int | None = None) -> None:
        """Besides every head's checks: each tag once (a duplicate would merge two outputs)."""
        super().check_saved(data, num_layers, max_tokens)
        unique_values(data, "tags", "tags")
