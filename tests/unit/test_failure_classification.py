"""Failure classification, checked against TensorFlow 2.21's own functions.

The oracle is ``tensorflow/python/distribute/coordinator/cluster_coordinator.py``:
``_is_worker_failure``, ``_is_ps_failure``, ``_extract_failed_ps_instances`` and
``Cluster._record_and_ignore_transient_ps_failure`` /
``_record_and_ignore_transient_timeouts``. Every row of the truth table is an
error class x wrapper x message x ``TF_PS_HANDLE_UNKNOWN_ERROR`` value, and ours
must give TF's answer (or raise TF's exception type) for both functions.
"""

from __future__ import annotations

import inspect
import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import types
from typing import Any, Callable
from unittest import mock

import pytest
from tf_failure_handling import _errors, _failure, _native

W = "/job:worker/replica:0/task:2"
PS = "GRPC error information from remote target /job:ps/replica:0/task:1"
KELVIN = "\u212a"  # KELVIN SIGN: str.lower() makes it "k"

# Fragments whose presence decides a verdict (TF 2.21's strings).
SPECIFIC = [
    "unknown device",
    "Unknown Device",
    "UNKNOWN DEVICE",
    f"UN{KELVIN}NOWN DEVICE",
    "UNKNOWN DEV\u0130CE",  # İ lowers to "i̇": no match
    "Primary device is not remote",
    "Unable to find the relevant tensor remote_handle",
    "is neither a type of a primitive operation nor a name of a function registered",
    "Graph execution error",
    "Binding inputs to tf.function",
]
MESSAGES = [
    "",
    "/job:worker",
    "/JOB:WORKER",
    PS,
    f"{W} {PS}",
    f"{PS} {W}",
    "GRPC error information from remote target /job:psx",
    "\ud800 /job:worker",  # a lone surrogate: str() works, UTF-8 does not
    *SPECIFIC,
    *(f"{W}: {s}" for s in SPECIFIC),
    *(f"{PS}: {s}" for s in SPECIFIC),
    *(f"{W} {PS}: {s}" for s in SPECIFIC),
]

OP_ERROR_NAMES = sorted(_errors._CODES)  # all 16 TF OpError subclasses
CLASS_NAMES = [
    *OP_ERROR_NAMES,
    "OpError",
    "PSUnavailableError",
    "UnavailableSubclass",
    "OpErrorWithOp",
    "TypeError",
    "OperatorNotAllowedInGraphError",
    "ValueError",
    "MockUnavailable",
    "str",
]
WRAPPERS = ["none", "ClosureInputError", "ClosureAbortedError"]
ENV_VALUES = [None, "0", "1", " 2 "]


@pytest.fixture(scope="module")
def tf() -> Any:
    pytest.importorskip("tensorflow", reason="the oracle is TF's own cluster_coordinator")
    from tensorflow.python.distribute.coordinator import cluster_coordinator as cc
    from tensorflow.python.framework import errors

    class UnavailableSubclass(errors.UnavailableError):
        pass

    return types.SimpleNamespace(cc=cc, errors=errors, UnavailableSubclass=UnavailableSubclass)


@pytest.fixture
def handle_unknown_error(monkeypatch) -> Callable[[Any], None]:
    def set_(value: Any) -> None:
        if value is None:
            monkeypatch.delenv("TF_PS_HANDLE_UNKNOWN_ERROR", raising=False)
        else:
            monkeypatch.setenv("TF_PS_HANDLE_UNKNOWN_ERROR", value)

    set_(None)
    return set_


def make_error(tf: Any, name: str, message: str) -> Any:
    """An instance of ``name`` (a TF class or one of the special cases) saying ``message``."""
    errors = tf.errors
    if name == "OpError":
        return errors.OpError(None, None, message, 2)
    if name == "PSUnavailableError":
        return tf.cc.PSUnavailableError(errors.UnavailableError(None, None, message))
    if name == "UnavailableSubclass":
        return tf.UnavailableSubclass(None, None, message)
    if name == "OpErrorWithOp":
        # str() of an OpError with an op appends the op's stack: no shortcut applies.
        op = types.SimpleNamespace(name="op", traceback=[], _original_op=None)
        return errors.UnavailableError(None, op, message)
    if name == "TypeError":
        return TypeError(message)
    if name == "ValueError":
        return ValueError(message)
    if name == "OperatorNotAllowedInGraphError":  # a TypeError subclass
        return errors.OperatorNotAllowedInGraphError(message)
    if name == "MockUnavailable":
        # Not an exception, but isinstance() says UnavailableError (``__class__``).
        m = mock.MagicMock(spec=errors.UnavailableError)
        m.__str__.return_value = message
        return m
    if name == "str":
        return message
    return getattr(errors, name)(None, None, message)


