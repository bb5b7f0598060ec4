"""The driver's half of the data path: a DataFrame read in place or copied as Parquet, and
the handle the ranks get (`convert.make_spark_converter`)."""
