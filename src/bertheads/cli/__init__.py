"""The command-line face: `parser` builds every command's flags, `commands` runs them, `main` is the
`bertheads` console script (one-line errors, exit status)."""
