"""A fit's second step: the training job, built on its route (`Shuffled` or `OwnRows`),
run and its rows collected on the driver, one per model trained plus the tasks' reports,
while a progress display counts the models."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from sparkdist.ensemble.fit.partitioning import own_parts, spread
from sparkdist.ensemble.fit.training import (
    RESULT_SCHEMA,
    TrainingPlan,
    train_own_rows,
    train_partition,
)
from sparkdist.ensemble.fit.validation import DataReport
from sparkdist.spark import arrow_jobs

logger = logging.getLogger(__name__)

# Arrow batches of the spread's chunks, as they reach a training task: each row of the
# spread is a chunk of many rows, and a batch is cut at 10,000 rows by default, so
# uncapped a task could receive its whole partition as one batch and hold it twice.
_TRAINING_BATCH_BYTES = 4 * 2**20


@dataclass(frozen=True)
class Shuffled:
    """shuffle=True: a spread stage sends every row at random to its model's training
    task, and every training task receives every source task's report."""

    keys: tuple[int, ...]  # keys[p] is hashed to training partition p
    slots: int | None  # the cluster's task slots, for cutting Parquet files into splits

    n_stages = 2  # the spread, then the training

    @property
    def n_tasks(self) -> int:
        return len(self.keys)

    def training_job(self, df: Any, plan: TrainingPlan) -> Any:
        spread_plan = plan.spread_plan(self.keys)
        chunks = spread(df, plan.features, plan.label_col, spread_plan, self.slots)
        return arrow_jobs.on_each_partition(chunks, partial(train_partition, plan), RESULT_SCHEMA)

    def totals(self, reports: Sequence[DataReport]) -> DataReport:
        """Every task saw the same totals: any one report holds them."""
        return reports[0] if reports else DataReport()


@dataclass(frozen=True)
class OwnRows:
    """shuffle=False: each of `n_tasks` training tasks reads its own part of the data and
    spreads it over its own models; its report counts that part only."""

    n_tasks: int
    n_stages = 1

    def training_job(self, df: Any, plan: TrainingPlan) -> Any:
        spread_plan = plan.spread_plan()
        parts, files = own_parts(df, plan.features, plan.label_col, spread_plan, self.n_tasks)
        train = partial(train_own_rows, plan, spread_plan, self.n_tasks, files)
        return arrow_jobs.on_each_partition(parts, train, RESULT_SCHEMA)

    def totals(self, reports: Sequence[DataReport]) -> DataReport:
        """The parts' reports (each task's last row) add up to the whole data's."""
        return DataReport.combined(reports)


def run_training(df: Any, plan: TrainingPlan, route: Shuffled | OwnRows) -> list[Any]:
    """Run the training job: its rows, one per model trained and the tasks' reports."""
    started = time.perf_counter()
    n_models = plan.settings.n_estimators
    rows = arrow_jobs.collect(
        route.training_job(df, plan),
        f"sparkdist ensemble: {n_models} x {type(plan.estimator).__name__}",
        _TRAINING_BATCH_BYTES,
        unit="models",
        count=arrow_jobs.models_done(
            partial(_models_in_tasks, n_models, route.n_tasks), n_models, route.n_stages
        ),
    )
    logger.info(
        "trained %d models in %.1fs",
        sum(row["model_index"] >= 0 for row in rows),
        time.perf_counter() - started,
    )
    return rows


def _models_in_tasks(n_models: int, n_tasks: int, k: int) -> int:
    """The models the first k training tasks to finish trained at least: task p trains
    models p, p + P, ... (P = n_tasks), so every task trains n_models // P of them and
    the first n_models % P tasks one more."""
    if k >= n_tasks:
        return n_models
    return k * (n_models // n_tasks) + max(0, k - (n_tasks - n_models % n_tasks))
