"""`python -m bertheads ...`: the same as the `bertheads` command (also under torchrun)."""

import sys

from bertheads.cli import main

sys.exit(main())