def wrap(tf: Any, wrapper: str, error: Any) -> Any:
    if wrapper == "none":
        return error
    return getattr(tf.cc, wrapper)(error)


def outcome(fn: Callable[[Any], bool], error: Any) -> Any:
    try:
        return fn(error)
    except Exception as exc:  # noqa: BLE001 -- compared by type with TF's
        return type(exc).__name__


@pytest.mark.parametrize("env", ENV_VALUES, ids=lambda v: f"env={v!r}")
@pytest.mark.parametrize("name", CLASS_NAMES)
def test_truth_table_matches_tf(tf, handle_unknown_error, name, env):
    handle_unknown_error(env)
    mismatches = []
    rows = 0
    for wrapper in WRAPPERS:
        if wrapper != "none" and name in ("str", "MockUnavailable"):
            continue  # TF's wrappers need a real exception (its __traceback__)
        for message in MESSAGES:
            error = wrap(tf, wrapper, make_error(tf, name, message))
            for ours, theirs in (
                (_failure.is_worker_failure, tf.cc._is_worker_failure),
                (_failure.is_ps_failure, tf.cc._is_ps_failure),
            ):
                rows += 1
                got, want = outcome(ours, error), outcome(theirs, error)
                if got != want:
                    mismatches.append((ours.__name__, wrapper, message, got, want))
            # Both verdicts in one call: TF's two functions, PS first.
            rows += 1
            got = outcome(_failure.classify_failure, error)
            want = outcome(lambda e: (tf.cc._is_ps_failure(e), tf.cc._is_worker_failure(e)), error)
            if got != want:
                mismatches.append(("classify_failure", wrapper, message, got, want))
    assert not mismatches, f"{len(mismatches)} of {rows} rows differ: {mismatches[:10]}"


def test_truth_table_has_every_verdict(tf, handle_unknown_error):
    """The table exercises both answers of both functions (a guard on the table itself)."""
    handle_unknown_error("1")
    seen = set()
    for name in CLASS_NAMES:
        for message in MESSAGES:
            e = make_error(tf, name, message)
            seen.add(("worker", tf.cc._is_worker_failure(e)))
            seen.add(("ps", tf.cc._is_ps_failure(e)))
    assert seen == {("worker", True), ("worker", False), ("ps", True), ("ps", False)}


# The order subtleties, spelled out (each is also somewhere in the truth table).
SUBTLETIES = [
    # (description, build(tf) -> error, env, worker, ps)
    (
        "PSUnavailableError is a PS failure whatever its message",
        lambda tf: tf.cc.PSUnavailableError(tf.errors.UnavailableError(None, None, "x")),
        None,
        False,
        True,
    ),
    (
        "a wrapped PSUnavailableError needs the gRPC-from-PS string",
        lambda tf: tf.cc.ClosureInputError(
            tf.cc.PSUnavailableError(tf.errors.UnavailableError(None, None, "x"))
        ),
        None,
        False,
        False,
    ),
    (
        "Graph execution error counts before unwrapping only",
        lambda tf: tf.cc.ClosureAbortedError(
            tf.errors.UnknownError(None, None, "Graph execution error")
        ),
        "1",
        False,
        False,
    ),
    (
        "Graph execution error counts with TF_PS_HANDLE_UNKNOWN_ERROR > 0",
        lambda tf: tf.errors.UnknownError(None, None, "Graph execution error"),
        "1",
        True,
        False,
    ),
    (
        "the wrapper's own message is never searched",
        lambda tf: tf.cc.ClosureInputError(ValueError(f"{W} {PS}")),
        None,
        False,
        False,
    ),
    (
        "a CancelledError needs /job:worker",
        lambda tf: tf.errors.CancelledError(None, None, "Cancelled"),
        None,
        False,
        False,
    ),
    (
        "KELVIN SIGN lowers to k",
        lambda tf: tf.errors.InvalidArgumentError(None, None, f"{W} UN{KELVIN}NOWN DEVICE"),
        None,
        True,
        False,
    ),
]


