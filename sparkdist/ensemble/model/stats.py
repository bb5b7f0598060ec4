"""What each model of an ensemble saw and how it did: recorded by the task that trained
it, kept on the fitted model (`estimators_stats_`, `stats_frame()`) and saved with it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EstimatorStats:
    """What one model saw and how it did, recorded by the task that trained it."""

    model_index: int
    partition_id: int
    rows: int
    rows_fit: int
    rows_validation: int
    classes_seen: list[Any] = field(default_factory=list)
    class_indices: list[int] = field(default_factory=list)
    single_class: bool = False
    validation_score: float | None = None
    fit_seconds: float = 0.0
    fit_cpu_seconds: float = 0.0
    fit_started: float = 0.0  # Unix time, to line the models' fits up on one timeline
    task_started: float = 0.0  # Unix time the task's Python function started
    load_seconds: float = 0.0  # receiving the partition's rows and building its matrix
    dump_seconds: float = 0.0  # serializing the fitted model for the driver
    partition_bytes: int = 0
    worker_peak_rss_bytes: int = 0  # peak while this task ran (the worker's, if not resettable)
    worker_rss_before_bytes: int = 0  # the worker's resident memory before it received rows
    worker_peak_rss_loaded_bytes: int = 0  # the worker's peak once its rows were loaded
    versions: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EstimatorStats:
        return cls(**data)
