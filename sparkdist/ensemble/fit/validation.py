"""Input checks for partition ensembles.

Bad input fails with a ValueError that names the parameter or column and says how to fix
it, instead of surfacing later as a task failure inside a Py4J stack trace. Parameters and
the schema are checked on the driver before any Spark job. The data is checked without a
pass of its own: the tasks that spread the rows count what they read (`DataReport`), every
training task checks the totals before it fits (so bad data trains nothing), and the
driver raises the error from the same totals. Without a shuffle (shuffle=False) a task
checks the part it read, and the driver the sum of the parts.
"""

from __future__ import annotations

import json
import logging
import numbers
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from sparkdist.ensemble.model.features import FeatureSpec, require_columns
from sparkdist.spark import columns

logger = logging.getLogger(__name__)

# Fewer rows than this per model gives models too weak to be worth averaging.
MIN_ROWS_PER_MODEL = 10
# More distinct labels than this is almost surely a regression target.
MAX_CLASSES = 1000

VOTING = ("soft", "hard")
WEIGHTS = ("uniform", "validation")


@dataclass(frozen=True)
class Defaults:
    """The ensemble's parameter defaults, shared by PartitionEnsemble and its Spark ML
    wrapper (validation_fraction's default depends on weights: see check_settings)."""

    n_estimators: int = 8
    max_samples: float = 1.0
    bootstrap: bool = False
    max_features: float = 1.0
    voting: str = "soft"
    weights: str = "uniform"
    shuffle: bool = True


DEFAULTS = Defaults()


@dataclass(frozen=True)
class Settings:
    """The ensemble's parameters after checking, with defaults resolved."""

    is_classifier: bool
    n_estimators: int
    max_samples: float
    bootstrap: bool
    max_features: float | int
    voting: str
    weights: str
    validation_fraction: float
    shuffle: bool = True


@dataclass
class DataReport:
    """What source tasks read of the data: the input checks' counts, summed over tasks.

    `classes` holds a classifier's distinct labels, at most MAX_CLASSES + 1 of them (one
    more is enough to know there are too many).
    """

    rows: int = 0
    bad_labels: int = 0  # null or NaN
    null_features: int = 0  # null vectors in a vector or array feature column
    min_size: int | None = None  # of the vectors, where features are one column
    max_size: int | None = None
    classes: set[Any] = field(default_factory=set)

    @property
    def clean(self) -> bool:
        """No check has failed so far (the row count and class count are checked later)."""
        return (
            not self.bad_labels
            and not self.null_features
            and self.min_size == self.max_size
            and len(self.classes) <= MAX_CLASSES
        )

    def add_labels(self, labels: Any, is_classifier: bool, label_is_numeric: bool) -> None:
        """Count a batch's labels (an Arrow array) and add its classes."""
        self.rows += len(labels)
        if label_is_numeric:
            bad = np.isnan(labels.to_numpy(zero_copy_only=False))
            self.bad_labels += int(bad.sum())
        else:
            self.bad_labels += labels.null_count
        if is_classifier and len(self.classes) <= MAX_CLASSES:
            self.classes.update(v for v in labels.unique().to_pylist() if not _is_missing(v))

    def add_vectors(self, null_count: int, sizes: np.ndarray) -> None:
        """Count a batch's null feature vectors and widen the range of their sizes."""
        self.null_features += null_count
        if len(sizes):
            low, high = int(sizes.min()), int(sizes.max())
            self.min_size = low if self.min_size is None else min(self.min_size, low)
            self.max_size = high if self.max_size is None else max(self.max_size, high)

    def merge(self, other: DataReport) -> None:
        self.rows += other.rows
        self.bad_labels += other.bad_labels
        self.null_features += other.null_features
        sizes = [size for size in (other.min_size, other.max_size) if size is not None]
        self.add_vectors(0, np.array(sizes, dtype=np.int64))
        self.classes |= other.classes

    def to_json(self) -> str:
        data = asdict(self)
        data["classes"] = sorted(self.classes)
        return json.dumps(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataReport:
        return cls(**{**data, "classes": set(data["classes"])})

    @classmethod
    def combined(cls, reports: Iterable[DataReport]) -> DataReport:
        total = cls()
        for report in reports:
            total.merge(report)
        return total


@dataclass(frozen=True)
class DataSummary:
    """What the driver learns about the data before training."""

    n_rows: int
    features: FeatureSpec
    label_col: str
    label_is_numeric: bool
    classes: np.ndarray | None


def check_settings(
    estimator: Any,
    n_estimators: Any,
    max_samples: Any,
    bootstrap: Any,
    max_features: Any,
    voting: Any,
    weights: Any,
    validation_fraction: Any,
    shuffle: Any = DEFAULTS.shuffle,
) -> Settings:
    """Check the ensemble parameters; resolve validation_fraction's default."""
    classifier = _check_estimator(estimator)
    _check_sampling(n_estimators, max_samples, bootstrap, shuffle, max_features)
    if voting not in VOTING:
        raise ValueError(f"voting must be one of {VOTING}, got {voting!r}")
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")
    if validation_fraction is None:
        validation_fraction = 0.1 if weights == "validation" else 0.0
    if not _is_number(validation_fraction) or not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction!r}")
    if weights == "validation" and validation_fraction == 0.0:
        raise ValueError(
            "weights='validation' scores each model on a held-out slice of its partition; "
            "set validation_fraction > 0 (for example 0.1)"
        )
    if classifier and voting == "soft" and not hasattr(estimator, "predict_proba"):
        raise ValueError(
            f"voting='soft' averages predict_proba, which {type(estimator).__name__} does not "
            "have; use voting='hard', or an estimator with predict_proba"
        )
    return Settings(
        is_classifier=classifier,
        n_estimators=int(n_estimators),
        max_samples=float(max_samples),
        bootstrap=bool(bootstrap),
        max_features=int(max_features) if _is_int(max_features) else float(max_features),
        voting=voting,
        weights=weights,
        validation_fraction=float(validation_fraction),
        shuffle=bool(shuffle),
    )


