"""PartitionEnsemble: train one scikit-learn or XGBoost model per Spark partition.

Big data, small models: rows are spread at random over `n_estimators` partitions, each
partition trains one independent model on its executor, and only the fitted models come
back to the driver, where they predict together. No training data passes through the
driver. The parameter names are those of scikit-learn's BaggingClassifier where they fit.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from sklearn.base import BaseEstimator

from sparkdist.ensemble.fit.driver import assemble, plan_fit, run_training
from sparkdist.ensemble.model.ensemble_model import PartitionEnsembleModel
from sparkdist.ensemble.params import DEFAULT


class PartitionEnsemble(BaseEstimator):
    """An ensemble of `n_estimators` models, each trained on one random partition of a
    Spark DataFrame.

    Parameters
    ----------
    estimator : a scikit-learn-compatible classifier or regressor (scikit-learn models and
        pipelines, `xgboost.XGBClassifier` / `XGBRegressor`), cloned once per model.
    n_estimators : number of models; the rows are spread at random into as many shares.
    max_samples : fraction of its share's rows each model fits on.
    bootstrap : draw those rows with replacement.
    max_features : features per model, a fraction in (0, 1] or a count; each model gets
        its own random subset (`estimators_features_`).
    voting : "soft" (average probabilities) or "hard" (count votes); classifiers only,
        regressors average their predictions.
    weights : "uniform", or "validation" to weight each model by its score (accuracy or
        R²) on a held-out slice of its own share.
    validation_fraction : fraction of each model's rows held out for that score; defaults to
        0.1 with weights="validation" and to 0 (no hold-out, no score) otherwise.
    random_state : seeds the row spread, the row and feature sampling and each model's
        own seed. None draws one (recorded on the fitted model as params["random_state"]).
    shuffle : True (the default) spreads every row at random over all models through a
        Spark shuffle. False keeps rows in the task that reads them: P = min(n_estimators,
        task slots) tasks each read 1/P of the data (equal row ranges of a Parquet scan, or
        Spark's partitions coalesced into P) and spread it over their own models. Faster
        (no shuffle), and as accurate when the rows' order is random (for example data
        written after a `repartition`); biased when the data is sorted (by time, by label),
        since each model sees one slice of it. Its data checks run per task, so bad rows
        fail the fit after the other tasks' models have trained.
    """

    def __init__(
        self,
        estimator: Any = DEFAULT["estimator"],
        *,
        n_estimators: int = DEFAULT["n_estimators"],
        max_samples: float = DEFAULT["max_samples"],
        bootstrap: bool = DEFAULT["bootstrap"],
        max_features: float | int = DEFAULT["max_features"],
        voting: str = DEFAULT["voting"],
        weights: str = DEFAULT["weights"],
        validation_fraction: float | None = DEFAULT["validation_fraction"],
        random_state: int | None = DEFAULT["random_state"],
        shuffle: bool = DEFAULT["shuffle"],
    ) -> None:
        # Written out, not derived: scikit-learn's get_params reads this signature. The
        # defaults, checks and docs are the table's (ensemble.params.ENSEMBLE_PARAMS).
        self.estimator = estimator
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.bootstrap = bootstrap
        self.max_features = max_features
        self.voting = voting
        self.weights = weights
        self.validation_fraction = validation_fraction
        self.random_state = random_state
        self.shuffle = shuffle

    def fit(
        self,
        df: Any,
        features_col: str | Sequence[str] = "features",
        label_col: str = "label",
    ) -> PartitionEnsembleModel:
        """Train one model per partition of the Spark DataFrame `df`; returns the fitted model.

        `features_col` is a Spark ML vector column (VectorAssembler output), an array
        column, or a list of numeric columns. The data is read once: the tasks that read
        it spread its rows at random over the partitions in chunks and count what they
        read, and each training task checks those totals (and finds a classifier's
        classes) before it fits; a ValueError says what is wrong with the data.
        """
        fit_started = time.perf_counter()
        params = self.get_params(deep=False)
        # On the driver: the parameters and columns checked, the route of the rows chosen.
        plan, route = plan_fit(params, df, features_col, label_col)
        started, training_started = time.perf_counter(), time.time()
        # In the Spark tasks: the rows read and spread, one model fitted per partition.
        rows = run_training(df, plan, route)
        trained = time.perf_counter()
        # On the driver: the data's totals checked, the fitted models combined.
        model = assemble(rows, plan, route, params)
        model.fit_timings_ = {
            "checks_seconds": started - fit_started,
            "training_job_seconds": trained - started,
            "training_job_started": training_started,
            "assemble_seconds": time.perf_counter() - trained,
        }
        return model
