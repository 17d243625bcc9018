"""Files below the model: `atomic` (temp-then-rename writes and directory swaps), `rowfiles` (large
arrays written block by block), `encoder_refs` (remembered checkpoint hashes, references to an
unchanged checkpoint) and `features_cache` (the frozen encoder's cached outputs)."""
