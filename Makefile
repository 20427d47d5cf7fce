# The two commands the README starts with, and the everyday loop:
#   make demo   real TF workers on 127.0.0.1 get preempted, save at one agreed step, restart,
#               finish (examples/mwms_custom_loop.py run by examples/launch_local.py)
#   make test   every test: Rust (unit + property), lints, the docs site (--strict), Python unit
#               and integration (real TF, real PS clusters, a real SLURM the tests install and
#               start, every example in examples/, the docs' runnable blocks), TensorFlow's own
#               fault-tolerance and handler tests against ours, and the compatibility ends from the wheel
#               (TF 2.16 on Python 3.10, TF 2.21 on 3.13)
#   make check  the everyday loop, a few minutes: Rust tests, lints, the Python unit tests
#               and one fast real-TensorFlow test per public class (CHECK_TESTS)
# Each first checks the machine (dev/prereqs.py): one line per missing prerequisite, with
# the command that installs it, and nothing starts until they are there.
# Each creates what it needs: .venv (TensorFlow CPU, maturin, pytest, the docs tools), the
# native build, iproute2 for the partition trials (system-deps below) and SLURM's daemons
# (Debian's slurm-wlm and munge, installed with apt-get when missing, started and stopped by
# tests/slurm/conftest.py). Installing from Debian needs root: docs/development.md says why.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-installed
DEMO_STAMP := $(VENV)/.demo-deps-installed
# Keras 3 is pinned to the release tf_failure_handling.keras reads its internals from
# (_integrations.keras_internals.TESTED_KERAS); TF 2.21 alone would take the newest.
# What TensorFlow's own fault-tolerance tests import (tests/tf_suite: TF's
# multi_process_runner and multi_worker_test_base), not in TF's wheel's requirements.
TF_TEST_DEPS := "portpicker==1.6.*" "dill==0.4.*" "tblib==3.2.*"
# The GCS emulator that TensorFlow's own gs:// filesystem talks to in the tests
# (tests/integration/gcs_emulator.py patches around its HTTP quirks, so pinned exactly).
GCS_TEST_DEPS := "gcp-storage-emulator==2026.7.19"
# The docs site (make docs): MkDocs, Material, mkdocstrings. Pinned, because --strict turns
# any new warning of a new release into a failed build (docs/development.md).
DOCS_DEPS := "mkdocs==1.6.1" "mkdocs-material==9.8.2" "mkdocstrings==1.0.8" \
	"mkdocstrings-python==2.0.11" "griffelib==2.4.1" "pymdown-extensions==13.1.2"
# What `make demo` needs: TensorFlow, the build, and matplotlib for the report's picture.
DEMO_DEPS := "tensorflow-cpu==2.21.*" "keras==3.15.*" "maturin>=1.9.4,<2" "matplotlib>=3.5"
# pytest-xdist: `make check` runs the unit tests four at a time (they mostly wait on
# threads and subprocesses: 3.5 min one at a time, 1.5 min so).
DEPS := "tf-keras==2.21.*" pytest pytest-timeout "pytest-xdist==3.*" hypothesis ruff \
	$(TF_TEST_DEPS) $(GCS_TEST_DEPS) $(DOCS_DEPS)
# orbit (tests/integration/test_orbit.py) ships only inside tf-models-official, whose
# dependencies pin tensorflow~=2.20 and would replace TF 2.21: installed without them
# (orbit itself needs only tensorflow, tf-keras, absl and numpy, all above).
NO_DEPS := "tf-models-official==2.20.*"
# `make wheel` links through zig (pip's ziglang) for manylinux2014 (glibc 2.17, as
# TensorFlow 2.16's own wheels), not this machine's glibc 2.36 (manylinux_2_34 otherwise).
ZIG := "ziglang==0.13.*"

.PHONY: demo test check check-python prereqs-demo prereqs-check prereqs-test system-deps docs test-rust test-python pytest-suite pytest-integration pytest-integration-a pytest-integration-b pytest-unit pytest-examples pytest-rest pytest-rest-and-unit test-build compat-venvs slurm-suite tf-suite tf-suite-multi tf-suite-single tf-handler-suite figures tf-suite-all compat-ends lint build build-release bench reliability wheel test-compat test-compat-ends clean

$(DEMO_STAMP): Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(DEMO_DEPS)
	touch $(DEMO_STAMP)

$(STAMP): $(DEMO_STAMP)
	$(PY) -m pip install --quiet $(DEMO_DEPS) $(DEPS)
	$(PY) -m pip install --quiet --no-deps $(NO_DEPS)
	$(PY) -m pip install --quiet $(ZIG)
	touch $(STAMP)

