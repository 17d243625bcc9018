"""The tag kind: one tag per word read from the token states (`task`: options, head, windows, decoding;
`formats`: CoNLL, JSONL and TSV readers; `scheme`: BIO/BIOES entity spans and their metrics)."""
