"""`python -m bertheads ...`: the same as the `bertheads` command (also under torchrun)."""

from bertheads.cli import command

command()