# The editable build puts _native.abi3.so into python/tf_failure_handling/; a
# version-specific _native.cpython-*.so left there by an older build would be
# imported before it, so every build removes the old ones first.
build: $(DEMO_STAMP)
	rm -f python/tf_failure_handling/_native.*.so
	$(VENV)/bin/maturin develop --quiet

build-release: $(STAMP)
	rm -f python/tf_failure_handling/_native.*.so
	$(VENV)/bin/maturin develop --quiet --release

prereqs-demo prereqs-check prereqs-test:
	@$(PYTHON) dev/prereqs.py $(@:prereqs-%=%)

demo: prereqs-demo
	$(MAKE) --no-print-directory build
	$(PY) demo/run_demo.py

# The everyday loop (at most 5 minutes idle on the 2-core machine: docs/development.md).
# One fast real-TensorFlow test per public class and stack: the MWMS handler, the
# watcher, our ClusterCoordinator and a PS preemption, Keras 3 and tf_keras fit, records
# on a file system with a scheme, an input position (track_input, no strategy).
CHECK_TESTS := \
	"tests/integration/test_mwms_handler.py::test_sigterm_saves_at_agreed_step_and_resumes[ours-non_chief]" \
	tests/integration/test_preemption_watcher.py::test_local_mode_sigterm_sets_the_message_and_the_process_lives \
	"tests/integration/test_ps_coordinator.py::test_basic_schedule_join_fetch[ours]" \
	tests/integration/test_ps_preemption.py::test_coordinator_notice_saves_at_one_step_and_resumes \
	tests/integration/test_keras3.py::test_mirrored_strategy_in_one_process_sigterm_and_resume \
	"tests/integration/test_tf_keras.py::test_sigterm_mid_fit_saves_at_one_batch_and_the_restart_ends_as_uninterrupted[non_chief]" \
	tests/integration/test_records_object_store.py::test_records_of_a_ram_checkpoint_are_objects_beside_it \
	"tests/integration/test_input_position.py::test_a_preemption_mid_epoch_trains_every_element_as_uninterrupted[custom-no-strategy]"
check: prereqs-check
	$(MAKE) --no-print-directory $(STAMP) build
	$(MAKE) --no-print-directory -j2 test-rust lint check-python

# Without the README's wheel install test: it needs the wheel, which only make test builds.
check-python:
	$(PY) -m pytest tests/unit -q -n 4 \
		--deselect tests/unit/test_documented_examples.py::test_readme_install_commands_work_as_written
	$(PY) -m pytest $(CHECK_TESTS) -q

# The Python suite, the SLURM jobs, TensorFlow's fault-tolerance suite and the
# compatibility ends (TF 2.16 on Python 3.10, TF 2.21 on 3.13, each from the wheel in its
# own virtualenv) run side by side: each leaves a core idle much of the time (waiting on
# TF processes; the SLURM jobs mostly wait for slurmctld's 30 s time-limit checks). CI gives
# `make test` 90 minutes on 2 cores; it must stay under 45, one after the other they
# would not. The measured wall time (`time make test` from a fresh clone, idle and
# loaded) is in docs/development.md, "How long make test takes". The ends print a line
# per combination and, on a failure, the tail of its log.
# Parts this machine cannot run (no root, no pyenv; outside CI only) are listed in
# build/not-run.txt by prereqs-test, skipped, and named again in the last lines.
# The Rust tests, lint and the docs run in that phase too (not before it): about 3 min
# of a fresh clone's run that kept the other jobs waiting; `make check` is the quick
# verdict on them.
# Each job runs under dev/timed.py, which records its wall and CPU time in
# build/job-times.tsv; the summary prints them, the longest first.
# Before them, the build and the compatibility ends' virtualenvs run side by side: the
# build leaves a core idle much of the time (pip, one crate at a time), and the
# virtualenvs (pip, mostly unpacking TensorFlow) need nothing from it.
TEST_JOBS = $(PY_PARTS) slurm-suite compat-ends tf-suite-multi tf-suite-single tf-handler-suite test-rust lint docs
TEST_NOT_RUN = NOT_RUN="$$(cut -f1 build/not-run.txt | tr "\n" " ")"
test: prereqs-test
	rm -f build/job-times.tsv
	$(MAKE) --no-print-directory -j2 timed-test-build timed-compat-venvs $(TEST_NOT_RUN)
	$(PY) tests/portserver.py -- $(MAKE) --no-print-directory -j12 $(addprefix timed-,$(TEST_JOBS)) $(TEST_NOT_RUN); \
		$(PYTHON) dev/prereqs.py summary test $$?

test-build:
	$(MAKE) --no-print-directory system-deps build wheel

