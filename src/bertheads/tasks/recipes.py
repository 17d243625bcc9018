"""The training recipe a run's data calls for: the settings a user leaves to bertheads (batch
size, epochs, fine-tuning or features mode, and without a dev file a held-out slice of the
training data to choose the kept epoch on) picked by the number of training examples.

Each kind holds its table (`Task.recipes`, e.g. `tasks/classify/task.py`), rows in order of
size; the first row whose `up_to` is at least the number of examples is the run's. The last
row (`up_to` None) is the recipe for any size, and the one `recipe: fixed` always takes. A
kind whose small-data runs are not measured yet keeps one row, its fixed defaults (`FIXED`).
The measurements behind each row: docs/little-data.md and bench/RESULTS.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

HOLDOUT = 0.1  # without a dev file: this share of the training examples is held out to choose on
HOLDOUT_LEAST = 4  # ... never fewer than this many, nor over a fifth of them (else none: the last epoch is kept)
HOLDOUT_MOST = 2000  # ... nor more than this many
RECIPE_CHOICES = ("auto", "fixed")


@dataclass(frozen=True)
class Fallback:
    """A faster mode for a recipe's row and its measured cost in quality: `points` lower than the
    row's own mode on `measured` (the data, its size and the seeds, as a line says it)."""

    mode: str
    points: float
    measured: str


@dataclass(frozen=True)
class Recipe:
    """What a run of up to `up_to` training examples (None: any number) trains with: `mode`
    ("finetune", "features" or "contrastive"), `batch_size`, and its epochs (in features and
    contrastive mode the head's): enough for about `steps` optimizer steps, within `epochs`
    (fewest, most); without `steps`, the fewest. In contrastive mode, `pairs_each` pairs per
    training example (0: the default count of pairs). `fallbacks`: the faster modes measured
    against the row's, in order of quality (a `--time-budget` run takes the best that fits)."""

    up_to: int | None
    mode: str
    batch_size: int
    steps: int = 0
    epochs: tuple[int, int] = (3, 3)
    pairs_each: int = 0
    fallbacks: tuple[Fallback, ...] = ()

    def epochs_for(self, features: int, batch_size: int) -> int:
        """Epochs for `features` training inputs in batches of `batch_size`."""
        fewest, most = self.epochs
        if not self.steps:
            return fewest
        per_epoch = max(1, math.ceil(features / batch_size))
        return max(fewest, min(most, math.ceil(self.steps / per_epoch)))


FIXED = (Recipe(None, "finetune", 32),)  # one recipe for every size: what a kind without a measured table takes


def recipe_for(table: tuple[Recipe, ...], examples: int, how: str = "auto") -> Recipe:
    """The row of `table` for `examples` training examples (`how` "fixed": its last row)."""
    if how == "fixed":
        return table[-1]
    return next(r for r in table if r.up_to is None or examples <= r.up_to)


def holdout_size(examples: int, share: float) -> int:
    """How many of `examples` training examples are held out to choose on (0: none)."""
    if share <= 0:
        return 0
    count = min(HOLDOUT_MOST, max(HOLDOUT_LEAST, round(examples * share)))
    return count if examples >= 5 * count else 0
