"""Runs one of TensorFlow's own handler test files, unmodified, as ``__main__``.

``run.py`` writes a two-line executable, ``bazel-tf-handler-suite``, into each run's
folder; that executable (``#!`` the interpreter running ``run.py``) imports this module
and calls :func:`main`. What TensorFlow's multi-process harness needs outside bazel
(``/work/shared/tf_tests/README.md``, found by running it):

* ``multi_process_lib`` re-executes ``sys.argv[0]`` for its forkserver and refuses an
  ``argv[0]`` ending in ``.py``: the executable's name has none, and the forkserver
  runs as ``bazel-tf-handler-suite -c "from multiprocessing..."``, which comes here
  too, loads the test module (its ``test_util.main()`` runs that command and exits);
* the tests pick the RPC layer ``grpc`` only when ``'bazel' in sys.argv[0]``;
* ``patch()`` runs before the test module does (its ``TerminationConfig()`` defaults
  are evaluated when its classes are defined), here, in every process.

Which classes run is chosen by ``TFH_HANDLER_SUITE_IMPL``: ``ours`` patches
(``tf_failure_handling.patch()``), ``tf`` leaves TensorFlow's classes. The main process
prints ``tf_handler_suite: PreemptionCheckpointHandler is <module>.<class>`` on stderr.

What it adds, to read how a test went (``evidence.py``), none of it seen by the tests:

* ``TFH_HANDLER_SUITE_LOG``: every process appends the package's log lines (logger
  ``tf_failure_handling``, INFO) to that file, each with its time and pid, and those
  TensorFlow's logger took from the test file and from TF's ``failure_handling.py``;
* ``TFH_HANDLER_SUITE_EVIDENCE``: the main process wraps ``unittest.TestResult``'s
  ``startTest`` and ``stopTest``: a ``start``/``stop`` line with the test's id goes to
  the log, and at ``stopTest`` (after ``tearDown``, the test's processes joined) the
  test's temporary folder (``get_temp_dir()``: its checkpoints and, beside them, our
  preemption records) is copied into that folder, under the test's id, before
  ``googletest`` deletes it at exit.
"""

from __future__ import annotations

import builtins
import logging
import os
import shutil
import sys
import types
import unittest

IMPL_ENV = "TFH_HANDLER_SUITE_IMPL"
FILE_ENV = "TFH_HANDLER_SUITE_FILE"
LOG_ENV = "TFH_HANDLER_SUITE_LOG"
EVIDENCE_ENV = "TFH_HANDLER_SUITE_EVIDENCE"
IMPLS = ("ours", "tf")
#: The line the main process prints before the tests start.
CLASS_LINE = "tf_handler_suite: PreemptionCheckpointHandler is "
#: Marker lines in the log file: ``<time> pid=<pid> tf_handler_suite start <test id>``.
MARKER = "tf_handler_suite"


def _spawned() -> bool:
    """Whether this process is one multiprocessing started (``-c "from multiprocessing
    ..."``: the forkserver, the resource tracker), not the test run itself."""
    argv = sys.argv[1:]
    return "-c" in argv and argv[argv.index("-c") + 1 :][:1] != []


class _FromFiles(logging.Filter):
    """Passes the records logged from the named source files only."""

    def __init__(self, names: tuple) -> None:
        super().__init__()
        self.names = names

    def filter(self, record: logging.LogRecord) -> bool:
        return os.path.basename(record.pathname) in self.names


def _log_to(path: str, test_file: str) -> logging.Handler:
    """Appends the package's log lines to ``path``, and those of TensorFlow's logger
    that the test file itself or TF's ``failure_handling.py`` logged ("Training
    finished.", "sending sigterm", TF's "Checkpoint finished at path ...")."""
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(
        logging.Formatter("%(created).3f pid=%(process)d %(name)s %(levelname)s %(message)s")
    )
    ours = logging.getLogger("tf_failure_handling")
    ours.addHandler(handler)
    if ours.getEffectiveLevel() > logging.INFO:
        ours.setLevel(logging.INFO)
    tf_handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    tf_handler.setFormatter(handler.formatter)
    tf_handler.addFilter(_FromFiles((os.path.basename(test_file), "failure_handling.py")))
    logging.getLogger("tensorflow").addHandler(tf_handler)
    return handler


def _marker(handler: logging.Handler | None, what: str, test_id: str) -> None:
    if handler is None:
        return
    record = logging.LogRecord(MARKER, logging.INFO, __file__, 0, "%s %s %s", None, None)
    record.args = (MARKER, what, test_id)
    handler.handle(record)


def _keep(folder: str, test: unittest.TestCase) -> None:
    """Copies the test's temporary folder into ``folder``/<test id> (nothing if the test
    made none)."""
    source = getattr(test, "_tempdir", None)
    if not source or not os.path.isdir(source):
        return
    target = os.path.join(folder, test.id())
    shutil.copytree(source, target, dirs_exist_ok=True, ignore_dangling_symlinks=True)


def _observe_results(handler: logging.Handler | None, folder: str | None) -> None:
    """Wraps ``TestResult.startTest``/``stopTest`` (observation only: the result's own
    methods run as before)."""
    start, stop = unittest.TestResult.startTest, unittest.TestResult.stopTest

    def start_test(self, test):
        _marker(handler, "start", test.id())
        return start(self, test)

    def stop_test(self, test):
        try:
            if folder:
                _keep(folder, test)
        except OSError as e:  # the verdict says the evidence is missing
            print(f"{MARKER}: could not keep {test.id()}'s folder: {e}", file=sys.stderr)
        _marker(handler, "stop", test.id())
        return stop(self, test)

    unittest.TestResult.startTest = start_test
    unittest.TestResult.stopTest = stop_test


def _check_implementation(impl: str) -> None:
    from tensorflow.python.distribute.failure_handling import failure_handling

    cls = failure_handling.PreemptionCheckpointHandler
    name = f"{cls.__module__}.{cls.__qualname__}"
    ok = (
        name.startswith("tf_failure_handling.")
        if impl == "ours"
        else name.startswith("tensorflow.")
    )
    if not ok:
        sys.exit(f"{MARKER}: {IMPL_ENV}={impl} but PreemptionCheckpointHandler is {name}")
    print(f"{CLASS_LINE}{name}", file=sys.stderr, flush=True)


def main() -> None:
    impl = os.environ.get(IMPL_ENV, "ours").strip().lower() or "ours"
    if impl not in IMPLS:
        sys.exit(f"{IMPL_ENV}={impl!r}: expected one of {', '.join(IMPLS)}")
    test_file = os.environ.get(FILE_ENV)
    if not test_file or not os.path.isfile(test_file):
        sys.exit(f"{FILE_ENV}={test_file!r}: not a file")
    if impl == "ours":
        # Before the test module defines its classes, in every process.
        import tf_failure_handling

        tf_failure_handling.patch()
    log_path = os.environ.get(LOG_ENV)
    handler = _log_to(log_path, test_file) if log_path else None
    if not _spawned():
        _check_implementation(impl)
        _observe_results(handler, os.environ.get(EVIDENCE_ENV))
    _run_as_main(test_file)


def _run_as_main(path: str) -> None:
    """Runs the file as ``__main__``, as ``python PATH`` would, but leaves
    ``sys.argv[0]`` this executable (``runpy.run_path`` would set it to ``PATH``)."""
    module = types.ModuleType("__main__")
    module.__file__ = path
    module.__builtins__ = builtins
    sys.modules["__main__"] = module
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec")
    exec(code, module.__dict__)
