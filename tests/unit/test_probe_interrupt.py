"""Ctrl-C while the package waits on one of its native threads (issue 8, item 5).

A cloud's probe (its row of ``_native.platforms()``) and ``MetadataWatch`` run requests on
Rust threads that log through pyo3-log, and a log record needs the GIL (always for the
first record of a logger, the "cold log cache", and for every record that passes the level). A wait
on such a thread that held the GIL deadlocked: SIGINT during a probe of a server that
never answers hung for good. Each case runs in a fresh interpreter (a cold log cache,
and pytest's own signal handling untouched); the subprocess timeout only turns a hang
into a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from .conftest import BLOCK_TENSORFLOW

PRELUDE = (
    BLOCK_TENSORFLOW
    + """
import logging, os, signal, socket, sys, threading, time

# A parent that ignores SIGINT (a shell's background job) passes that on.
signal.signal(signal.SIGINT, signal.default_int_handler)
if sys.argv[1] == "debug":
    logging.basicConfig(level=logging.DEBUG)

from tf_failure_handling import _native

PROBES = {row['name']: row.get('probe') for row in _native.platforms()}


CONNECTED = threading.Event()  # a server accepted a connection


def server(answer):
    '''A server on 127.0.0.1 that accepts and then, per connection, calls answer(conn).'''
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    kept = []

    def serve():
        while True:
            conn, _ = listener.accept()
            kept.append(conn)
            CONNECTED.set()
            answer(conn)

    threading.Thread(target=serve, daemon=True).start()
    return "http://127.0.0.1:%d" % listener.getsockname()[1]


def silent(conn):
    '''Accepts, reads nothing, never answers.'''


def hang_up(conn):
    conn.close()


def interrupt_after(seconds, once=None):
    '''SIGINT to this process ``seconds`` after ``once`` is set (default: now).'''
    sent = []

    def fire():
        if once is not None:
            once.wait()
        time.sleep(seconds)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=fire, daemon=True).start()
    return sent


def report(what, **data):
    print("RESULT", what, " ".join(f"{k}={v}" for k, v in data.items()), flush=True)
