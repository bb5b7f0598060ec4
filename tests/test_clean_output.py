"""A clean first run: the whole output (stdout and stderr, up to the JVM's exit) of the
real commands has no ERROR line, no Java stack trace, no C++ start-up log from the
ranks, and no warning raised by sparkdist's own use of a framework; yet an error from
Spark during a job is still shown. Each test runs its command in a new process, since
what is checked is how that process's Spark starts and stops. The demo's output is
checked by tests/cli/test_demo.py, on the one demo run of the suite."""

from __future__ import annotations

import re
import textwrap

from output_checks import JAVA_FRAME, assert_clean, run_command


def test_run_output_is_clean(tmp_path):
    script = tmp_path / "tiny.py"
    script.write_text("import os\nprint('tiny rank', os.environ['RANK'], flush=True)\n")
    output = run_command(["-m", "sparkdist", "run", "--np", "2", str(script)], tmp_path)
    assert_clean(output)
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
    output = run_command([str(script)], tmp_path)
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
        True,
        True,
        True,
        False,
        False,
        False,
    ]
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
