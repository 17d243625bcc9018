"""The classify kind: whole-sequence labels and scores read from the [CLS] vector (`task`: options,
head, loss, decoding; `spec`: its saved settings; `formats`: its files and label rules; `metrics`:
accuracy, F1, correlation, multi-label figures; `report`: its report figures)."""
