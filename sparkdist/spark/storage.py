"""Files under one directory, on the local disk or on any filesystem Spark can reach.

A local path (or a `file:` URI) with no SparkSession given is written with plain Python,
so saving and loading need no Spark. Any other scheme (hdfs://, s3a://, dbfs:/, ...), or
any path when a SparkSession is given, goes through the Hadoop FileSystem API of Spark's
JVM, which knows every filesystem the cluster is configured for. Both write the same
layout, so either can read what the other wrote.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Protocol
from urllib.parse import urlparse


class Storage(Protocol):
    """A directory: whole-file reads and writes by relative name."""

    location: str

    def exists(self) -> bool: ...

    def remove(self) -> None: ...

    def write(self, name: str, data: bytes) -> None: ...

    def read(self, name: str) -> bytes: ...


def open_storage(path: str, spark: Any = None) -> Storage:
    """The directory at `path`: local files, or the Hadoop filesystem through `spark`."""
    scheme = urlparse(path).scheme
    local = scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")
    if spark is None and local:
        return LocalStorage(_local_path(path))
    if spark is None:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise ValueError(
                f"{path!r} is on a '{scheme}' filesystem, which is reached through Spark: "
                "start a SparkSession (or pass spark=...) first, or use a local path"
            )
    return HadoopStorage(path, spark)


class LocalStorage:
    """A directory on this machine's disk."""

    def __init__(self, location: str) -> None:
        self.location = location

    def exists(self) -> bool:
        return os.path.exists(self.location)

    def remove(self) -> None:
        if os.path.isdir(self.location):
            shutil.rmtree(self.location)
        elif os.path.exists(self.location):
            os.remove(self.location)

    def write(self, name: str, data: bytes) -> None:
        target = os.path.join(self.location, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with open(target, "wb") as handle:
            handle.write(data)

    def read(self, name: str) -> bytes:
        with open(os.path.join(self.location, name), "rb") as handle:
            return handle.read()


class HadoopStorage:
    """A directory on a Hadoop-compatible filesystem, through Spark's JVM."""

    def __init__(self, location: str, spark: Any) -> None:
        from sparkdist.spark import require_classic

        require_classic(
            spark,
            f"Saving or loading {location!r} through Spark's Hadoop filesystem",
            "Use a path this machine can open (a local or mounted directory, e.g. /dbfs/... "
            "or /Volumes/... on Databricks), or log the model with MLflow.",
        )
        self.location = location
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        self._root = jvm.org.apache.hadoop.fs.Path(location)
        self._fs = self._root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def exists(self) -> bool:
        return bool(self._fs.exists(self._root))

    def remove(self) -> None:
        self._fs.delete(self._root, True)

    def write(self, name: str, data: bytes) -> None:
        stream = self._fs.create(self._path(name), True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()

    def read(self, name: str) -> bytes:
        stream = self._fs.open(self._path(name))
        try:
            return bytes(self._jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()

    def _path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._root, name)


def _local_path(path: str) -> str:
    parsed = urlparse(path)
    return parsed.path if parsed.scheme == "file" else path
