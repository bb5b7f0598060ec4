# The two commands of the README: `make demo` and `make test`. Both bootstrap what is
# missing (Java, Open MPI, the .venv with pinned packages, the Horovod build) first.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.sparkdist-$(shell cat requirements/lock.txt requirements/no-deps.txt setup.py | sha256sum | cut -c1-16)
# The petastorm side environment: Spark 3.5 / pyarrow 14 / numpy 1.x, where petastorm imports.
PETASTORM_VENV := .venv-petastorm
PETASTORM_REQS := requirements/petastorm-side.txt
PETASTORM_STAMP := $(PETASTORM_VENV)/.sparkdist-$(shell cat $(PETASTORM_REQS) setup.py | sha256sum | cut -c1-16)
# The newest cloudpickle beside the lock's, for tests/runner/test_rank_tracebacks.py (3.1.3 renames
# every pickled function's file to "<dynamic-code>"; rank tracebacks must show source lines anyway).
CLOUDPICKLE_LATEST := .venv-cloudpickle-latest
CLOUDPICKLE_LATEST_VERSION := 3.1.3
CLOUDPICKLE_LATEST_STAMP := $(CLOUDPICKLE_LATEST)/.sparkdist-$(CLOUDPICKLE_LATEST_VERSION)
# Peers only the benchmarks use (Mosaic Streaming), installed beside .venv, not into it.
BENCH_DIR := .bench-streaming
BENCH_REQS := requirements/bench-streaming.txt
BENCH_STAMP := $(BENCH_DIR)/.sparkdist-$(shell cat $(BENCH_REQS) | sha256sum | cut -c1-16)
# Ray on Spark, the peer benchmarks/launch_overhead.py runs through benchmarks/ray_on_spark.py:
# a Python 3.11 environment of its own (Ray's Spark executors and worker nodes run on it).
BENCH_RAY_VENV := .venv-ray
BENCH_RAY_REQS := requirements/bench-ray.txt
BENCH_RAY_STAMP := $(BENCH_RAY_VENV)/.sparkdist-$(shell cat $(BENCH_RAY_REQS) | sha256sum | cut -c1-16)
# The runtime matrix: one environment per supported runtime stack, `.venv-<runtime>`, built from
# requirements/runtimes/<runtime>.txt (its `# python: X.Y` line names the interpreter), where
# `make compat` runs tests/compat/. See docs/getting-started.md ("What is tested").
RUNTIMES := $(sort $(basename $(notdir $(wildcard requirements/runtimes/*.txt))))
COMPAT_REQS := requirements/compat-test.txt
PYENV_ROOT ?= $(HOME)/.pyenv
runtime_reqs = requirements/runtimes/$(1).txt
runtime_version = $(shell sed -n 's/^# python: //p' $(call runtime_reqs,$(1)))
# Python X.Y: pyenv's newest X.Y.* build when there is one, else pythonX.Y on PATH.
runtime_python = $(or $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/$(1).*/bin/python))),$(shell command -v python$(1)))
runtime_stamp = .venv-$(1)/.sparkdist-$(shell cat $(call runtime_reqs,$(1)) $(COMPAT_REQS) setup.py | sha256sum | cut -c1-16)
# Tests and demos talk to 127.0.0.1 only.
export SPARK_LOCAL_IP ?= 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))
# mkdocs-material's banner about its successor, printed on every build.
export NO_MKDOCS_2_WARNING := 1

# The GPU check (tests/gpu/gpu_check.py): on a machine with torch (and a GPU), no Java, no
# pyspark, no venv of ours: the interpreter on PATH unless this checkout's .venv exists.
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_CHECK_TABLE ?= gpu-check.txt
GPU_WHEELS := .gpu-wheels

.PHONY: bootstrap system venv horovod petastorm-side cloudpickle-latest runtimes compat bench-deps bench-ray test demo docs lint format bench clean gpu-check gpu-wheels

bootstrap: system venv horovod

system:
	bash init_scripts/install_system.sh

venv: $(STAMP)

$(STAMP): requirements/lock.txt requirements/no-deps.txt setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/lock.txt
	$(PY) -m pip install -q --no-deps -r requirements/no-deps.txt
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.sparkdist-*
	touch $@

horovod: venv system
	PYTHON=$(abspath $(PY)) bash init_scripts/install_horovod.sh

# A full pinned closure, so --no-deps (see the comment in $(PETASTORM_REQS)).
petastorm-side: $(PETASTORM_STAMP)

