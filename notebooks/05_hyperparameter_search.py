# Databricks notebook source
# MAGIC %md
# MAGIC # 5. Hyperparameter search: many independent trials at once with `sparkdist.tune`
# MAGIC
# MAGIC Optuna holds the search on the driver (its samplers, pruners and storage); sparkdist runs
# MAGIC the trials on the cluster, as many at once as the free task slots allow:
# MAGIC
# MAGIC * **single-node trials** (`np=None`): `parallelism` long-lived Spark tasks (one Spark job)
# MAGIC   each run trial after trial, pulling the next one from the driver (XGBoost here);
# MAGIC * **distributed trials** (`np=2`): each trial is a runner job of 2 ranks (torch DDP here),
# MAGIC   and a trial the pruner stops ends on all its ranks.
# MAGIC
# MAGIC The objective is ordinary Optuna code: `trial.suggest_*`, `trial.report`,
# MAGIC `trial.should_prune()`. Every call reaches the driver's study over an authenticated channel.
# MAGIC The same code runs from a classic session or a Spark Connect one.

# COMMAND ----------

import os
import tempfile

try:
    spark  # noqa: B018 - the notebook's SparkSession, on Databricks
except NameError:
    from sparkdist.spark.session import embedded_spark

    spark = embedded_spark(executors=2)

ON_DATABRICKS = "DATABRICKS_RUNTIME_VERSION" in os.environ
try:
    OUTPUT_DIR  # noqa: B018 - set by whoever runs this notebook (the tests do)
except NameError:
    OUTPUT_DIR = "/dbfs/tmp/sparkdist/05_search" if ON_DATABRICKS else tempfile.mkdtemp()
os.makedirs(OUTPUT_DIR, exist_ok=True)

# COMMAND ----------

# MAGIC %md
# MAGIC ## XGBoost, single-node trials
# MAGIC
# MAGIC A small dataset is shared with `sparkdist.tune.share`: it stays on the driver, and each
# MAGIC executor process fetches it once, on the first `data.value` (on a classic session a
# MAGIC broadcast variable works too; a Spark Connect session has none). Each trial trains a
# MAGIC classifier with the suggested parameters and returns the validation log-loss. The search
# MAGIC is logged to MLflow: one parent run, one child run per trial.

# COMMAND ----------

import mlflow
import optuna
from sklearn.datasets import make_classification
from sklearn.model_selection import train_test_split

import sparkdist.tune

x, y = make_classification(n_samples=2_000, n_features=20, n_informative=8, random_state=0)
data = sparkdist.tune.share(train_test_split(x, y, test_size=0.25, random_state=0))


def xgb_objective(trial):
    from sklearn.metrics import log_loss
    from xgboost import XGBClassifier

    x_train, x_valid, y_train, y_valid = data.value
    model = XGBClassifier(
        n_estimators=trial.suggest_int("n_estimators", 20, 100, log=True),
        max_depth=trial.suggest_int("max_depth", 2, 8),
        learning_rate=trial.suggest_float("learning_rate", 0.01, 0.5, log=True),
        subsample=trial.suggest_float("subsample", 0.5, 1.0),
        n_jobs=1,
    )
    model.fit(x_train, y_train)
    return log_loss(y_valid, model.predict_proba(x_valid))


xgb_study = optuna.create_study(
    direction="minimize", sampler=optuna.samplers.TPESampler(seed=0), study_name="xgboost"
)
with mlflow.start_run(run_name="xgboost search") as search_run:
    sparkdist.tune.optimize(xgb_study, xgb_objective, n_trials=6, parallelism=2)
print(f"best log-loss {xgb_study.best_value:.4f} with {xgb_study.best_params}")
xgb_study.trials_dataframe()[["number", "value", "state", "duration"]]

# COMMAND ----------

# MAGIC %md
# MAGIC The study is Optuna's own: `best_trial`, `trials_dataframe()`, its visualisations. Here the
# MAGIC best value so far against the trial number:

# COMMAND ----------

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

values = [t.value for t in xgb_study.trials]
best_so_far = [min(values[: i + 1]) for i in range(len(values))]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(range(len(values)), values, "o", label="trial")
ax.plot(range(len(values)), best_so_far, "-", label="best so far")
ax.set_xlabel("trial")
ax.set_ylabel("validation log-loss")
ax.legend()
fig.tight_layout()
plot_path = os.path.join(OUTPUT_DIR, "xgboost_search.png")
fig.savefig(plot_path)
plt.show()

# COMMAND ----------

# MAGIC %md
# MAGIC ## torch DDP, two ranks per trial, with pruning
# MAGIC
# MAGIC `np=2`: each trial is a `HorovodRunner(np=2)` job, and rank 0's return value is the
# MAGIC trial's value. Rank 0 reports the test accuracy after every epoch; when the pruner says
# MAGIC stop, rank 0 raises `optuna.TrialPruned`, and the runner stops the other rank too.
# MAGIC The two trials are queued by hand (a good and a poor learning rate) so the pruner has
# MAGIC something to compare with; without `enqueue_trial` the sampler picks the rates.

# COMMAND ----------


def ddp_objective(trial):
    import optuna
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from sparkdist.demos.digits import accuracy, load_digits_split, make_model, train_epoch

    lr = trial.suggest_float("lr", 1e-4, 3e-2, log=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    x_train, x_test, y_train, y_test = load_digits_split()
    x_shard, y_shard = torch.from_numpy(x_train[rank::size]), torch.from_numpy(y_train[rank::size])
    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(rank)
    for epoch in range(4):
        train_epoch(model, optimizer, x_shard, y_shard, 32, generator)
        if rank == 0:
            trial.report(accuracy(model.module, x_test, y_test), epoch)
            if trial.should_prune():
                raise optuna.TrialPruned()
    return accuracy(model.module, x_test, y_test)


ddp_study = optuna.create_study(
    direction="maximize",
    sampler=optuna.samplers.TPESampler(seed=0),
    pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=1),
)
ddp_study.enqueue_trial({"lr": 0.01})
ddp_study.enqueue_trial({"lr": 0.0001})
sparkdist.tune.optimize(ddp_study, ddp_objective, n_trials=2, np=2)
for t in ddp_study.trials:
    print(t.number, t.state.name, t.params, f"epochs reported: {len(t.intermediate_values)}")
print(f"best accuracy {ddp_study.best_value:.4f} with lr={ddp_study.best_params['lr']:.4g}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Resuming after the driver restarts
# MAGIC
# MAGIC Give the study an Optuna storage (SQLite here; any database Optuna supports) and load it
# MAGIC again after a restart: the finished trials are kept, and `optimize` runs more.

# COMMAND ----------

storage = f"sqlite:///{os.path.join(OUTPUT_DIR, 'search.db')}"
study = optuna.create_study(study_name="resumable", storage=storage, load_if_exists=True)
sparkdist.tune.optimize(study, xgb_objective, n_trials=1)
resumed = optuna.load_study(study_name="resumable", storage=storage)  # as after a restart
sparkdist.tune.optimize(resumed, xgb_objective, n_trials=1)
print(f"{len(resumed.trials)} trials in the stored study; best {resumed.best_value:.4f}")
