# The two commands the README starts with:
#   make demo   real TF workers on 127.0.0.1 get preempted, save at one agreed step, restart, finish
#   make test   every test: Rust (unit + property), lints, Python unit and integration (real TF,
#               real PS clusters, a real SLURM the tests install and start), TensorFlow's own
#               fault-tolerance tests against ours, and the compatibility ends from the wheel
#               (TF 2.16 on Python 3.10, TF 2.21 on 3.13)
# Each creates what it needs: .venv (TensorFlow CPU, maturin, pytest), the native build,
# and SLURM's daemons (Debian's slurm-wlm and munge, installed with apt-get when missing,
# started and stopped by tests/slurm/conftest.py).

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-installed
# Keras 3 is pinned to the release tf_failure_handling.keras reads its internals from
# (_keras_internals.TESTED_KERAS); TF 2.21 alone would take the newest.
# What TensorFlow's own fault-tolerance tests import (tests/tf_suite: TF's
# multi_process_runner and multi_worker_test_base), not in TF's wheel's requirements.
TF_TEST_DEPS := "portpicker==1.6.*" "dill==0.4.*" "tblib==3.2.*"
DEPS := "tensorflow-cpu==2.21.*" "keras==3.15.*" "tf-keras==2.21.*" "maturin>=1.9.4,<2" pytest pytest-timeout hypothesis ruff "matplotlib>=3.5" \
	$(TF_TEST_DEPS)
# orbit (tests/integration/test_orbit.py) ships only inside tf-models-official, whose
# dependencies pin tensorflow~=2.20 and would replace TF 2.21: installed without them
# (orbit itself needs only tensorflow, tf-keras, absl and numpy, all above).
NO_DEPS := "tf-models-official==2.20.*"
# `make wheel` links through zig (pip's ziglang) for manylinux2014 (glibc 2.17, as
# TensorFlow 2.16's own wheels), not this machine's glibc 2.36 (manylinux_2_34 otherwise).
ZIG := "ziglang==0.13.*"

.PHONY: demo test test-rust test-python pytest-suite tf-suite tf-suite-all compat-ends lint build build-release bench reliability wheel test-compat test-compat-ends clean

$(STAMP): Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(DEPS)
	$(PY) -m pip install --quiet --no-deps $(NO_DEPS)
	$(PY) -m pip install --quiet $(ZIG)
	touch $(STAMP)

# The editable build puts _native.abi3.so into python/tf_failure_handling/; a
# version-specific _native.cpython-*.so left there by an older build would be
# imported before it, so every build removes the old ones first.
build: $(STAMP)
	rm -f python/tf_failure_handling/_native.*.so
	$(VENV)/bin/maturin develop --quiet

build-release: $(STAMP)
	rm -f python/tf_failure_handling/_native.*.so
	$(VENV)/bin/maturin develop --quiet --release

demo: build
	$(PY) demo/run_demo.py

# The Python suite and the compatibility ends (TF 2.16 on Python 3.10, TF 2.21 on
# 3.13, each from the wheel in its own virtualenv) run side by side: each leaves a
# core idle much of the time (waiting on TF processes), and one after the other
# they would not fit CI's 30 minutes. The ends print a line per combination and,
# on a failure, the tail of its log.
test: test-rust lint build wheel
	$(MAKE) --no-print-directory -j3 pytest-suite compat-ends tf-suite

test-rust:
	cargo test --quiet

lint: $(STAMP)
	cargo fmt --check
	cargo clippy --quiet --all-targets -- -D warnings
	cargo clippy --quiet --all-targets --features python -- -D warnings
	cargo clippy --quiet --all-targets --features abi3 -- -D warnings
	$(VENV)/bin/ruff check python tests benches demo examples
	$(VENV)/bin/ruff format --check python tests benches demo examples

test-python: build pytest-suite

# Without a build: `test` builds the extension and the wheel first, one after the
# other (both write the checkout's python/ and target/), then runs these two.
pytest-suite:
	$(PY) -m pytest tests -q --ignore=tests/tf_suite

# TensorFlow's own fault-tolerance tests against our ClusterCoordinator
# (tests/tf_suite: one process per test, as TF's BUILD shards them). Mostly
# waiting on the processes they kill and restart, so it runs beside the suite.
tf-suite:
	$(PY) -m pytest tests/tf_suite -q

# The same with the coordination-service variants of TF's suite too (twice as long).
tf-suite-all:
	TFH_TF_SUITE_CLASSES=all $(PY) -m pytest tests/tf_suite -q

compat-ends:
	$(PY) tests/compat/run_matrix.py --ends

# The README's performance tables, in its order: each bench runs TF's class and
# ours alternately and ends with its table in the README's format ("README, ...").
bench: build-release
	$(PY) benches/bench_run.py
	$(PY) benches/bench_closure_queue.py
	$(PY) benches/bench_coordinator.py
	$(PY) benches/bench_classify.py
	$(PY) benches/bench_notice.py
	$(PY) benches/bench_patch.py
	$(PY) benches/bench_ps_notice.py --repeats 2
	$(PY) benches/bench_records.py --repeats 100

# The long mode of the fault-injection trials (tests/reliability): 10,000 simulated
# trials, 1,000 more with DEBUG logging through a file handler, and 6 real-process
# trials of each of 4 kinds, then the table the README's Reliability section shows.
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
