"""The fitted ensemble: `PartitionEnsembleModel` (`ensemble_model`), the feature columns
it reads (`features`), what each member saw (`stats`), how a member travels as bytes
(`serialization`) and how the whole is saved and loaded (`persistence`).

Names are imported on first use, as in `sparkdist.ensemble`: the training tasks import
`stats` and `serialization` without the model class and what it needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "EstimatorStats": "sparkdist.ensemble.model.stats",
    "PartitionEnsembleModel": "sparkdist.ensemble.model.ensemble_model",
    "load_model": "sparkdist.ensemble.model.ensemble_model",
}

__all__ = ["EstimatorStats", "PartitionEnsembleModel", "load_model"]

if TYPE_CHECKING:
    from sparkdist.ensemble.model.ensemble_model import PartitionEnsembleModel, load_model
    from sparkdist.ensemble.model.stats import EstimatorStats


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'sparkdist.ensemble.model' has no attribute {name!r}")
