"""Spark DataFrames to training ranks: petastorm's converter API on a pyarrow reader.

Split by the process the code runs in, as `sparkdist.runner` is:

* `driver`: what the driver learns and writes (`driver.convert`: `make_spark_converter`;
  `driver.sources`: a scan read in place; `driver.schema`, `driver.writer`: a copy);
* `rank`: what a rank reads (`rank.reader`, `rank.order`, `rank.epochs`, `rank.decode`,
  `rank.shuffled`, `rank.batches`, the torch and tf loaders, `rank.transform`,
  `rank.device_prefetch`, `rank.rank_place`);
* here, what both use: `converter` (the handle, made on the driver and opened on the
  ranks), `cache` (where copies live, and their removal), `layout` (the files a rank
  reads, learnt from their footers), `fs` (URLs and file systems), `petastorm_backend`.

Names are imported on first use, so that modules needing only `sparkdist.data.fs` or
`sparkdist.data.layout` (the ensembles' Parquet source) do not import the converter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "BatchedDataLoader": "sparkdist.data.rank.torch_loader",
    "CACHE_DIR_CONF": "sparkdist.data.cache",
    "SparkDatasetConverter": "sparkdist.data.converter",
    "TransformSpec": "sparkdist.data.rank.transform",
    "make_spark_converter": "sparkdist.data.driver.convert",
    "register_delete_dir_handler": "sparkdist.data.cache",
}

__all__ = [
    "CACHE_DIR_CONF",
    "BatchedDataLoader",
    "SparkDatasetConverter",
    "TransformSpec",
    "make_spark_converter",
    "register_delete_dir_handler",
]

if TYPE_CHECKING:
    from sparkdist.data.cache import CACHE_DIR_CONF, register_delete_dir_handler
    from sparkdist.data.converter import SparkDatasetConverter
    from sparkdist.data.driver.convert import make_spark_converter
    from sparkdist.data.rank.torch_loader import BatchedDataLoader
    from sparkdist.data.rank.transform import TransformSpec


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sparkdist.data' has no attribute {name!r}")