$(PETASTORM_STAMP): $(PETASTORM_REQS) setup.py
	test -x $(PETASTORM_VENV)/bin/python || $(PYTHON) -m venv $(PETASTORM_VENV)
	$(PETASTORM_VENV)/bin/python -m pip install -q --no-deps -r $(PETASTORM_REQS)
	$(PETASTORM_VENV)/bin/python -m pip install -q --no-deps --no-build-isolation -e .
	rm -f $(PETASTORM_VENV)/.sparkdist-*
	touch $@

cloudpickle-latest: $(CLOUDPICKLE_LATEST_STAMP)

$(CLOUDPICKLE_LATEST_STAMP): | venv
	rm -rf $(CLOUDPICKLE_LATEST)
	$(PY) -m pip install -q --no-deps --target $(CLOUDPICKLE_LATEST) cloudpickle==$(CLOUDPICKLE_LATEST_VERSION)
	touch $@

# A runtime's environment is rebuilt from nothing when its inputs change (a package left over
# from the previous pins would test a stack no runtime has); pip's cache makes that quick.
# The runtime's packages go in first, then sparkdist with the same file as constraints: a floor
# of ours above what the runtime ships makes this step fail instead of upgrading it.
# --no-compile: byte-compiling every installed module (pyspark, torch) took about half of a
# build from the cache; Python compiles what the tests import, once.
define RUNTIME_ENV
$(call runtime_stamp,$(1)): $(call runtime_reqs,$(1)) $(COMPAT_REQS) setup.py
	rm -rf .venv-$(1)
	$(call runtime_python,$(call runtime_version,$(1))) -m venv .venv-$(1)
	.venv-$(1)/bin/python -m pip install -q --upgrade pip
	.venv-$(1)/bin/python -m pip install -q --no-compile -r $(call runtime_reqs,$(1)) -r $(COMPAT_REQS)
	.venv-$(1)/bin/python -m pip install -q --no-compile -e . -c $(call runtime_reqs,$(1))
	touch $$@

runtime-$(1): $(call runtime_stamp,$(1))

# The compatibility suite on this runtime's stack, with its own Spark and Python; the main
# environment's variables stay out of it.
compat-$(1): runtime-$(1)
	@echo "== compatibility suite on $(1)"
	env -u PYTHONPATH -u SPARK_HOME -u VIRTUAL_ENV \
		PYSPARK_PYTHON=$(abspath .venv-$(1))/bin/python \
		PYSPARK_DRIVER_PYTHON=$(abspath .venv-$(1))/bin/python \
		SPARKDIST_RUNTIME=$(1) \
		.venv-$(1)/bin/python -m pytest tests/compat --confcutdir=tests/compat \
		-p no:cacheprovider --durations=5 -q

.PHONY: runtime-$(1) compat-$(1)
endef
$(foreach runtime,$(RUNTIMES),$(eval $(call RUNTIME_ENV,$(runtime))))

runtimes: $(addprefix runtime-,$(RUNTIMES))

# Every runtime's suite, COMPAT_JOBS at a time (each is mostly waiting on its Spark; two share
# the two cores well), each one's output printed whole when it ends; one that fails does not
# stop the others.
COMPAT_JOBS ?= 2
compat: runtimes
	$(MAKE) --no-print-directory -k -j$(COMPAT_JOBS) --output-sync=target \
		$(addprefix compat-,$(RUNTIMES))

bench-deps: $(BENCH_STAMP)

$(BENCH_STAMP): $(BENCH_REQS) | venv
	rm -rf $(BENCH_DIR)
	$(PY) -m pip install -q --no-deps --target $(BENCH_DIR) -r $(BENCH_REQS)
	touch $@

# Built from nothing when its pins change, like a runtime's environment; --no-compile likewise.
bench-ray: $(BENCH_RAY_STAMP)

$(BENCH_RAY_STAMP): $(BENCH_RAY_REQS)
	rm -rf $(BENCH_RAY_VENV)
	$(call runtime_python,3.11) -m venv $(BENCH_RAY_VENV)
	$(BENCH_RAY_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_RAY_VENV)/bin/python -m pip install -q --no-compile -r $(BENCH_RAY_REQS)
	touch $@

# Modules that mostly wait (on stall and collective timeouts, lost executors and their
# relaunches): `make test` runs them in its last stage, after the runtimes' suites and beside
# the multi-host tests, not on the two workers of the stage before it. In the last clean-clone
# run the multi-host tests took 1,427 s, this lane 1,090 s (the suites 550, these modules 541);
# with the short soak about 100 s shorter there is room for test_elastic_below_min_np (120 s).
BESIDE_CLUSTER := tests/runner/test_stalls_cluster.py tests/elastic/test_elastic_slots.py \
	tests/elastic/test_elastic_stopped_rank.py tests/elastic/test_elastic_relaunch_faults.py \
	tests/runner/test_warm_idle_loss.py tests/runner/test_failure_order.py \
	tests/elastic/test_elastic_seat_lost.py tests/runner/test_stall_start.py \
	tests/elastic/test_elastic_below_min_np.py