"""
)

#: How long after SIGINT ``KeyboardInterrupt`` may come out. It takes a wait slice
#: (0.1 s) plus the stopped probe's slice (0.25 s); the bound only has to stay well
#: below what the interrupted call would otherwise take (:data:`BLOCKED`), so that
#: a loaded machine cannot decide the verdict.
PROMPT = 10.0
#: How long the interrupted calls would block without the interrupt.
BLOCKED = 30.0

#: Only turns a hang into a failure; a passing run takes about a second.
HANG = 60.0


def run(tmp_path, body: str, logging_mode: str) -> tuple[dict, subprocess.CompletedProcess]:
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        proc = subprocess.run(
            [sys.executable, str(script), logging_mode],
            env=env,
            capture_output=True,
            text=True,
            timeout=HANG,
            cwd=str(tmp_path),
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung for {HANG:g} s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            what, *pairs = line[len("RESULT ") :].split()
            results[what] = dict(p.split("=", 1) for p in pairs)
    return results, proc


def details(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


LOGGING = ["no-logging-config", "debug"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("logging_mode", LOGGING)
@pytest.mark.parametrize("cloud", ["gce", "aws", "azure"])
def test_sigint_during_a_probe_of_a_silent_server_raises_keyboard_interrupt_promptly(
    tmp_path, cloud, logging_mode
):
    results, proc = run(
        tmp_path,
        f"""
        base = server(silent)
        # Once the probe's request reached the server, the probe is waiting for it.
        sent = interrupt_after(0.1, once=CONNECTED)
        try:
            found = PROBES[{cloud!r}](base, {BLOCKED})
        except KeyboardInterrupt:
            report("interrupted", after=time.monotonic() - sent[0])
        else:
            report("returned", found=found)
        """,
        logging_mode,
    )
    assert proc.returncode == 0, details(proc)
    assert "interrupted" in results, details(proc)
    assert float(results["interrupted"]["after"]) < PROMPT, details(proc)
    assert "panicked" not in proc.stderr, details(proc)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("logging_mode", LOGGING)
def test_a_failing_probe_logs_from_its_thread_and_returns_false(tmp_path, logging_mode):
    # The probe thread's first record needs the GIL while the caller waits.
    results, proc = run(
        tmp_path,
        """
        base = server(hang_up)
        started = time.monotonic()
        found = PROBES["aws"](base, BLOCKED)
        report("returned", found=found, took=time.monotonic() - started)
        """.replace("BLOCKED", str(BLOCKED)),
        logging_mode,
    )
    assert proc.returncode == 0, details(proc)
    assert results["returned"]["found"] == "False", details(proc)
    assert float(results["returned"]["took"]) < PROMPT, details(proc)
    if logging_mode == "debug":
        assert "aws metadata probe /latest/api/token" in proc.stderr, details(proc)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("logging_mode", LOGGING)
def test_sigint_during_wait_while_polling_threads_log_then_close_is_prompt(tmp_path, logging_mode):
    # Every poll fails at once and is logged (at debug; the first kind also warns).
    results, proc = run(
        tmp_path,
        """
        hung = []  # one per request the server hung up on: a failed poll

        def counted(conn):
            hung.append(conn)
            hang_up(conn)

        base = server(counted)
        box = _native.Inbox()
        watch = _native.MetadataWatch("aws", base, box, interval=0.02, request_timeout=1.0)
        while len(hung) < 2:  # polls fail, and log, while we wait
            time.sleep(0.01)
        try:
            sent = interrupt_after(0.2)
            box.recv(BLOCKED)  # the wait for the notice the watch would post
        except KeyboardInterrupt:
            report("interrupted", after=time.monotonic() - sent[0])
        failures = len(hung)
        started = time.monotonic()
        watch.close()
        report("closed", took=time.monotonic() - started, failures=failures)
        """.replace("BLOCKED", str(BLOCKED)),
        logging_mode,
    )
    assert proc.returncode == 0, details(proc)
    assert float(results["interrupted"]["after"]) < PROMPT, details(proc)
    assert int(results["closed"]["failures"]) >= 2, details(proc)
    assert float(results["closed"]["took"]) < PROMPT, details(proc)


@pytest.mark.timeout(120)
def test_sigint_interrupts_close_while_a_polling_thread_is_inside_a_slow_log_handler(tmp_path):
    # close() waits up to two seconds for a thread that cannot stop yet (it is in a
    # log handler); Ctrl-C during that wait raises at once. Polling is stopped by
    # then, and a second close() joins the thread once the handler returns.
    results, proc = run(
        tmp_path,
        """
        entered = threading.Event()

        class Slow(logging.Handler):
            def emit(self, record):
                if threading.current_thread() is not threading.main_thread():
                    entered.set()
                    time.sleep(1.5)

        logging.getLogger("tf_failure_handling").addHandler(Slow())
        # WARNING: the thread's one warning (the first failure of a kind) is its one
        # slow record. At DEBUG each failure also logs a debug line first, so the thread
        # could be in the handler twice in a row (3 s), past the second close's 2 s.
        logging.getLogger("tf_failure_handling").setLevel(logging.WARNING)
        hung = []  # one per request the server hung up on

        def counted(conn):
            hung.append(conn)
            hang_up(conn)

        base = server(counted)
        watch = _native.MetadataWatch("aws", base, interval=0.02, request_timeout=1.0)
        assert entered.wait(30.0)
        started = time.monotonic()
        try:
            sent = interrupt_after(0.2)
            watch.close()
        except KeyboardInterrupt:
            report("interrupted", after=time.monotonic() - sent[0])
        else:
            report("closed", took=time.monotonic() - started)
        watch.close()
        requests = len(hung)
        time.sleep(0.1)  # five intervals: a watch still polling would ask again
        assert len(hung) == requests, "polling went on after close()"
        report("joined", requests=requests)
        """,
        "no-logging-config",
    )
    assert proc.returncode == 0, details(proc)
    assert "interrupted" in results, details(proc)
    assert float(results["interrupted"]["after"]) < PROMPT, details(proc)
    assert "joined" in results, details(proc)


@pytest.mark.timeout(120)
def test_a_thread_left_inside_a_slow_log_handler_does_not_abort_the_exit(tmp_path):
    # At DEBUG each failed request logs a debug line and a warning: the polling thread is
    # in the 1.5 s handler twice in a row, past close()'s 2 s wait for it to stop. The
    # process then exits at once. Before the logging gate (src/python/logs.rs) the
    # thread, left inside the handler, re-attached during finalization and CPython's
    # pthread_exit aborted the process (rc -6). Now close() keeps the package's threads
    # out of logging from then on and waits for the record inside to end: exit 0, and
    # the records after close() are dropped (said once).
    results, proc = run(
        tmp_path,
        """
        entered = threading.Event()
        inside = []

        class Slow(logging.Handler):
            def handle(self, record):
                # No handler lock: the main thread's records do not wait for the thread's.
                self.emit(record)
                return True

            def emit(self, record):
                if threading.current_thread() is not threading.main_thread():
                    inside.append(record.levelname)
                    entered.set()
                    time.sleep(1.5)
                    inside.pop()

        logging.getLogger("tf_failure_handling").addHandler(Slow())
        logging.getLogger("tf_failure_handling").setLevel(logging.DEBUG)
        hung = []  # one per request the server hung up on

        def counted(conn):
            hung.append(conn)
            hang_up(conn)

        base = server(counted)
        watch = _native.MetadataWatch("aws", base, interval=0.02, request_timeout=1.0)
        assert entered.wait(30.0)
        started = time.monotonic()
        watch.close()
        report("closed", took=time.monotonic() - started, inside=len(inside))
        """,
        "debug",
    )
    assert proc.returncode == 0, details(proc)
    assert "closed" in results, details(proc)
    assert results["closed"]["inside"] == "0", "close() returned with a thread in a handler"
    assert "records of the package's own threads are dropped" in proc.stderr, details(proc)
