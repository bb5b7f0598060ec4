"""What the partition ensemble tests share: estimators and Parquet files (their frames,
`frame` and `with_vector`, are the compatibility suite's too: tests/helpers.py)."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from xgboost import XGBClassifier


def logistic() -> object:
    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))


def xgb_classifier() -> XGBClassifier:
    return XGBClassifier(n_estimators=100, max_depth=3, learning_rate=0.3, n_jobs=1)


def write_parquet_files(path, data: pd.DataFrame, n_files: int = 2, row_group_size: int = 100):
    """`data` as `n_files` Parquet files of several row groups each, as pyarrow writes them."""
    import pyarrow.parquet as pq

    os.makedirs(path, exist_ok=True)
    for i, part in enumerate(np.array_split(np.arange(len(data)), n_files)):
        table = pa.Table.from_pandas(data.iloc[part], preserve_index=False)
        pq.write_table(
            table, os.path.join(path, f"part-{i}.parquet"), row_group_size=row_group_size
        )
    return str(path)


def parquet_source_of(df, features_col, label_col="label"):
    from sparkdist.ensemble.fit.parquet_source import find_parquet_source
    from sparkdist.ensemble.model.features import check_label_type, resolve_features
    from sparkdist.spark import session_slots

    spec = resolve_features(df.schema, features_col)
    numeric = check_label_type(df.schema, label_col, is_classifier=True)
    return find_parquet_source(df, spec, label_col, numeric, session_slots(df.sparkSession))
