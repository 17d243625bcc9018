"""The qa kind: answer spans read as start/end scores over passage tokens (`task`: options, head,
windows, decoding; `formats`: SQuAD JSON and JSONL; `spans`: span scoring across windows; `metrics`:
the official SQuAD v1.1 / v2.0 figures)."""
