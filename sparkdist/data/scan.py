"""Is a DataFrame a plain scan of Parquet (or Delta) files, and of which?

The data path's name for `sparkdist.spark.file_scan`, which reads the query plan (pyspark
internals stay in the Spark layer): the converter hands a plain scan's files to the ranks
instead of writing a copy, and the partition ensembles read them in their source tasks.
"""

from sparkdist.spark.file_scan import FORMATS, FileScan, NotPlainScan, plain_file_scan

__all__ = ["FORMATS", "FileScan", "NotPlainScan", "plain_file_scan"]
