"""The pretrained encoder: `pretrained` (loading a checkpoint and its tokenizer, the encoder pass, the
`[CLS]`-only last layer, content hashes) and `layers` (which layers a head reads and how they are
merged)."""
