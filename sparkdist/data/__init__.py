"""Spark DataFrames to training ranks: petastorm's converter API on a pyarrow reader.

Names are imported on first use, so that modules needing only `sparkdist.data.fs` or
`sparkdist.data.files` (the ensembles' Parquet source) do not import the converter.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "BatchedDataLoader": "sparkdist.data.torch_loader",
    "CACHE_DIR_CONF": "sparkdist.data.cache",
    "SparkDatasetConverter": "sparkdist.data.converter",
    "TransformSpec": "sparkdist.data.transform",
    "make_spark_converter": "sparkdist.data.conversion",
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
    from sparkdist.data.conversion import make_spark_converter
    from sparkdist.data.converter import SparkDatasetConverter
    from sparkdist.data.torch_loader import BatchedDataLoader
    from sparkdist.data.transform import TransformSpec


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sparkdist.data' has no attribute {name!r}")
