"""A clean first run: the whole output (stdout and stderr, up to the JVM's exit) of the
real commands has no ERROR line, no Java stack trace, no C++ start-up log from the
ranks, and no warning raised by sparkdist's own use of a framework; yet an error from
Spark during a job is still shown. Each test runs its command in a new process, since
what is checked is how that process's Spark starts and stops."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

JAVA_FRAME = re.compile(r"^\s+at [\w$.]+\(", re.M)
# absl/glog's format (`I0000 00:00:1795414858.524550   26369 port.cc:153] ...`), TensorFlow's
# own (`2026-11-23 06:20:11.123456: I tensorflow/...cc:42] ...`) and absl's start-up notice.
CPP_LOG = re.compile(
    r"^(\[rank \d+\] )?([IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\]"
    r"|\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] \S+:\d+\]"
    r"|WARNING: All log messages before absl::InitializeLog)",
    re.M,
)
# Warnings that sparkdist's own use of Keras and MLflow used to raise, and Spark's
# start-up notes when it does not use the project's log4j2 configuration.
NOISE = (
    "`shuffle=True` was passed",
    "Add type hints to the `predict` method",
    "serialized using CloudPickle",
    "Using Spark's default log4j profile",
    "NativeCodeLoader",
    # MLflow's own INFO lines and its download bar when the demo logs the ensemble.
    "Creating initial MLflow database tables",
    "Inferring model signature",
    "Downloading artifacts",
)


def _run(args: list[str], cwd: Path) -> str:
    env = dict(os.environ)
    for name in ("MLFLOW_TRACKING_URI", "TF_CPP_MIN_LOG_LEVEL", "SPARK_CONF_DIR"):
        env.pop(name, None)
    # capture_output reads until every holder of the pipes is gone: the driver JVM too.
    done = subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    return output


def _assert_clean(output: str) -> None:
    errors = [line for line in output.splitlines() if "ERROR" in line]
    assert not errors, errors[:10]
    assert not JAVA_FRAME.search(output), JAVA_FRAME.search(output)
    assert not CPP_LOG.search(output), CPP_LOG.search(output)
    assert not [text for text in NOISE if text in output], output[-5000:]


def test_demo_output_is_clean(tmp_path):
    output = _run(
        ["-m", "sparkdist", "demo", "--epochs", "2", "--tf-epochs", "1", "--models", "2",
         "--output-dir", str(tmp_path / "out")],
        tmp_path,
    )  # fmt: skip
    _assert_clean(output)
    assert re.search(r"^\[rank 0\] epoch +2 +loss", output, re.M), output[-3000:]
    assert "== Summary" in output
    assert re.search(r"^runner: TensorFlow MWMS +2 ranks +0\.\d+", output, re.M), output[-3000:]
    assert "demo finished" in output


def test_run_output_is_clean(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text("import os\nprint('tiny rank', os.environ['RANK'], flush=True)\n")
    output = _run(["-m", "sparkdist", "run", "--np", "2", str(script)], tmp_path)
    _assert_clean(output)
    assert "[rank 0] tiny rank 0" in output and "[rank 1] tiny rank 1" in output
    assert re.search(r"sparkdist run: \S+tiny.py finished on 2 ranks in [\d.]+s", output)


def test_spark_error_during_a_job_is_still_shown(tmp_path):
    # A job that fails, then an exit that leaves the session to sparkdist's stop.
    script = tmp_path / "failing_job.py"
    script.write_text(
        textwrap.dedent(
            """
            from sparkdist.spark.session import embedded_spark

            spark = embedded_spark(executors=1, app_name="failing-job")
            try:
                spark.sparkContext.parallelize([1, 2], 2).map(lambda x: x / 0).collect()
            except Exception as exc:
                print("job failed:", type(exc).__name__, flush=True)
            """
        )
    )
    output = _run([str(script)], tmp_path)
    assert "job failed: PythonException" in output
    errors = [line for line in output.splitlines() if "ERROR" in line]
    # Spark's summary of the failure, and nothing from stopping Spark afterwards.
    assert any(
        re.search(r"ERROR TaskSetManager: Task \d+ in stage .* aborting job", e) for e in errors
    ), output[-5000:]
    assert all("TaskSetManager" in line for line in errors), errors
    assert not JAVA_FRAME.search(output), output[-5000:]


def test_cpp_log_lines_follow_tf_cpp_min_log_level():
    from sparkdist.native_logs import below_level

    info = "I0000 00:00:1795414858.524550   26369 port.cc:153] oneDNN custom operations are on."
    warning = "W0000 00:00:1795414858.524550   26369 op.cc:7] GeneratorDatasetOp is deprecated"
    error = "E0000 00:00:1795414858.524550   26369 cuda_dnn.cc:8579] Unable to register cuDNN"
    notice = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
    )
    own = "epoch 1 loss 0.5"
    absl_py = "W1123 06:20:11.123456 140234 train.py:42] a Python warning through absl-py"
    hidden = below_level({})  # the default: errors only
    assert [hidden(line) for line in (info, warning, notice, error, own, absl_py)] == [
        True, True, True, False, False, False
    ]  # fmt: skip
    warnings_too = below_level({"TF_CPP_MIN_LOG_LEVEL": "1"})
    assert [warnings_too(line) for line in (info, warning, notice)] == [True, False, False]
    everything = below_level({"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert not any(everything(line) for line in (info, warning, notice, error))


def test_user_log4j_configuration_is_kept(tmp_path):
    from sparkdist.spark.session import LOG4J2_FILE, quiet_log4j_conf

    key = "spark.driver.defaultJavaOptions"
    ours = quiet_log4j_conf({key: "-Xss4m", "spark.driver.extraJavaOptions": "-Da=b"}, {})
    assert ours == {key: f"-Dlog4j2.configurationFile={LOG4J2_FILE.resolve().as_uri()} -Xss4m"}
    assert "rootLogger.level = warn" in LOG4J2_FILE.read_text()
    theirs = "-Dlog4j2.configurationFile=file:/etc/mine.properties"
    assert quiet_log4j_conf({"spark.driver.extraJavaOptions": theirs}, {}) == {}
    assert quiet_log4j_conf({}, {"JAVA_TOOL_OPTIONS": theirs}) == {}
    (tmp_path / "log4j2.properties").write_text("rootLogger.level = info\n")
    assert quiet_log4j_conf({}, {"SPARK_CONF_DIR": str(tmp_path)}) == {}
