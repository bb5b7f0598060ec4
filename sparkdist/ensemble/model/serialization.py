"""One fitted model to bytes and back, in a format that says what can read it.

XGBoost's scikit-learn models are stored as XGBoost's own JSON, readable by any later
XGBoost. Everything else is pickled (with cloudpickle, so classes defined in a notebook
travel too); a pickle is only safe to read with the scikit-learn major.minor version that
wrote it, so the writer's versions are recorded and checked before any pickle is opened.
"""

from __future__ import annotations

import importlib
import os
import pickle
import platform
import sys
import tempfile
from typing import Any

import cloudpickle
import numpy as np

XGBOOST_JSON = "xgboost-json"
SKLEARN_PICKLE = "sklearn-pickle"
FORMATS = (XGBOOST_JSON, SKLEARN_PICKLE)


class VersionMismatchError(RuntimeError):
    """Pickled scikit-learn models met a scikit-learn version other than their writer's."""


def library_versions() -> dict[str, str | None]:
    """Versions of the libraries a saved model depends on, in this process."""
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "scikit-learn": _version_of("sklearn"),
        "xgboost": _version_of("xgboost"),
        "cloudpickle": cloudpickle.__version__,
    }


def dump_estimator(estimator: Any) -> tuple[str, str, bytes]:
    """(format, class path, bytes) for one fitted model."""
    cls = type(estimator)
    class_path = f"{cls.__module__}.{cls.__qualname__}"
    if _is_xgboost_model(estimator):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "model.json")
            estimator.save_model(path)
            with open(path, "rb") as handle:
                return XGBOOST_JSON, class_path, handle.read()
    return SKLEARN_PICKLE, class_path, cloudpickle.dumps(estimator, protocol=5)


def load_estimator(model_format: str, class_path: str, data: bytes) -> Any:
    """The model `dump_estimator` wrote. Check versions with `check_sklearn_version` first."""
    if model_format == XGBOOST_JSON:
        module_name, _, name = class_path.rpartition(".")
        if not module_name.startswith("xgboost"):
            raise ValueError(f"{XGBOOST_JSON} holds XGBoost models, not {class_path}")
        estimator = getattr(importlib.import_module(module_name), name)()
        estimator.load_model(bytearray(data))
        return estimator
    if model_format == SKLEARN_PICKLE:
        return pickle.loads(data)
    raise ValueError(f"unknown model format {model_format!r}; known: {FORMATS}")


def check_sklearn_version(saved_version: str | None, source: str) -> None:
    """Refuse to unpickle scikit-learn models written by another major.minor version."""
    installed = _version_of("sklearn")
    if saved_version is None or installed is None:
        return
    if _major_minor(saved_version) != _major_minor(installed):
        raise VersionMismatchError(
            f"{source} holds scikit-learn models pickled with scikit-learn {saved_version}, "
            f"but this Python ({sys.executable}) has scikit-learn {installed}. Pickled "
            f"scikit-learn models are only safe to load with the same major.minor version: "
            f"install scikit-learn=={'.'.join(_major_minor(saved_version))}.* or retrain"
        )


def _is_xgboost_model(estimator: Any) -> bool:
    if "xgboost" not in sys.modules:
        return False
    from xgboost import XGBModel

    return isinstance(estimator, XGBModel)


def _version_of(module_name: str) -> str | None:
    try:
        return importlib.import_module(module_name).__version__
    except ImportError:
        return None


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split(".")[:2])
