"""The classify kind: whole-sequence labels and scores read from the [CLS] vector (`task`: options,
head, loss, decoding, formats; `metrics`: accuracy, F1, correlation, multi-label figures)."""
