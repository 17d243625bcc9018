"""Text in and batches out, below the task kinds: `readers` (TSV/CSV/JSONL/lines with file and line
kept for errors), `encoding` (BERT packing, windows, padding), `offsets` (pieces back to
characters and raw text's words, for every tokenizer), `batching` (length-grouped
training batches, sorted inference batches, CPU worker threads) and `runner` (the `Runner`
protocol each runtime implements, and the one loop of head outputs over it)."""
