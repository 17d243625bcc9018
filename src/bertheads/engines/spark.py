"""The model in Spark and Dask: `spark_udf` (the function and output schema of
`df.mapInArrow`, Arrow record batches in and out, so the heads' typed columns reach Spark as
they are), `spark_predict` (the DataFrame with the heads' columns) and `dask_predict`
(`ddf.map_partitions`). A worker process loads the model once (`batches.loaded_model`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from bertheads.base.extras import require
from bertheads.engines.batches import BatchPredictor


def spark_udf(model, input_schema, heads: Sequence[str] | str | None = None, **given):
    """`(fn, schema)` for `df.mapInArrow(fn, schema)`: `input_schema` the DataFrame's
    (`df.schema`); `heads` and `given` as `BatchPredictor` takes them (its settings, the
    runtime's and the heads' inference options: `min_confidence=0.9`, `calibrate=False`, ...)."""
    require("spark", "spark_udf")
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    predictor = BatchPredictor(model, heads, **given)
    added = predictor.output_schema()
    schema = from_arrow_schema(pa.schema([*[f for f in to_arrow_schema(input_schema) if f.name not in added.names],
                                          *added]))

    def predict_batches(batches: Iterator) -> Iterator:
        for batch in batches:
            yield predictor(batch)

    return predict_batches, schema


def spark_predict(df, model, heads: Sequence[str] | str | None = None, **given):
    """`df` with the heads' columns (`df.mapInArrow` over `spark_udf`)."""
    fn, schema = spark_udf(model, df.schema, heads, **given)
    return df.mapInArrow(fn, schema)


def dask_predict(ddf, model, heads: Sequence[str] | str | None = None, **given):
    """A dask DataFrame with the heads' columns (`ddf.map_partitions`, a partition a batch)."""
    require("dask", "dask_predict")
    predictor = BatchPredictor(model, heads, **given)
    return ddf.map_partitions(predictor, meta=predictor(ddf._meta))