# The job's own make gets no jobserver (it runs one recipe line at a time) but keeps -n.
timed-%:
	@$(PYTHON) dev/timed.py $* env MAKEFLAGS= $(MAKE) --no-print-directory \
		$(if $(findstring n,$(firstword -$(MAKEFLAGS))),-n) $* NOT_RUN="$(NOT_RUN)"

# What the tests need from Debian beyond SLURM (which tests/slurm installs itself):
# iproute2, whose `ip netns` the partition trials use (tests/reliability/processes/
# netns.py). Installed with apt-get when `ip` is missing and this runs as root; otherwise
# one line says so, and those trials skip (fail under CI=true).
system-deps:
	@$(call apt_need,ip,iproute2,the partition trials (ip netns))
	@$(call apt_need,openssl,openssl,the GCS emulator tests (their certificates))

# $(call apt_need,COMMAND,PACKAGE,WHAT NEEDS IT): installs Debian's PACKAGE with apt-get
# when COMMAND is missing and this runs as root; otherwise one line says what will skip.
apt_need = if ! command -v $(1) >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing $(2) for $(3)"; \
			DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(2); \
		else \
			echo "$(2) is missing and cannot be installed (needs root and apt-get): $(3) will skip"; \
		fi; \
	fi

# The docs site into site/, warnings as errors (a broken link or anchor, a page outside
# the navigation, a docstring mkdocstrings cannot read). Needs neither TF nor the build:
# mkdocstrings reads the sources and _native.pyi.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

test-rust:
	MAKEFLAGS= cargo test --quiet

lint: $(STAMP)
	cargo fmt --check
	MAKEFLAGS= cargo clippy --quiet --all-targets -- -D warnings
	MAKEFLAGS= cargo clippy --quiet --all-targets --features python -- -D warnings
	MAKEFLAGS= cargo clippy --quiet --all-targets --features abi3 -- -D warnings
	$(VENV)/bin/ruff check python tests benches demo examples dev
	$(VENV)/bin/ruff format --check python tests benches demo examples dev

test-python: build pytest-suite slurm-suite

# The Python suite, which `make test` runs in five parts side by side (PY_PARTS): in two
# halves, the halves were the last jobs (34 min each at 63cf6f6). The whole run is
# CPU-bound (docs/development.md, "Where the time goes"), so the split mostly balances
# the jobs' ends: the examples are a part of their own since the test clusters' workers
# fork from a server (tests/integration/forkserver.py) and the examples, started as a
# user starts them, were the last job (24 of 27.6 min at b419e76). The parts were
# first tried at cf7312b, where eight MWMS tests
# ran out of a 60 s bound for the workers' first steps with another engineer's
# TensorFlow suite beside it (load 13-20); that bound only turns a hang into a failure
# and is 180 s now (tests/integration/conftest.py, STARTUP_BOUND). Running each half's
# tests two at a time instead (pytest-xdist, at ebe3988) made the run CPU-bound (load
# 12-16 for 30 min, 3405 s of CPU against 2666 s) and no shorter: 38 min 37 s.
# Each part prints its slowest tests (--durations).
PY_PARTS := pytest-integration-a pytest-integration-b pytest-unit pytest-examples pytest-rest
DURATIONS := --durations=10

# Without a build: `test` builds the extension and the wheel first, one after the
# other (both write the checkout's python/ and target/), then runs these parts.
pytest-suite: $(PY_PARTS)

pytest-integration:
	$(PY) -m pytest tests/integration -q

pytest-rest-and-unit:
	$(PY) -m pytest tests -q --ignore=tests/tf_suite --ignore=tests/slurm --ignore=tests/integration

# The same in smaller parts, to run what a change touched.
INTEGRATION_A := $(wildcard tests/integration/test_ps_*.py) tests/integration/test_keras3.py \
	tests/integration/test_tf_keras.py tests/integration/test_orbit.py
pytest-integration-a:
	$(PY) -m pytest $(INTEGRATION_A) -q $(DURATIONS)

pytest-integration-b:
	$(PY) -m pytest tests/integration -q $(DURATIONS) $(addprefix --ignore=,$(INTEGRATION_A))

pytest-unit:
	$(PY) -m pytest tests/unit -q $(DURATIONS)

pytest-examples:
	$(PY) -m pytest tests/examples -q $(DURATIONS)

pytest-rest:
	$(PY) -m pytest tests -q $(DURATIONS) --ignore=tests/tf_suite --ignore=tests/slurm --ignore=tests/integration \
		--ignore=tests/unit --ignore=tests/examples

# A real one-node SLURM (tests/slurm/conftest.py installs and starts it) and jobs on it.
slurm-suite:
	$(if $(filter slurm-suite,$(NOT_RUN)),@echo "slurm-suite: not run (build/not-run.txt says why)",$(PY) -m pytest tests/slurm -q)

