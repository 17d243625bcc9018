"""Where a training default is settled: `settle_run` turns what the user gave and the data's size
into the run's settings with nothing left open (mode, batch size, epochs, learning rate, holdout,
pairs, precision), once per run. The batch size, epochs, mode and pairs come from the kind's
recipe for the number of training examples (`tasks/recipes.py`), the learning rate from the
mode, the precision from the machine."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from bertheads.base.machine import resolve_device, training_precision
from bertheads.base.schema import said
from bertheads.tasks.recipes import HOLDOUT, Recipe
from bertheads.training.settings import (
    BRANCH_LR,
    FEATURES_LR,
    FINETUNE_LR,
    FROZEN_HEAD_MODES,
    MOST_PAIRS,
    TrainSettings,
    recipe_of,
)

log = logging.getLogger("bertheads")


@dataclass(frozen=True)
class SettledRun:
    """A run's settings with every default filled in (`settings`), beside what the user gave
    (`given`), the run's `mode` (`mode_left`: the recipe chose it, none was given) and the row
    of the kind's recipe table the defaults came from."""

    given: TrainSettings
    settings: TrainSettings
    mode: str
    mode_left: bool
    recipe: Recipe


def settle_run(given: TrainSettings, data: list, mode: str | None = None, mode_left: bool = True,
               continuing: bool = False, how: str | None = None) -> SettledRun:
    """The run `given` asks for on `data` (each task's `TaskData`: its task, its examples and
    encoded training features), what it leaves open settled by the recipe `how` (default: the
    settings' `recipe`, else $BERTHEADS_RECIPE, else auto). `mode`: the mode the tasks were given
    (None: the recipe's; fine-tuning when `continuing` a saved model's heads); `mode_left`: some
    task left its mode to the recipe."""
    how = how or recipe_of(given)
    recipe = run_recipe(data, how)
    mode = mode or ("finetune" if continuing else recipe.mode)
    batch = given.batch_size or recipe.batch_size
    features = sum(len(d.train_features) for d in data)
    epochs = given.epochs or recipe.epochs_for(features, batch * given.grad_accum)
    pairs = given.pairs or recipe_pairs(recipe, mode, sum(d.examples for d in data))
    branches = any(getattr(d.task.spec, "tune_layers", None) for d in data)  # Transformer layers learn too
    lr = given.lr if given.lr is not None else (
        BRANCH_LR if branches else FEATURES_LR if mode in FROZEN_HEAD_MODES else FINETUNE_LR)
    settings = dataclasses.replace(given, batch_size=batch, epochs=epochs, recipe=how, pairs=pairs,
                                   holdout=holdout_share(given, how), lr=lr, precision=run_precision(given))
    return SettledRun(given, settings, mode, mode_left, recipe)


def run_precision(given: TrainSettings) -> str:
    """The precision the run trains in on its device, `auto` settled (and recorded, so that a
    resume elsewhere that would train in another precision is told apart)."""
    precision, why = training_precision(given.precision, resolve_device(given.device))
    if given.precision == "auto":
        log.debug(f"{said('precision', 'auto')}: {precision} ({why})")
    return precision


def is_settled(settings: TrainSettings) -> bool:
    """Whether `settle_run` has nothing left to fill that the loop needs."""
    return None not in (settings.batch_size, settings.epochs, settings.lr) and settings.precision != "auto"


def holdout_share(given: TrainSettings, how: str) -> float:
    """The share of the training examples held out to choose on without a dev file: the one
    given, else a tenth (none with the fixed recipe)."""
    return given.holdout if given.holdout is not None else (0.0 if how == "fixed" else HOLDOUT)


def run_recipe(data: list, how: str) -> Recipe:
    """The recipe of the run's largest task (its batches are most of the steps), from its kind's
    table; its mode only when every task's own recipe (its kind's table, its own size) has that
    mode too, else fine-tuning, which every kind's fixed recipe uses (a tagger on a classifier's
    small-data features mode would learn next to nothing)."""
    own = [d.task.modeling.recipe(d.examples, how) for d in data]
    largest = own[max(range(len(data)), key=lambda i: data[i].examples)]
    return largest if len({r.mode for r in own}) == 1 else dataclasses.replace(largest, mode="finetune")


def recipe_pairs(recipe: Recipe, mode: str, examples: int) -> int | None:
    """The pairs a contrastive run tunes the encoder on when the recipe gives a count per
    example (never fewer than the default's most); None: the default count."""
    if mode != "contrastive" or not recipe.pairs_each:
        return None
    return max(MOST_PAIRS, recipe.pairs_each * examples)
