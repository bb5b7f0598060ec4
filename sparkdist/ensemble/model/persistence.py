"""Save and load a fitted partition ensemble as a directory any later reader can check.

Layout: `manifest.json` (parameters, classes, features, per-model statistics and the
library versions that wrote it) and `estimators/NNNNN.json` (XGBoost's JSON) or
`estimators/NNNNN.pkl` (pickled scikit-learn models) for each model. Loading reads the
manifest first and refuses pickles written by another scikit-learn major.minor version
before opening any of them.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

from sparkdist.ensemble.model.features import FeatureSpec
from sparkdist.ensemble.model.serialization import (
    SKLEARN_PICKLE,
    XGBOOST_JSON,
    check_sklearn_version,
    dump_estimator,
    library_versions,
    load_estimator,
)
from sparkdist.ensemble.model.stats import EstimatorStats
from sparkdist.spark.storage import open_storage

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT_NAME = "sparkdist.partition_ensemble"
FORMAT_VERSION = 1
_SUFFIX = {XGBOOST_JSON: "json", SKLEARN_PICKLE: "pkl"}


def save_model(model: Any, path: str, *, overwrite: bool = False, spark: Any = None) -> None:
    """Write the PartitionEnsembleModel `model` to the directory `path` (local, or any
    filesystem Spark can write). The model module calls this; this one never imports it."""
    storage = open_storage(path, spark)
    if storage.exists():
        if not overwrite:
            raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it")
        storage.remove()
    entries = []
    for index, (estimator, columns, stats) in enumerate(
        zip(model.estimators_, model.estimators_features_, model.estimators_stats_, strict=True)
    ):
        model_format, model_class, data = dump_estimator(estimator)
        name = f"estimators/{index:05d}.{_SUFFIX[model_format]}"
        storage.write(name, data)
        entries.append(
            {
                "file": name,
                "format": model_format,
                "class": model_class,
                "features": [int(c) for c in columns],
                "stats": stats.to_dict(),
            }
        )
    classes = getattr(model, "classes_", None)
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "task": "classification" if model.is_classifier else "regression",
        "classes": None if classes is None else classes.tolist(),
        "label_col": model.label_col,
        "label_is_numeric": model.label_is_numeric,
        "features": model.features_.to_dict(),
        "voting": model.voting,
        "weighting": model.weighting,
        "weights": [float(w) for w in model.weights_],
        "params": model.params,
        "versions": library_versions(),
        "estimators": entries,
    }
    storage.write(MANIFEST, json.dumps(manifest, indent=1).encode("utf-8"))
    logger.info("saved %d models to %s", len(entries), path)


def read_model(path: str, *, spark: Any = None) -> dict[str, Any]:
    """The PartitionEnsembleModel constructor arguments of a model written by `save_model`."""
    storage = open_storage(path, spark)
    if not storage.exists():
        raise FileNotFoundError(f"no saved partition ensemble at {path}")
    try:
        manifest = json.loads(storage.read(MANIFEST))
    except Exception as error:
        raise ValueError(f"{path} is not a saved partition ensemble: no readable {MANIFEST}") from (
            error
        )
    if manifest.get("format") != FORMAT_NAME:
        raise ValueError(f"{path}/{MANIFEST} is not a partition ensemble manifest")
    if manifest.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(
            f"{path} was saved in format version {manifest['format_version']}; this sparkdist "
            f"reads up to {FORMAT_VERSION}: upgrade sparkdist"
        )
    entries = manifest["estimators"]
    if any(entry["format"] == SKLEARN_PICKLE for entry in entries):
        check_sklearn_version(manifest["versions"].get("scikit-learn"), path)
    estimators = [
        load_estimator(entry["format"], entry["class"], storage.read(entry["file"]))
        for entry in entries
    ]
    classes = manifest["classes"]
    return dict(
        estimators=estimators,
        estimators_features=[np.asarray(entry["features"], dtype=np.int64) for entry in entries],
        estimators_stats=[EstimatorStats.from_dict(entry["stats"]) for entry in entries],
        features=FeatureSpec.from_dict(manifest["features"]),
        label_col=manifest["label_col"],
        label_is_numeric=manifest["label_is_numeric"],
        classes=None if classes is None else np.asarray(classes),
        voting=manifest["voting"],
        weighting=manifest["weighting"],
        weights=np.asarray(manifest["weights"], dtype=np.float64),
        params=manifest["params"],
    )
