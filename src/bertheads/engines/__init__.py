"""A model inside the data engines: `BatchPredictor` (a batch of rows in, the same batch with a
typed column per head and field out) for Ray Data, Spark, Dask and pandas; Parquet in and out;
`predict --engine ray`."""
