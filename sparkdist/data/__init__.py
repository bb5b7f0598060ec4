"""Spark DataFrames to training ranks: petastorm's converter API on a pyarrow reader."""

from sparkdist.data.cache import CACHE_DIR_CONF
from sparkdist.data.converter import SparkDatasetConverter, make_spark_converter

__all__ = ["CACHE_DIR_CONF", "SparkDatasetConverter", "make_spark_converter"]
