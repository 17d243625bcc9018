"""`python -m bertheads ...`: the same as the `bertheads` command (also under torchrun)."""

from bertheads.cli.main import command

command()
