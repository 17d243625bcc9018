"""Running saved models, the library layer: `stream` (predict and evaluate a chunk at a time),
`analyze` (every head from one encoder pass), `extract` (frozen-encoder vectors), `report` (the
HTML page of figures)."""
