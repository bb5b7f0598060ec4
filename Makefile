# The two commands of the README: `make demo` and `make test`. Both bootstrap what is
# missing (Java, Open MPI, the .venv with pinned packages, the Horovod build) first.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sparkdist-$(shell cat requirements/lock.txt setup.py | sha256sum | cut -c1-16)
# Tests and demos talk to 127.0.0.1 only.
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: bootstrap system venv horovod test demo lint format bench clean

bootstrap: system venv horovod

system:
	bash init_scripts/install_system.sh

venv: $(STAMP)

$(STAMP): requirements/lock.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/lock.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.sparkdist-*
	touch $@

horovod: venv system
	PYTHON=$(abspath $(PY)) bash init_scripts/install_horovod.sh

test: bootstrap
	$(PY) -m ruff check sparkdist tests benchmarks
	$(PY) -m pytest tests

demo: bootstrap
	$(VENV)/bin/sparkdist demo

lint:
	$(PY) -m ruff check sparkdist tests benchmarks
	$(PY) -m ruff format --check sparkdist tests benchmarks
	shellcheck init_scripts/*.sh conf/*.sh

format:
	$(PY) -m ruff format sparkdist tests benchmarks
	$(PY) -m ruff check --fix sparkdist tests benchmarks

bench: bootstrap
	$(PY) benchmarks/launch_overhead.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
