"""The settings of a training run, each group a dataclass whose fields carry their flag, help,
value type and default (`bertheads.base.schema`): the `bertheads train` / `tune` flags, the
config file's fields, the Python keyword arguments, what a checkpoint compares and what a
search may vary are all derived from these.

`RunSettings`: what the run starts from (`--model`, `--limit`); `TrainSettings`: how it trains;
`HeadOptions`: the head and feature-extraction settings every task kind takes (each kind's own
settings are its spec's, `tasks/KIND`). Tags say what a setting is to its users:
`searched` (the training settings a search varies by default), `not-compared` (a resume may
change it), `not-recorded` (left out of a saved model's config), `where` (where things are
kept, not what is trained: neither searched nor part of a search's identity).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bertheads.base.errors import UserError
from bertheads.base.machine import TRAIN_PRECISIONS
from bertheads.base.schema import setting
from bertheads.base.values import (
    duration,
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
)
from bertheads.compute.batching import INFERENCE_BATCH
from bertheads.encoder.layers import COMBINES, POOLINGS
from bertheads.tasks.base import HeadSettings
from bertheads.tasks.recipes import RECIPE_CHOICES

SAMPLINGS = ("proportional", "temperature", "round-robin")
KEEP_CHOICES = ("best", "last")
FINETUNE_LR = 5e-5  # the learning rate when the encoder learns too
FEATURES_LR = 1e-3  # ... and when only heads learn, on a frozen encoder's cached states
# ... and when heads learn with their own top layers (`tune_layers`): 3e-4 beat 1e-4 at N=2 and
# N=3 on SST-2 (8,000 rows) and CoNLL-2003 (all), 1 epoch, by 0.8 to 6.5 points (bench/branches.py)
BRANCH_LR = 3e-4
MODES = ("finetune", "features", "contrastive")
FROZEN_HEAD_MODES = ("features", "contrastive")  # the modes whose heads train alone on cached encoder states
# --mode contrastive: the default number of pairs at most (SetFit's count at 100 examples; at 200,
# a quarter of SetFit's 20,000 tuned as well in a quarter of the time: docs/little-data.md)
MOST_PAIRS = 5_000
AUTO = "auto"  # a setting left to the recipe for the data's size (`tasks/recipes.py`)
# a head option whose Python name differs from its spec field's
SPEC_FIELD = {"layer_combine": "combine"}


def spec_name(option: str) -> str:
    """The spec field a head option sets."""
    return SPEC_FIELD.get(option, option)


@dataclass
class RunSettings:
    """What a run starts from."""

    model: str = setting("default", "'default' (the embedded MiniLM-L6), a checkpoint directory, a hub name, or "
                                    "a bertheads model (its head of the same kind and labels trains further; "
                                    "other heads are new)", group="training")
    limit: int | None = setting(None, "use only the first N training examples", type=positive_int,
                                group="training", after="seed")
    head_name: str | None = setting(None, "the head's name in the saved model (default: its kind; a config file "
                                          "names its tasks)", group="training", metavar="NAME")
    into: str | None = setting(None, "add the trained heads to this saved model of branch (--tune-layers) or "
                                     "features heads: --out gets its heads and the new ones (one of the same name "
                                     "replaced, every other head's predictions unchanged); trains on its checkpoint",
                               group="training", metavar="MODEL")


@dataclass
class TrainSettings:
    """How a run trains (the same for every task of a multi-task run)."""

    # auto (None): the recipe for the training data's size (`tasks/recipes.py`), settled in
    # training.resolve.settle_run and recorded in the saved model's config.yaml
    epochs: int | None = setting(None, "passes over the training data (default auto: by the training data's size, "
                                       "from 3 for large sets to many more for a few hundred examples, the best "
                                       "kept on dev; see docs/little-data.md)", type=positive_int,
                                 group="training", tags=("searched",), metavar="N")
    batch_size: int | None = setting(None, "training examples per step (default auto: by the training data's "
                                           "size, 8 for small sets, 32 for large ones; qa 16)", type=positive_int,
                                     group="training", tags=("searched",), metavar="N")
    # no default shown by argparse (the help names both): the mode decides it, in resolve.settle_run
    lr: float | None = setting(None, f"peak learning rate (AdamW, linear decay); default {FINETUNE_LR:g} when "
                                     f"fine-tuning, {FEATURES_LR:g} with --mode features (only the head learns), "
                                     f"{BRANCH_LR:g} with --tune-layers",
                               type=positive_float, group="training", tags=("searched",))
    seed: int = setting(42, "random seed (head initialisation, batch order)", type=int, group="training")
    warmup_ratio: float = setting(0.1, "share of the steps over which the learning rate rises from 0", type=fraction,
                                  group="training", tags=("searched",))
    weight_decay: float = setting(0.01, "AdamW weight decay (not on biases and LayerNorm)", type=non_negative_float,
                                  group="training", tags=("searched",))
    attention_dropout: float | None = setting(None, "dropout on the attention weights while fine-tuning (default: "
                                                    "the checkpoint's, 0.1 for BERT); 0 lets the fused attention "
                                                    "kernels run, several times faster on long inputs (qa's windows) "
                                                    "on a CPU", type=fraction, group="training", metavar="P")
    max_grad_norm: float = setting(1.0, "clip the gradients' norm to this (0: no clipping)", type=non_negative_float,
                                   cli=False)
    eval_batch_size: int = setting(INFERENCE_BATCH, "inputs per batch when evaluating on --dev", type=positive_int,
                                   group="training", tags=("not-compared",))
    sampling: str = setting("proportional", "rule for mixing the tasks' batches", choices=SAMPLINGS, cli=False)
    temperature: float = setting(2.0, "sampling temperature (sampling: temperature)", type=positive_float, cli=False)
    keep: str = setting("best", "which model is saved: the best dev evaluation (by --select-metric; an equal score "
                                "with a lower dev loss wins) or the last epoch's", choices=KEEP_CHOICES,
                        group="training")
    holdout: float | None = setting(None, "without --dev: the share of the training data held out to choose the "
                                          "kept epoch on (default auto: a tenth, at least 4 examples and at most a fifth; "
                                          "none under 20 examples); 0: none, the last epoch is kept",
                                    type=fraction, group="training", metavar="SHARE")
    recipe: str | None = setting(None, "what the auto settings (batch size, epochs, mode, holdout) follow: auto, "
                                       "the training data's size; fixed, the kind's fixed defaults whatever the "
                                       "size (batch 32, qa 16; 3 epochs; fine-tuning; no holdout); default: "
                                       "$BERTHEADS_RECIPE, else auto", choices=RECIPE_CHOICES, group="training")
    pairs: int | None = setting(None, "--mode contrastive: pairs of training texts the encoder is tuned on, half "
                                      "with a label in common, half without (default: SetFit's oversampling, every "
                                      f"pair of the commoner sort and as many of the other, at most {MOST_PAIRS:,}; "
                                      "where the recipe gives a count per example, that many)",
                                type=positive_int, group="training", metavar="N")
    time_budget: float | None = setting(None, "the time the long stages (pairs, caching, epochs) may take on this "
                                              "machine, in seconds or as 90s, 5m, 1h: the best mode of the recipe "
                                              "(by its measured quality) whose estimate, from a short timed warm-up, "
                                              "fits; the fastest when none does (default: the recipe's own mode; "
                                              "a --mode given is kept)", type=duration, group="training",
                                        metavar="TIME", tags=("not-compared", "not-recorded"))
    select_metric: str | None = setting(None, "dev metric that chooses the best evaluation (default: the task's main "
                                              "one: accuracy, f1, pearson, ...)", group="training")
    grad_accum: int = setting(1, "add the gradients of N batches before each step (a step sees N * --batch-size "
                                 "examples)", type=positive_int, group="training")
    eval_every: int | None = setting(None, "also evaluate on --dev every N steps (default: after each epoch only)",
                                     type=positive_int, group="training")
    patience: int | None = setting(None, "stop after N evaluations without improvement (needs --dev)",
                                   type=positive_int, group="training")
    device: str = setting("auto", "where to train: auto (the first GPU when there is one, else MPS, else the CPU), "
                                  "cpu, cuda, cuda:N or mps; several processes: torchrun/accelerate launch",
                          group="device", tags=("not-compared",))
    precision: str = setting("auto", "autocast precision, fp32 master weights: auto (bf16 on a GPU with it, else fp16; "
                                     "bf16 on a CPU with AMX or AVX512_BF16; else fp32), fp32, bf16, fp16 (CUDA "
                                     "only, with a gradient scaler)", choices=TRAIN_PRECISIONS, group="device")
    progress: bool = setting(True, "no progress bars", negate=True, group="training",
                             tags=("not-compared", "not-recorded"))
    save_every: int | None = setting(None, "write OUT/checkpoint every N steps (default: after each epoch); removed "
                                           "when the run ends", type=positive_int, group="checkpoints and logs",
                                     tags=("not-compared",))
    resume: bool = setting(False, "continue the run whose checkpoint is in --out (same data, model and settings)",
                           group="checkpoints and logs", tags=("not-compared", "not-recorded"))
    overwrite: bool = setting(False, "replace a model (or checkpoint) of another run in --out; without it such --out "
                                     "is refused", group="checkpoints and logs", tags=("not-compared", "not-recorded"))
    log_every: int = setting(10, "steps between lines of OUT/log.jsonl", type=positive_int,
                             group="checkpoints and logs", tags=("not-compared",))
    track: list[str] = setting(help="also send the run's settings, figures and saved model to a tracker: "
                                    "mlflow, tensorboard (OUT/tensorboard); repeat for several; none: only "
                                    "OUT/log.jsonl", factory=list, append=True, metavar="TRACKER", group="checkpoints and logs", tags=("not-compared",))
    track_uri: str | None = setting(None, "MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else MLflow's own, "
                                          "sqlite:///mlflow.db in the current directory)",
                                    group="checkpoints and logs", tags=("not-compared", "not-recorded", "where"))
    track_experiment: str = setting("bertheads", "MLflow experiment the run is filed under",
                                    group="checkpoints and logs", tags=("not-compared", "where"))
    tensorboard: bool = setting(False, "the same as --track tensorboard", group="checkpoints and logs",
                                tags=("not-compared",))
    verbose: bool = setting(True, "from Python: bertheads' progress lines on stderr at INFO when logging is not set "
                                  "up (False: warnings only); the command line's -v and -q do this there", cli=False,
                            tags=("not-compared", "not-recorded"))
    license: str | None = setting(None, "the license the model card declares (a Hugging Face license id: "
                                        "apache-2.0, mit, cc-by-4.0, ...); default: none declared ('other'), as the "
                                        "training data's terms are unknown", group="checkpoints and logs",
                                  tags=("not-compared",))


def recipe_of(settings: TrainSettings) -> str:
    """What the auto settings follow: `recipe`, else $BERTHEADS_RECIPE, else auto."""
    how = settings.recipe or os.environ.get("BERTHEADS_RECIPE") or AUTO
    if how not in RECIPE_CHOICES:
        raise UserError(f"BERTHEADS_RECIPE: expected one of {', '.join(RECIPE_CHOICES)}, got {how!r}")
    return how


def layer_text(value):
    """A config's `layers` (-1, [-1, -2], "all") as the flag's text."""
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


@dataclass
class HeadOptions:
    """The head settings every kind takes; on the command line (and at a config's top level)
    they apply to every task, a task's own entry wins. Those a head's spec holds default to
    the kind's spec value (`flags.kind_defaults`)."""

    max_length: int = setting(HeadSettings.max_length, "tokens per input (pairs are cut longest-first)",
                              type=positive_int, group="training", after="lr")
    mode: str = setting(AUTO, "fine-tune the encoder with the head; train the head alone on frozen, cached "
                              "features; or contrastive (SetFit's recipe, for tens to a few hundred labelled "
                              "texts): tune the encoder on pairs of training texts (same label or not), then "
                              "train the head alone on it; auto: by the training data's size and the kind's "
                              "measurements (docs/little-data.md)", choices=(AUTO, *MODES),
                        group="feature extraction")
    tune_layers: int | None = setting(None, "give the head its own copy of the encoder's top N layers, trained with "
                                            "it, on the frozen checkpoint's cached states below them (a branch: "
                                            "heads of one checkpoint combine and share the layers below); 0 is "
                                            "features mode on the last layer, all of them fine-tuning but the "
                                            "embeddings; sets --mode features", type=non_negative_int,
                                      group="feature extraction", metavar="N")
    layers: str | None = setting(None, "hidden layers the head reads: -1 (the last; default), -1,-2,-3,-4, all; 0 is "
                                       "the embeddings", coerce=layer_text, group="feature extraction")
    layer_combine: str = setting(HeadSettings.combine, "how several --layers are merged", choices=COMBINES,
                                 aliases=("--combine",), group="feature extraction")
    pooling: str | None = setting(None, "how a head that judges the whole input reads the tokens: [CLS], or the "
                                        "mean or max of every token (padding left out); auto: with --mode features "
                                        "the pooling the checkpoint declares (a sentence-transformers 1_Pooling), "
                                        "else [CLS]", choices=("auto", *POOLINGS), group="feature extraction")
    dropout: float = setting(HeadSettings.dropout, "dropout before the head's output layer (and inside a bilstm)",
                             type=fraction, group="training", after="max_length")
    head_family: str | None = setting(None, "whose head layout the head takes (bert, roberta, ...; default: the "
                                            "encoder's family)", cli=False)
    cache_dir: str | None = setting(None, "feature cache directory (default: $BERTHEADS_CACHE or ~/.cache/bertheads)",
                                    group="feature extraction", tags=("where",))
    cache_dtype: str = setting("float16", "precision of the cached encoder states", choices=("float16", "float32"),
                               group="feature extraction", tags=("not-searched",))
    cache_max_gb: float | None = setting(None, "refuse to grow the feature cache beyond this size", type=positive_float,
                                         group="feature extraction", tags=("where",))
