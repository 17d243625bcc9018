"""Text in, features out, below the task kinds: `readers` (TSV/CSV/JSONL/lines with file and line
kept for errors), `rows` (data in memory read like a file's records), `encoding` (BERT packing,
windows, padding) and `offsets` (pieces back to characters and raw text's words, for every
tokenizer)."""
