"""conf/: the Spark configuration loaded into a real Spark (spark-submit with
SPARK_CONF_DIR=conf), the spark-submit example run end to end, and the Databricks cluster
specs kept in step with spark-defaults.conf."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).parents[2]
CONF = REPO / "conf"
BIN = Path(sys.executable).parent


def spark_defaults(include_commented: bool = False) -> dict[str, str]:
    """The settings of conf/spark-defaults.conf (also the commented-out ones if asked)."""
    pattern = (
        r"^#?\s*(spark\.\S+)\s+(\S+)\s*$" if include_commented else r"^(spark\.\S+)\s+(\S+)\s*$"
    )
    return dict(re.findall(pattern, (CONF / "spark-defaults.conf").read_text(), re.M))


def submit_env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SPARK_CONF", "PYSPARK_GATEWAY"))
    }
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        **extra,
    )
    return env


DRIVER_APP = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    from sparkdist import HorovodRunner

    spark = SparkSession.builder.appName("conf-check").getOrCreate()
    sc = spark.sparkContext
    conf = dict(sc.getConf().getAll())
    log4j = sc._jvm.org.apache.logging.log4j.LogManager
    # Arrow with fallback off: this fails instead of silently falling back if Arrow breaks.
    frame = spark.range(1000).selectExpr("id", "id * 2 AS twice").toPandas()
    rank_sum = HorovodRunner(np=2, launcher="direct").run(
        lambda: __import__("os").environ["WORLD_SIZE"]
    )
    print("RESULT " + json.dumps({
        "conf": conf,
        "sql_arrow": spark.conf.get("spark.sql.execution.arrow.pyspark.enabled"),
        "root_level": str(log4j.getRootLogger().getLevel()),
        "dag_level": str(log4j.getLogger("org.apache.spark.scheduler.DAGScheduler").getLevel()),
        "rows": len(frame), "twice": int(frame["twice"].sum()), "world_size": rank_sum,
    }))
    spark.stop()
    """
)


def test_spark_defaults_and_log4j_take_effect(tmp_path):
    app = tmp_path / "conf_check.py"
    app.write_text(DRIVER_APP)
    done = subprocess.run(
        [str(BIN / "spark-submit"), "--master", "local[2]", str(app)],
        env=submit_env(SPARK_CONF_DIR=str(CONF)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(re.search(r"^RESULT (.*)$", done.stdout, re.M).group(1))
    # Every active setting of spark-defaults.conf is in the running Spark's conf.
    expected = spark_defaults()
    assert len(expected) >= 8
    for key, value in expected.items():
        assert result["conf"].get(key) == value, key
    assert result["sql_arrow"] == "true"
    assert (result["rows"], result["twice"], result["world_size"]) == (1000, 999 * 1000, "2")
    # log4j2.properties from SPARK_CONF_DIR: Spark did not fall back to its default profile,
    # the levels are ours, and Spark said nothing at INFO.
    assert "Using Spark's default log4j profile" not in done.stderr
    assert (result["root_level"], result["dag_level"]) == ("WARN", "ERROR")
    assert not re.search(r"^\S+ \S+ INFO ", done.stderr, re.M), done.stderr[-3000:]
    assert "NativeCodeLoader" not in done.stderr


def test_spark_submit_example_runs_a_script(tmp_path):
    script = tmp_path / "train.py"
    out = tmp_path / "out"
    out.mkdir()
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            import torch
            import torch.distributed as dist

            dist.init_process_group("gloo")
            value = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(value)
            with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}"), "w") as f:
                f.write(f"{value.item()} {os.environ['WORLD_SIZE']}")
            """
        )
    )
    done = subprocess.run(
        ["bash", str(CONF / "spark-submit-example.sh"), str(script), "2", "--", str(out)],
        # local[2]: one executor JVM fewer than the example's default local-cluster.
        env=submit_env(PYTHON=sys.executable, MASTER="local[2]"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["rank0", "rank1"]
    assert {p.read_text() for p in out.iterdir()} == {"3.0 2"}
    assert "finished on 2 ranks" in done.stdout + done.stderr
    assert "Using Spark's default log4j profile" not in done.stderr


def test_spark_submit_example_usage_error():
    done = subprocess.run(
        ["bash", str(CONF / "spark-submit-example.sh")],
        env=submit_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "usage:" in done.stderr


def test_databricks_cluster_specs_match_the_conf():
    defaults = spark_defaults(include_commented=True)
    for name in ("databricks-cluster.json", "databricks-cluster-gpu.json"):
        spec = json.loads((CONF / name).read_text())
        assert "-ml-" in spec["spark_version"], name  # an ML runtime (torch, TF, MLflow)
        assert spec["num_workers"] >= 1 and spec["node_type_id"]
        assert "autoscale" not in spec  # barrier stages need a fixed size
        for key, value in spec["spark_conf"].items():
            assert defaults.get(key) == value or key in defaults, (name, key)
            if key in spark_defaults():
                assert spark_defaults()[key] == value, (name, key)
        assert spec["spark_conf"]["spark.dynamicAllocation.enabled"] == "false"
        [script] = spec["init_scripts"]
        destination = script["workspace"]["destination"]
        home = spec["spark_env_vars"]["SPARKDIST_HOME"]
        assert destination == f"{home}/init_scripts/sparkdist_init.sh"
        assert (REPO / "init_scripts" / "sparkdist_init.sh").exists()
    gpu = json.loads((CONF / "databricks-cluster-gpu.json").read_text())
    assert "-gpu-ml-" in gpu["spark_version"]
    assert gpu["spark_conf"]["spark.task.resource.gpu.amount"] == "1"


def test_gpu_discovery_reports_visible_devices():
    done = subprocess.run(
        ["bash", str(CONF / "gpu_discovery.sh")],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "2,5"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0
    assert json.loads(done.stdout) == {"name": "gpu", "addresses": ["0", "1"]}