@pytest.mark.parametrize(
    "build,env,worker,ps", [s[1:] for s in SUBTLETIES], ids=[s[0] for s in SUBTLETIES]
)
def test_order_subtleties(tf, handle_unknown_error, build, env, worker, ps):
    handle_unknown_error(env)
    e = build(tf)
    assert (tf.cc._is_worker_failure(e), tf.cc._is_ps_failure(e)) == (worker, ps)
    assert (_failure.is_worker_failure(e), _failure.is_ps_failure(e)) == (worker, ps)
    assert _failure.classify_failure(e) == (ps, worker)


def test_handle_unknown_error_is_read_per_call(tf, handle_unknown_error):
    e = tf.errors.UnknownError(None, None, "Graph execution error")
    for value, want in [(None, False), ("1", True), ("0", False), ("3", True), ("-1", False)]:
        handle_unknown_error(value)
        assert _failure.is_worker_failure(e) is want is tf.cc._is_worker_failure(e)


def test_malformed_handle_unknown_error(tf, handle_unknown_error):
    """TF raises ValueError for every error; we, only where the value matters."""
    handle_unknown_error("yes")
    graph = tf.errors.UnknownError(None, None, "Graph execution error")
    with pytest.raises(ValueError):
        tf.cc._is_worker_failure(graph)
    with pytest.raises(ValueError):
        _failure.is_worker_failure(graph)
    with pytest.raises(ValueError):
        _failure.classify_failure(graph)
    worker = tf.errors.UnavailableError(None, None, W)
    with pytest.raises(ValueError):
        tf.cc._is_worker_failure(worker)
    assert _failure.is_worker_failure(worker) is True  # the documented difference


def test_raising_str_propagates(tf):
    class Broken(tf.errors.UnavailableError):
        def __str__(self) -> str:
            raise RuntimeError("no message")

    e = Broken(None, None, W)
    for fn in (tf.cc._is_worker_failure, _failure.is_worker_failure):
        with pytest.raises(RuntimeError):
            fn(e)


def test_class_changes_after_first_use(tf):
    """Cached type facts follow changes to a class (``__str__``, ``message``, ``__bases__``)."""

    class Changing(tf.errors.UnavailableError):
        pass

    e = Changing(None, None, W)

    def both() -> tuple:
        ours = (_failure.is_worker_failure(e), _failure.is_ps_failure(e))
        assert ours == (tf.cc._is_worker_failure(e), tf.cc._is_ps_failure(e))
        return ours

    assert both() == (True, False)
    Changing.__str__ = lambda self: PS
    assert both() == (False, True)
    del Changing.__str__
    assert both() == (True, False)
    Changing.message = property(lambda self: "nothing")
    assert both() == (False, False)
    del Changing.message
    Changing.__bases__ = (tf.errors.DeadlineExceededError,)
    assert both() == (False, False)
    Changing.__bases__ = (tf.errors.CancelledError,)
    assert both() == (True, False)
    e._op = types.SimpleNamespace(name="op", traceback=[], _original_op=None)
    assert both() == (True, False)
    e._op, e._message = None, "elsewhere"
    assert both() == (False, False)


def test_wrapper_attribute_edge_cases(tf):
    """``original_exception`` is read the way Python reads it, whatever the wrapper does."""

    def same(e: Any) -> None:
        for ours, theirs in (
            (_failure.is_worker_failure, tf.cc._is_worker_failure),
            (_failure.is_ps_failure, tf.cc._is_ps_failure),
        ):
            assert outcome(ours, e) == outcome(theirs, e)

    w = tf.cc.ClosureInputError(tf.errors.UnavailableError(None, None, W))
    same(w)
    w.original_exception = tf.errors.UnavailableError(None, None, PS)
    same(w)
    del w.original_exception
    same(w)  # AttributeError from both

    class Redirected(tf.cc.ClosureAbortedError):
        @property
        def original_exception(self) -> Any:
            return tf.errors.CancelledError(None, None, W)

        @original_exception.setter
        def original_exception(self, value: Any) -> None:
            pass

    same(Redirected(ValueError("x")))

    class Lookup(tf.cc.ClosureInputError):
        def __getattribute__(self, name: str) -> Any:
            if name == "original_exception":
                return tf.errors.AbortedError(None, None, PS)
            return super().__getattribute__(name)

    same(Lookup(ValueError("x")))