test: bootstrap petastorm-side cloudpickle-latest runtimes
	$(PY) -m ruff check sparkdist tests benchmarks
	$(VENV)/bin/lint-imports
	shellcheck init_scripts/*.sh conf/*.sh
	$(PY) -m mkdocs build --strict --quiet --site-dir build/site
	$(PY) -m pytest tests -n 2 --durations=40 --ignore=tests/cluster $(addprefix --ignore=,$(BESIDE_CLUSTER))
	@# The multi-host tests alone, with the runtimes' suites one at a time and then the
	@# modules that mostly wait beside them: all of them mostly wait (on lost hosts and
	@# Spark's timeouts; on Spark), so together they take about what the multi-host tests
	@# take. The output of the lane beside them follows, whole.
	@mkdir -p build
	( $(MAKE) --no-print-directory compat COMPAT_JOBS=1 >build/compat.log 2>&1; suites=$$?; \
		$(PY) -m pytest $(BESIDE_CLUSTER) --durations=10 >build/beside.log 2>&1; beside=$$?; \
		echo "runtimes' suites: exit $$suites; modules beside them: exit $$beside" >>build/beside.log; \
		test $$suites -eq 0 && test $$beside -eq 0 ) & lane=$$!; \
		$(PY) -m pytest tests/cluster --durations=10; cluster=$$?; \
		wait $$lane; beside=$$?; cat build/compat.log build/beside.log; \
		echo "multi-host tests: exit $$cluster; the lane beside them: exit $$beside"; \
		test $$cluster -eq 0 && test $$beside -eq 0

demo: bootstrap
	$(VENV)/bin/sparkdist demo

# The documentation site (MkDocs Material, mkdocs.yml): strict, so a broken link or page fails.
docs: venv
	$(PY) -m mkdocs build --strict --site-dir build/site

lint:
	$(PY) -m ruff check sparkdist tests benchmarks
	$(PY) -m ruff format --check sparkdist tests benchmarks
	$(VENV)/bin/lint-imports
	shellcheck init_scripts/*.sh conf/*.sh

format:
	$(PY) -m ruff format sparkdist tests benchmarks
	$(PY) -m ruff check --fix sparkdist tests benchmarks

# Every script under benchmarks/, each printing its table side by side with the peers (about
# an hour) and writing its rows as JSON into $(BENCH_OUT) (benchmarks/bench_table.py); one
# that fails does not stop the others, and fails the target at the end. Then figures.py draws
# the docs' figures from that JSON into $(BENCH_OUT)/figures (the committed ones are drawn
# from docs/figures/data: see docs/benchmarks.md). ray_on_spark.py runs in .venv-ray, from
# launch_overhead.py; bench_table.py is their shared module.
BENCH_OUT ?= build/bench
BENCH_NOT_RUN := benchmarks/ray_on_spark.py benchmarks/bench_table.py benchmarks/figures.py
bench: bootstrap petastorm-side bench-deps bench-ray
	status=0; for script in $(filter-out $(BENCH_NOT_RUN),$(wildcard benchmarks/*.py)); do \
		echo "== $$script"; SPARKDIST_BENCH_OUT=$(BENCH_OUT) $(PY) $$script || status=1; \
	done; \
	echo "== benchmarks/figures.py"; \
	$(PY) benchmarks/figures.py --data $(BENCH_OUT) --out $(BENCH_OUT)/figures || status=1; \
	exit $$status

# Runs as it is on a GPU machine: builds nothing (see docs/gpu.md).
gpu-check:
	$(GPU_PYTHON) tests/gpu/gpu_check.py --table $(GPU_CHECK_TABLE)

# The wheels gpu-check installs when the GPU image lacks them (Python 3.12, x86_64 Linux),
# into $(GPU_WHEELS)/ (gitignored), to carry with the working tree.
gpu-wheels:
	$(GPU_PYTHON) -m pip download --only-binary=:all: --no-deps --dest $(GPU_WHEELS) \
		--python-version 3.12 --implementation cp --abi cp312 --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
		-r requirements/gpu-check.txt

clean:
	rm -rf $(VENV) $(PETASTORM_VENV) $(CLOUDPICKLE_LATEST) $(addprefix .venv-,$(RUNTIMES)) $(BENCH_DIR) $(BENCH_RAY_VENV) build *.egg-info .pytest_cache
