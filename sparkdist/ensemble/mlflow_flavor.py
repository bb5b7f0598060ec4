"""The ensemble's MLflow flavor: a fitted partition ensemble as an `mlflow.pyfunc` model.

The ensemble is saved in its own portable format (XGBoost JSON, versioned
scikit-learn files) as an artifact of the pyfunc model, which is logged from code
(`mlflow_pyfunc.py`, as MLflow recommends); sparkdist's code travels
with it (`code_paths`), so `mlflow.pyfunc.load_model` and `mlflow.pyfunc.spark_udf`
work where sparkdist is not installed. Per-model statistics go into the run as a
table and as metrics.
"""

from __future__ import annotations

import importlib.metadata
import os
import tempfile
from typing import Any

ARTIFACT_KEY = "ensemble"
"""The saved ensemble's name among the pyfunc model's artifacts (also in
`sparkdist.tracking.ensemble_flavor`, which models logged before the flavor moved here
import it from)."""
STATS_TABLE = "sparkdist_ensemble_stats.json"


def _requirements(model: Any) -> list[str]:
    names = ["numpy", "pandas", "scikit-learn", "cloudpickle", "pyarrow"]
    if any(type(e).__module__.startswith("xgboost") for e in model.estimators_):
        names.append("xgboost-cpu" if _installed("xgboost-cpu") else "xgboost")
    return [f"{name}=={importlib.metadata.version(name)}" for name in names if _installed(name)]


def _installed(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def example_input(model: Any, rows: int = 2):
    """A small input of the shape `predict` takes, for the signature."""
    import numpy as np
    import pandas as pd

    spec = model.features_
    if spec.feature_cols is not None:
        return pd.DataFrame(
            np.zeros((rows, len(spec.feature_cols))), columns=list(spec.feature_cols)
        )
    return pd.DataFrame({spec.features_col: [np.zeros(spec.n_features) for _ in range(rows)]})


def log_ensemble(model: Any, name: str = "model", *, input_example: Any = None) -> Any:
    """Log `model` (a fitted `PartitionEnsembleModel`) into the active MLflow run.

    Returns MLflow's `ModelInfo`; load it back with `mlflow.pyfunc.load_model(info.model_uri)`
    or score a Spark DataFrame with `mlflow.pyfunc.spark_udf(spark, info.model_uri)`.
    """
    import mlflow
    from mlflow.models import infer_signature

    example = example_input(model) if input_example is None else input_example
    signature = infer_signature(example, model.predict(example))
    code_path = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # sparkdist/
    with tempfile.TemporaryDirectory() as tmp:
        saved = os.path.join(tmp, "ensemble")
        model.save(saved)
        info = mlflow.pyfunc.log_model(
            name=name,
            python_model=os.path.join(code_path, "ensemble", "mlflow_pyfunc.py"),
            artifacts={ARTIFACT_KEY: saved},
            code_paths=[code_path],
            signature=signature,
            input_example=example,
            pip_requirements=_requirements(model),
        )
    stats = model.stats_frame()
    table = stats.drop(columns=[c for c in ("class_indices", "versions") if c in stats])
    if "classes_seen" in table:
        table["classes_seen"] = [",".join(map(str, c)) for c in table["classes_seen"]]
    mlflow.log_table(table, artifact_file=STATS_TABLE)
    mlflow.log_metric("ensemble.n_estimators", float(model.n_estimators_))
    for column in ("validation_score", "fit_seconds", "rows"):
        if column in stats:
            for index, value in enumerate(stats[column]):
                if value is not None and value == value:  # skip None and NaN
                    mlflow.log_metric(f"ensemble.{column}", float(value), step=index)
    return info