def test_many_types_share_the_cache(tf):
    """More classes than cache slots, classified twice over: still TF's answers."""
    classes = [type(f"E{i}", (tf.errors.AbortedError,), {}) for i in range(200)]
    for _ in range(2):
        for i, cls in enumerate(classes):
            e = cls(None, None, W if i % 2 else PS)
            assert _failure.is_worker_failure(e) is tf.cc._is_worker_failure(e)
            assert _failure.is_ps_failure(e) is tf.cc._is_ps_failure(e)


# ------------------------------------------------------------ PS task extraction

PS_TASK_MESSAGES = [
    "",
    "/job:ps/replica:0/task:1",
    "/job:ps/replica:0/task:",
    "/job:ps/replica:0/task:x1",
    "/job:ps/replica:1/task:2",
    "/job:ps/replica:0/task:12abc",
    "/job:ps/replica:0/task:007",
    "/job:ps/replica:0/task:\u0663",  # ARABIC-INDIC DIGIT THREE: not [0-9]
    "/job:ps/replica:0/task:/job:ps/replica:0/task:4",
    "a /job:ps/replica:0/task:3 b /job:ps/replica:0/task:0 c /job:ps/replica:0/task:3",
    "/job:ps/replica:0/task:123456789012345678901234567890",
    "\ud800/job:ps/replica:0/task:5",
    f"{PS} and {PS}/device:CPU:0",
]


@pytest.mark.parametrize("message", PS_TASK_MESSAGES)
def test_extract_failed_ps_instances(tf, message):
    # TF's helper of is_ps_failure, kept native for the tests (src/failure.rs).
    got = _native.failed_ps_instances(message)
    assert type(got) is set
    assert got == tf.cc._extract_failed_ps_instances(message)


# ------------------------------------------------------------ transient tolerances


