"""Running batches of features, below the task kinds: `batching` (length-grouped training
batches, sorted and capped inference batches, CPU worker threads) and `runner` (the `Runner`
protocol each runtime implements, and `run_heads`, the one loop over it)."""