def _check_estimator(estimator: Any) -> bool:
    """A ValueError unless `estimator` is a scikit-learn classifier or regressor; True for
    a classifier."""
    from sklearn.base import is_classifier, is_regressor

    if estimator is None or not hasattr(estimator, "fit") or not hasattr(estimator, "predict"):
        raise ValueError(
            f"estimator must be a scikit-learn-compatible model with fit and predict, "
            f"got {estimator!r}"
        )
    classifier = bool(is_classifier(estimator))
    if not classifier and not is_regressor(estimator):
        raise ValueError(
            f"estimator {type(estimator).__name__} is neither a classifier nor a regressor "
            "(scikit-learn's is_classifier/is_regressor); pass a classifier or a regressor"
        )
    return classifier


def _check_sampling(
    n_estimators: Any, max_samples: Any, bootstrap: Any, shuffle: Any, max_features: Any
) -> None:
    """How many models, and what rows and features each draws."""
    if not _is_int(n_estimators) or n_estimators < 1:
        raise ValueError(f"n_estimators must be an integer >= 1, got {n_estimators!r}")
    if not _is_number(max_samples) or not 0.0 < max_samples <= 1.0:
        raise ValueError(
            f"max_samples is the fraction of a partition's rows each model fits on, in (0, 1]; "
            f"got {max_samples!r}"
        )
    for name, value in (("bootstrap", bootstrap), ("shuffle", shuffle)):
        if not isinstance(value, bool | np.bool_):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    if _is_int(max_features):
        if max_features < 1:
            raise ValueError(f"max_features as a count must be >= 1, got {max_features!r}")
    elif not _is_number(max_features) or not 0.0 < max_features <= 1.0:
        raise ValueError(
            f"max_features must be a fraction in (0, 1] or a count of features >= 1, "
            f"got {max_features!r}"
        )