def tf_cluster(num_ps: int, num_workers: int) -> Any:
    """What TF's ``_record_and_ignore_*`` read from ``self``, set up as ``Cluster.__init__`` does.

    The threshold expressions are TF's, verbatim; :func:`test_cluster_init_reads_pinned`
    checks that TF's source still has them.
    """
    c = types.SimpleNamespace()
    c._transient_ps_failures_threshold = int(
        os.environ.get("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", 3)
    )
    c._potential_ps_failures_lock = threading.Lock()
    c._potential_ps_failures_count = [0] * num_ps
    c._transient_timeouts_threshold = int(
        os.environ.get("TF_COORDINATOR_IGNORE_TRANSIENT_TIMEOUTS", num_workers // 10)
    )
    c._transient_timeouts_lock = threading.Lock()
    c._transient_timeouts_count = 0
    return c


def test_cluster_init_reads_pinned(tf):
    source = " ".join(inspect.getsource(tf.cc.Cluster.__init__).split())
    for expected in (
        'self._transient_ps_failures_threshold = int( os.environ.get("TF_COORDINATOR_IGNORE_'
        'TRANSIENT_PS_FAILURES", 3))',
        "self._potential_ps_failures_count = [0] * self._num_ps",
        'self._transient_timeouts_threshold = int( os.environ.get("TF_COORDINATOR_IGNORE_'
        'TRANSIENT_TIMEOUTS", self._num_workers // 10))',
        "self._transient_timeouts_count = 0",
    ):
        assert expected in source


def transient_pool(tf: Any) -> list:
    """Errors the transient counters see, for a cluster of 10 PS tasks."""
    e, cc = tf.errors, tf.cc

    def ps(*tasks: int) -> str:
        return "; ".join(
            f"GRPC error information from remote target /job:ps/replica:0/task:{t}" for t in tasks
        )

    return [
        e.UnavailableError(None, None, ps(0)),
        e.UnavailableError(None, None, ps(1)),
        e.AbortedError(None, None, ps(1, 0)),
        e.UnavailableError(None, None, ps(9, 1)),  # set order {9, 1}: 9 first
        e.UnavailableError(None, None, ps(1, 9)),
        e.InvalidArgumentError(None, None, ps(2) + " unknown device"),
        cc.PSUnavailableError(e.UnavailableError(None, None, "no task named")),
        cc.PSUnavailableError(e.UnavailableError(None, None, ps(3))),
        cc.ClosureInputError(e.UnavailableError(None, None, ps(4))),
        e.UnavailableError(None, None, ps(0, 12)),  # TF: IndexError, after counting 0
        e.UnavailableError(None, None, W),
        e.DeadlineExceededError(None, None, "timeout"),
        e.DeadlineExceededError(None, None, ps(5)),
        cc.ClosureAbortedError(e.DeadlineExceededError(None, None, "timeout")),
        ValueError(ps(6)),
    ]


def tf_state(c: Any) -> tuple:
    return (list(c._potential_ps_failures_count), c._transient_timeouts_count)


def our_state(t: Any) -> tuple:
    state = t.state()
    return (state["ps_failure_counts"], state["timeouts_count"])


TRANSIENT_ENVS = [
    # (TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES, ..._TIMEOUTS, num_workers)
    (None, None, 5),
    (None, None, 25),
    ("1", "1", 25),
    ("2", "3", 5),
    ("0", "0", 100),
    ("-1", "-2", 100),
    (" 4 ", "+5", 10),
    ("100", None, 100),
]


@pytest.mark.parametrize("ps_env,timeouts_env,num_workers", TRANSIENT_ENVS)
def test_transient_counters_match_tf(tf, monkeypatch, ps_env, timeouts_env, num_workers):
    for name, value in (
        ("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", ps_env),
        ("TF_COORDINATOR_IGNORE_TRANSIENT_TIMEOUTS", timeouts_env),
    ):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    theirs = tf_cluster(10, num_workers)
    ours = _failure.TransientFailures(10, num_workers)
    assert ours.state()["ps_threshold"] == theirs._transient_ps_failures_threshold
    assert ours.state()["timeouts_threshold"] == theirs._transient_timeouts_threshold
    pool = transient_pool(tf)
    rng = random.Random(f"{ps_env}-{timeouts_env}-{num_workers}")
    cluster = tf.cc.Cluster
    for step in range(300):
        e = rng.choice(pool)
        for ours_fn, theirs_fn in (
            (
                ours.record_and_ignore_transient_ps_failure,
                cluster._record_and_ignore_transient_ps_failure,
            ),
            (
                ours.record_and_ignore_transient_timeouts,
                cluster._record_and_ignore_transient_timeouts,
            ),
        ):
            got = outcome(ours_fn, e)
            want = outcome(lambda x, f=theirs_fn: f(theirs, x), e)
            assert got == want, (step, ours_fn.__name__, e)
            assert our_state(ours) == tf_state(theirs), (step, e)


def test_transient_thresholds_override_and_malformed_env(monkeypatch):
    monkeypatch.setenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "lots")
    with pytest.raises(ValueError):
        _failure.TransientFailures(2, 4)
    state = _failure.TransientFailures(2, 4, ps_threshold=7, timeouts_threshold=1).state()
    assert (state["ps_threshold"], state["timeouts_threshold"]) == (7, 1)
    monkeypatch.setenv("TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES", "9" * 30)
    state = _failure.TransientFailures(2, 4).state()
    assert state["ps_threshold"] == 2**63 - 1 and state["ps_failure_counts"] == [0, 0]


