"""Saved model directories, the library layer: `manifest` (the schema of `bertheads.json`), `bundle`
(save and load a model directory atomically) and `combine` (one model from several that share an
encoder)."""
