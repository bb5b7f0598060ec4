"""The data checks of a fit: what the tasks read, counted and checked.

Bad data fails with a ValueError that names the column and says how to fix it, instead of
surfacing later as a task failure inside a Py4J stack trace. (The parameters are checked
by their table, `ensemble.params`, and the schema by `model.features`, on the driver
before any Spark job.) The data is checked without a pass of its own: the tasks that
spread the rows count what they read (`DataReport`), every training task checks the
totals before it fits (so bad data trains nothing), and the driver raises the error from
the same totals. Without a shuffle (shuffle=False) a task checks the part it read, and
the driver the sum of the parts.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from sparkdist.ensemble.model.features import FeatureSpec
from sparkdist.ensemble.params import Settings

logger = logging.getLogger(__name__)

# Fewer rows than this per model gives models too weak to be worth averaging.
MIN_ROWS_PER_MODEL = 10
# More distinct labels than this is almost surely a regression target.
MAX_CLASSES = 1000


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