def check_label_type(schema: Any, label_col: str, is_classifier: bool) -> bool:
    """Check the label column's type; returns whether it is numeric."""
    require_columns(schema, [label_col], "label")
    kind = columns.kind(schema, label_col)
    if kind == columns.NUMBER:
        return True
    if is_classifier and kind == columns.STRING:
        return False
    allowed = "numeric or string" if is_classifier else "numeric"
    raise ValueError(
        f"label column '{label_col}' has type {columns.type_name(schema, label_col)}; the "
        f"label must be {allowed}"
    )


def summarize(
    report: DataReport,
    spec: FeatureSpec,
    label_col: str,
    settings: Settings,
    label_is_numeric: bool,
    whole: bool = True,
) -> DataSummary:
    """The data's totals checked, and a classifier's classes, from the source tasks' reports.

    Runs in every training task before it fits (each has every source task's report) and
    again on the driver, so bad data stops training early and the driver raises the same
    clear error. With `whole` False the report covers one task's part (shuffle=False): the
    checks only the whole data can answer (rows enough for every model, two classes) are
    left to the driver, and the classes are the part's own.
    """
    if len(report.classes) > MAX_CLASSES:
        raise ValueError(
            f"label column '{label_col}' has more than {MAX_CLASSES} distinct values; is it a "
            "regression target? Use a regressor for continuous labels"
        )
    n_rows = report.rows
    if n_rows == 0:
        raise ValueError("the DataFrame has no rows; there is nothing to train on")
    if report.bad_labels:
        raise ValueError(
            f"label column '{label_col}' has {report.bad_labels} null or NaN value(s) in "
            f"{n_rows} rows; drop or fill them first, e.g. df.dropna(subset=['{label_col}'])"
        )
    if spec.features_col is not None:
        spec = _vector_spec(spec, report)
    minimum = settings.n_estimators * MIN_ROWS_PER_MODEL
    if whole and n_rows < minimum:
        raise ValueError(
            f"{n_rows} rows are too few for n_estimators={settings.n_estimators}: each model "
            f"needs at least {MIN_ROWS_PER_MODEL} rows, so use n_estimators <= "
            f"{max(1, n_rows // MIN_ROWS_PER_MODEL)} or more data"
        )
    check_max_features(settings, spec.n_features)
    classes = None
    if settings.is_classifier:
        classes = np.array(sorted(report.classes))
        if whole and len(classes) < 2:
            raise ValueError(
                f"label column '{label_col}' has a single class ({classes[0]!r}); a classifier "
                "needs at least two"
            )
    return DataSummary(
        n_rows=n_rows,
        features=spec,
        label_col=label_col,
        label_is_numeric=label_is_numeric,
        classes=classes,
    )


def check_random_state(random_state: Any) -> int:
    """The seed of a fit: `random_state`, or one drawn when it is None."""
    if random_state is None:
        return int(np.random.SeedSequence().generate_state(1)[0] & 0x7FFFFFFF)
    if isinstance(random_state, bool) or not isinstance(random_state, numbers.Integral):
        raise ValueError(
            f"random_state must be an int or None (it seeds Spark's rand), got {random_state!r}"
        )
    if not 0 <= random_state < 2**63:
        raise ValueError(f"random_state must be >= 0, got {random_state}")
    return int(random_state)


def check_max_features(settings: Settings, n_features: int) -> None:
    """A count of features per model must not exceed the data's (0: not known yet)."""
    if isinstance(settings.max_features, int) and 0 < n_features < settings.max_features:
        raise ValueError(
            f"max_features={settings.max_features} but the data has {n_features} features"
        )


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and np.isnan(value))


def _vector_spec(spec: FeatureSpec, report: DataReport) -> FeatureSpec:
    name = spec.features_col
    if report.null_features:
        raise ValueError(
            f"feature column '{name}' is null in {report.null_features} row(s); drop or fill "
            "those rows first"
        )
    low, high = report.min_size, report.max_size
    if low != high:
        raise ValueError(
            f"feature column '{name}' holds vectors of different sizes ({low} to {high}); "
            "every row needs the same number of features"
        )
    if not high:
        raise ValueError(f"feature column '{name}' holds empty vectors; there are no features")
    return FeatureSpec(n_features=int(high), features_col=name)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)