# TensorFlow's own fault-tolerance tests against our ClusterCoordinator
# (tests/tf_suite: one process per test, as TF's BUILD shards them). Mostly
# waiting on the processes they kill and restart, so it runs beside the suite.
tf-suite:
	$(PY) -m pytest tests/tf_suite -q

# The same, one job per test class, which `make test` runs side by side: as one job it
# was the last one running on CI (2347 s of a 2604 s run at b045553).
tf-suite-multi:
	TFH_TF_SUITE_CLASSES=MultiWorkerFaultToleranceTest $(PY) -m pytest tests/tf_suite -q

tf-suite-single:
	TFH_TF_SUITE_CLASSES=SingleWorkerFaultToleranceTest $(PY) -m pytest tests/tf_suite -q

# The same with the coordination-service variants of TF's suite too (twice as long).
tf-suite-all:
	TFH_TF_SUITE_CLASSES=all $(PY) -m pytest tests/tf_suite -q

# TensorFlow's own tests of its failure-handling module (failure_handler_test.py and
# gce_failure_handler_test.py, read from ../shared/tf_tests) against our handler, one
# process per test method, with a check that each test that sent a notice saw ours
# receive it and save (tests/tf_handler_suite/run.py; --impl both runs TF's classes too).
tf-handler-suite:
	$(if $(filter tf-handler-suite,$(NOT_RUN)),@echo "tf-handler-suite: not run (build/not-run.txt says why)",$(PY) tests/tf_handler_suite/run.py)

# The two ends of the compatibility matrix from the wheel, side by side (one after the
# other they were make test's last job by about eight minutes, with one core idle).
compat-ends:
	$(if $(filter compat-ends,$(NOT_RUN)),@echo "compat-ends: not run (build/not-run.txt says why)",$(PY) tests/compat/run_matrix.py --ends --jobs 2)

# Their virtualenvs alone (standard library only: it runs before .venv exists).
compat-venvs:
	$(if $(filter compat-ends,$(NOT_RUN)),@echo "compat-venvs: not run (build/not-run.txt says why)",$(PYTHON) tests/compat/run_matrix.py --ends --venvs-only --jobs 2)

# Every table the README and the docs show, regenerated: each bench (release build),
# the reliability trials and the SLURM scenarios, written to docs/figures/ with the
# command, commit, date and machine (benches/figures.py; about an hour on 2 cores).
# tests/unit/test_figures.py fails when a page states a figure none of them contains.
figures: build-release
	$(PY) benches/figures.py
	$(MAKE) --no-print-directory build

# The benches alone, printing their tables: each runs TF's class and ours alternately
# and ends with its table in the docs' format ("README, ...").
bench: build-release
	$(PY) benches/bench_run.py
	$(PY) benches/bench_closure_queue.py
	$(PY) benches/bench_coordinator.py
	$(PY) benches/bench_classify.py
	$(PY) benches/bench_notice.py
	$(PY) benches/bench_patch.py
	$(PY) benches/bench_ps_notice.py --repeats 2
	$(PY) benches/bench_records.py --repeats 100
	$(PY) benches/bench_lost_worker.py
	$(PY) benches/bench_lost_worker_exit.py

# The long mode of the fault-injection trials (tests/reliability): 10,000 simulated
# trials, 1,000 more with DEBUG logging through a file handler, 6 real-process trials
# of each of 4 kinds, 60 of ps_preemption (issue 48: at least 60) and 25 of lost_worker
# (issue 62: at least 20 of our handler, every fifth TensorFlow's), then the table the
# README's Reliability section shows.
reliability: build
	$(PY) tests/reliability/run.py

# The wheel users install without Rust: one stable-ABI (abi3) wheel for CPython
# 3.10-3.13 (README, Install), into dist/, linked through zig (ZIG above).
wheel: $(STAMP)
	rm -f dist/tf_failure_handling-*.whl
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/maturin build --quiet --release --zig \
		--compatibility manylinux2014 --out dist -i $(PY)
	ls dist/

# The compatibility matrix (tests/compat/run_matrix.py): one virtualenv per
# TensorFlow x Python combination under .compat/, the wheel from dist/ installed
# (not editable), the unit tests and a real-TF subset; prints the README's matrix.
# Long (each new virtualenv downloads TensorFlow); `make test` runs the ends.
test-compat: wheel
	$(PY) tests/compat/run_matrix.py

# The ends of the range only: the oldest TensorFlow on the oldest Python and the
# newest on the newest.
test-compat-ends: wheel compat-ends

clean:
	rm -rf $(VENV) target .compat dist
