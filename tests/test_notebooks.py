"""Notebooks run end to end on local Spark, as they would on Databricks."""

from __future__ import annotations

import runpy
from pathlib import Path

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"


def test_quickstart_notebook(spark, capfd):
    path = NOTEBOOKS / "01_horovodrunner_quickstart.py"
    assert path.read_text().startswith("# Databricks notebook source\n")
    namespace = runpy.run_path(str(path), init_globals={"spark": spark})
    assert namespace["result"]["accuracy"] >= 0.9
    assert namespace["local"]["ranks"] == 2
    out, _ = capfd.readouterr()
    assert "cluster accuracy:" in out and "driver-local accuracy:" in out