def test_transient_timeouts_thread_safe():
    t = _failure.TransientFailures(1, 1, timeouts_threshold=10**9)
    e = _errors.make("DeadlineExceededError", "timeout")

    def record() -> None:
        for _ in range(2000):
            assert t.record_and_ignore_transient_timeouts(e) is True

    threads = [threading.Thread(target=record) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert t.state()["timeouts_count"] == 16000


# ------------------------------------------------------------ without TensorFlow

# (class, wrapper, message, TF_PS_HANDLE_UNKNOWN_ERROR, worker, ps): TF 2.21's answers,
# checked against TF by test_no_tf_table_is_tfs when TF is installed.
NO_TF_TABLE = [
    ("UnavailableError", "none", W, None, True, False),
    ("UnavailableError", "none", PS, None, False, True),
    ("UnavailableError", "none", f"{W} {PS}", None, False, True),
    ("AbortedError", "ClosureInputError", W, None, True, False),
    ("AbortedError", "ClosureAbortedError", PS, None, False, True),
    ("InvalidArgumentError", "none", f"{W} Unknown Device", None, True, False),
    ("InvalidArgumentError", "none", f"{PS} unknown device", None, False, True),
    ("InvalidArgumentError", "none", "bad shape", None, False, False),
    ("NotFoundError", "none", f"{W} {SPECIFIC[7]}", None, True, False),
    ("CancelledError", "none", W, None, True, False),
    ("CancelledError", "none", "cancelled", None, False, False),
    ("UnknownError", "none", "Graph execution error", "1", True, False),
    ("UnknownError", "none", "Graph execution error", None, False, False),
    ("UnknownError", "ClosureInputError", "Graph execution error", "1", False, False),
    ("PSUnavailableError", "none", "x", None, False, True),
    ("PSUnavailableError", "ClosureInputError", "x", None, False, False),
    ("TypeError", "none", f"{W} Binding inputs to tf.function", None, True, False),
    ("ValueError", "none", f"{W} {PS}", None, False, False),
    ("DeadlineExceededError", "none", W, None, False, False),
]


def test_no_tf_table_is_tfs(tf, handle_unknown_error):
    for name, wrapper, message, env, worker, ps in NO_TF_TABLE:
        handle_unknown_error(env)
        e = wrap(tf, wrapper, make_error(tf, name, message))
        assert (tf.cc._is_worker_failure(e), tf.cc._is_ps_failure(e)) == (worker, ps), name


_NO_TF_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    sys.modules["tensorflow"] = None  # `import tensorflow` now raises ImportError
    from tf_failure_handling import _errors, _failure

    classes = dict(zip(
        ["CancelledError", "UnknownError", "InvalidArgumentError", "DeadlineExceededError",
         "NotFoundError", "AbortedError", "UnavailableError", "PSUnavailableError",
         "ClosureInputError", "ClosureAbortedError", "TypeError"],
        _failure._error_classes(),
    ))
    assert classes["UnavailableError"] is _errors.module().UnavailableError
    results = []
    for name, wrapper, message, env, _, _ in json.loads(sys.stdin.read()):
        if env is None:
            os.environ.pop("TF_PS_HANDLE_UNKNOWN_ERROR", None)
        else:
            os.environ["TF_PS_HANDLE_UNKNOWN_ERROR"] = env
        if name == "PSUnavailableError":
            e = classes[name](_errors.make("UnavailableError", message))
        elif name in ("TypeError", "ValueError"):
            e = {"TypeError": TypeError, "ValueError": ValueError}[name](message)
        else:
            e = _errors.make(name, message)
        if wrapper != "none":
            e = classes[wrapper](e)
        results.append([_failure.is_worker_failure(e), _failure.is_ps_failure(e)])
    t = _failure.TransientFailures(2, 20)
    ps = _errors.make("UnavailableError", "GRPC error information from remote target "
                      "/job:ps/replica:0/task:1")
    timeout = _errors.make("DeadlineExceededError", "timeout")
    transient = [t.record_and_ignore_transient_ps_failure(ps) for _ in range(4)]
    transient += [t.record_and_ignore_transient_timeouts(timeout) for _ in range(3)]
    assert sys.modules["tensorflow"] is None
    print(json.dumps({"results": results, "transient": transient}))
    """
)


def test_without_tensorflow_uses_stand_ins():
    """With TF's import blocked, the stand-ins classify like TF (a fresh interpreter)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_COORDINATOR_")}
    proc = subprocess.run(
        [sys.executable, "-c", _NO_TF_SCRIPT],
        env=env,
        input=json.dumps(NO_TF_TABLE),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    for row, got in zip(NO_TF_TABLE, out["results"]):
        assert tuple(got) == row[4:], row
    assert len(out["results"]) == len(NO_TF_TABLE)
    assert out["transient"] == [True, True, False, False, True, False, False]


def test_the_classifiers_fast_paths_are_on_in_every_supported_python():
    """The wheel is built for the stable ABI, which hides the type fields the classifier's
    per-type cache reads (``src/python/layout.rs``); they are read where a check at import
    finds CPython's layout. On 3.10-3.13 (``requires-python``) that check must pass, or
    classification silently takes its slow path (no per-type cache)."""

    assert (3, 10) <= sys.version_info[:2] <= (3, 13)
    assert _native._type_layout_known() is True
