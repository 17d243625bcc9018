"""bertheads: one pretrained BERT-family encoder, many task heads."""

__version__ = "0.1.0"

from bertheads.api import Model, audit, combine, distill, evaluate, load, predict, train, train_multi  # noqa: E402
from bertheads.base.errors import UserError  # noqa: E402
from bertheads.engines.batches import BatchPredictor  # noqa: E402
from bertheads.engines.spark import dask_predict, spark_predict, spark_udf  # noqa: E402
from bertheads.training.loop import TrainSettings  # noqa: E402

__all__ = ["BatchPredictor", "Model", "TrainSettings", "UserError", "__version__", "audit", "combine", "distill", "evaluate", "load",
           "predict", "train", "train_multi", "spark_udf", "spark_predict", "dask_predict"]
