"""PreemptionWatcher without a real cluster.

Multi-worker mode runs on ``testing.InMemoryCoordinationService`` (installed with
``_coordination.use`` in the constructing thread, as the handler tests do) and on
``testing.SimulatedCluster``. Real signals are sent in fresh subprocesses (the
pattern of ``test_signals.py``) so pytest's own signal state is never touched; the
in-process watchers here use ``signals=()``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from tf_failure_handling import PreemptionWatcher, TerminationConfig, testing
from tf_failure_handling._cluster import coordination as _coordination
from tf_failure_handling._platforms import in_process
from tf_failure_handling._platforms.platform import PlatformDevice

from .conftest import BLOCK_TENSORFLOW, NO_METADATA_SERVER, wait_until

KEY = "TF_DEFAULT_PREEMPTION_NOTICE_KEY"
#: Bound for "a notice reaches the watcher": only turns a hang into a failure (how fast
#: it wakes, at once on the key or the signal, is a figure for a bench, not a verdict).
NOTICE_LATENCY = 60.0
#: How long a negative check waits for a message that must not come.
QUIET_PERIOD = 0.3
CLUSTER_TIMEOUT = 60.0


@pytest.fixture
def make_watcher():
    """``make(service=None, **kwargs)``: a watcher (on ``service`` if given), closed at teardown."""
    made: list = []

    def make(service=None, **kwargs):
        kwargs.setdefault("signals", ())
        if service is None:
            w = PreemptionWatcher(**kwargs)
        else:
            with _coordination.use(service):
                w = PreemptionWatcher(**kwargs)
        made.append(w)
        return w

    yield make
    for w in made:
        w.close()


@pytest.fixture
def key_writes(monkeypatch):
    """The value of every attempt to set the notice key in any InMemoryCoordinationService."""
    writes: list = []
    original = testing.InMemoryCoordinationService.set_config_key_value

    def recording(self, key, value):
        if key == KEY:
            writes.append(value)
        return original(self, key, value)

    monkeypatch.setattr(testing.InMemoryCoordinationService, "set_config_key_value", recording)
    return writes


def timed_wait(w, timeout):
    start = time.monotonic()
    message = w.wait(timeout)
    return message, time.monotonic() - start


# ------------------------------------------------------------- multi-worker


def test_message_set_on_the_key_becomes_the_preemption_message(make_watcher):
    service = testing.InMemoryCoordinationService()
    w = make_watcher(service)
    assert w.preemption_message is None
    service.set_config_key_value(KEY, "worker 3: preempted by the test")
    message, _ = timed_wait(w, NOTICE_LATENCY)
    assert message == "worker 3: preempted by the test"
    assert w.preemption_message == message


def test_key_set_before_construction_is_seen(make_watcher):
    service = testing.InMemoryCoordinationService()
    service.set_config_key_value(KEY, "earlier")
    w = make_watcher(service)
    assert w.wait(NOTICE_LATENCY) == "earlier"


def test_without_a_notice_the_message_stays_none(make_watcher):
    service = testing.InMemoryCoordinationService()
    w = make_watcher(service)
    message, elapsed = timed_wait(w, QUIET_PERIOD)
    assert message is None
    assert w.preemption_message is None
    assert elapsed >= QUIET_PERIOD - 0.01
    assert service.value(KEY) is None, "a watcher without a notice must not write the key"


def test_own_notice_is_published_on_the_key(make_watcher, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"task": {"type": "worker", "index": 1}}))
    service = testing.InMemoryCoordinationService()
    w = make_watcher(service)
    assert w._sources.trigger("a test source")
    message = w.wait(NOTICE_LATENCY)
    assert message is not None
    assert message.startswith("worker worker:1: termination notice from a test source at ")
    wait_until(lambda: service.value(KEY) is not None, NOTICE_LATENCY, "the key to be written")
    assert service.value(KEY) == message


def test_later_writer_of_the_key_is_harmless(make_watcher, key_writes):
    """The first notice's message wins everywhere; a second writer's AlreadyExists is swallowed."""
    service = testing.InMemoryCoordinationService()
    first, second = make_watcher(service), make_watcher(service)
    first._sources.trigger("the first source")
    message = first.wait(NOTICE_LATENCY)
    assert message is not None and "the first source" in message
    assert second.wait(NOTICE_LATENCY) == message
    source_thread = second._threads[0]
    assert second._sources.trigger("the second source")
    # The source thread ends after its one notice: the publish attempt is over.
    wait_until(lambda: not source_thread.is_alive(), NOTICE_LATENCY, "the second publish")
    assert len(key_writes) == 2 and "the second source" in key_writes[1], key_writes
    assert service.value(KEY) == message
    assert second.preemption_message == message


def _watching_worker(messages, notices, before_notice=None, steps=30):
    """Worker fn: a watcher, a handler, a barrier, then training until the handler exits."""

    def worker(ctx):
        with _coordination.use(ctx.cluster.service):
            w = PreemptionWatcher(signals=())
        try:
            v = testing.FakeVariable(0.0)
            handler = ctx.handler(testing.FakeCheckpoint(v=v), ctx.checkpoint_dir)
            ctx.all_reduce(0.0)  # every watcher and handler exists
            if before_notice is not None:
                before_notice(ctx, w)
                ctx.all_reduce(0.0)
            for step in range(steps):
                if step == 3 and ctx.index in notices:
                    ctx.cluster.preempt(ctx.index)
                    # The notice is handled before the next step, whatever the machine's speed.
                    wait_until(lambda: handler._notices_handled >= 1, 60.0, "the notice")
                handler.run(lambda: v.assign_add(ctx.all_reduce(1.0)))
            return v.numpy()
        finally:
            messages[ctx.index] = w.wait(NOTICE_LATENCY)
            w.close()

    return worker


@pytest.mark.parametrize("preempted", [(1,), (0, 1)], ids=["one", "both"])
def test_handler_notice_in_a_simulated_cluster_reaches_every_watcher(
    tmp_path, key_writes, preempted
):
    cluster = testing.SimulatedCluster(3, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    messages: dict = {}
    results = cluster.run(_watching_worker(messages, set(preempted)))
    assert [r.exit_code for r in results] == [42, 42, 42], results
    leader = cluster.service.value("TERMINATED_WORKER")
    assert leader is not None and int(leader) in preempted
    assert len(key_writes) == 1, f"the notice key was written {len(key_writes)} times"
    message = key_writes[0]
    assert message.startswith(f"worker {leader}: termination notice from ")
    assert cluster.service.value(KEY) == message
    assert messages == {0: message, 1: message, 2: message}


def test_key_already_set_does_not_disturb_the_handlers(tmp_path, key_writes):
    """A handler that finds the key taken (AlreadyExists) still saves and exits as agreed."""

    def before_notice(ctx, w):
        if ctx.index == 0:
            ctx.cluster.service.set_config_key_value(KEY, "an earlier notice")
        assert w.wait(NOTICE_LATENCY) == "an earlier notice"

    cluster = testing.SimulatedCluster(2, root=tmp_path, timeout=CLUSTER_TIMEOUT)
    messages: dict = {}
    results = cluster.run(_watching_worker(messages, {1}, before_notice))
    assert [r.exit_code for r in results] == [42, 42], results
    assert messages == {0: "an earlier notice", 1: "an earlier notice"}
    assert cluster.service.value(KEY) == "an earlier notice"
    assert len(key_writes) == 2 and key_writes[1].startswith("worker 1: ")
    agreed = cluster.service.value("RUN_TO_CHECKPOINT")
    assert agreed is not None, "the protocol did not run after the AlreadyExists"


# --------------------------------------------------------------- local mode


def test_local_handler_notice_reaches_the_watcher(
    make_watcher, make_handler, no_exit_config, tmp_path
):
    ckpt = testing.FakeCheckpoint(v=testing.FakeVariable(0))
    handler = make_handler(ckpt, tmp_path, no_exit_config)
    w = make_watcher()
    assert w.preemption_message is None
    handler._notify_termination()
    message = w.wait(NOTICE_LATENCY)
    assert message is not None
    assert message.startswith("worker single_worker: termination notice from ")


def test_local_watcher_without_a_notice_stays_none(
    make_watcher, make_handler, no_exit_config, tmp_path
):
    make_handler(testing.FakeCheckpoint(v=testing.FakeVariable(0)), tmp_path, no_exit_config)
    w = make_watcher()
    assert w.wait(QUIET_PERIOD) is None


def test_watcher_fn_of_a_local_handler_reaches_the_watcher(make_watcher, make_handler, tmp_path):
    fire = threading.Event()
    config = TerminationConfig(termination_watcher_fn=fire.is_set, exit_fn=lambda: None)
    make_handler(testing.FakeCheckpoint(v=testing.FakeVariable(0)), tmp_path, config)
    w = make_watcher()
    fire.set()
    message = w.wait(3.0)  # the watcher fn is polled once a second
    assert message is not None and "termination_watcher_fn" in message


# --------------------------------------------------- platform, close, wait


@pytest.mark.parametrize("multi_worker", [False, True], ids=["local", "multi_worker"])
def test_platform_and_block_until_worker_exit_off_borg_tpu(make_watcher, multi_worker):
    service = testing.InMemoryCoordinationService() if multi_worker else None
    w = make_watcher(service)
    assert isinstance(w.platform, PlatformDevice)
    assert w.platform is not PlatformDevice.INTERNAL_TPU
    with _coordination.use(service):
        assert w.block_until_worker_exit() is None  # returns (TF's would block forever)


def test_block_until_worker_exit_on_borg_tpu_ends_when_the_service_goes(make_watcher):
    service = testing.InMemoryCoordinationService()
    w = make_watcher(service)
    w._platform = PlatformDevice.INTERNAL_TPU
    with _coordination.use(service):
        start = time.monotonic()
        w.block_until_worker_exit(timeout=0.3)  # bounded: nothing ends the wait
        assert time.monotonic() - start >= 0.29
    done = threading.Event()

    def block():
        with _coordination.use(service):
            w.block_until_worker_exit(timeout=30.0)
        done.set()

    t = threading.Thread(target=block, daemon=True)
    t.start()
    service.report_error_to_cluster(14, "the workers are gone")  # UnavailableError
    assert done.wait(NOTICE_LATENCY), "block_until_worker_exit did not end when the service went"
    t.join()


@pytest.mark.parametrize("multi_worker", [False, True], ids=["local", "multi_worker"])
def test_close_is_prompt_idempotent_and_stops_the_threads(make_watcher, multi_worker):
    service = testing.InMemoryCoordinationService() if multi_worker else None
    w = make_watcher(service)
    threads = list(w._threads)
    assert len(threads) == (2 if multi_worker else 1)
    assert all(t.is_alive() for t in threads)
    w.close()
    assert not any(t.is_alive() for t in threads)
    w.close()
    assert w.preemption_message is None


def test_context_manager_closes(make_watcher):
    service = testing.InMemoryCoordinationService()
    with make_watcher(service) as w:
        threads = list(w._threads)
        assert all(t.is_alive() for t in threads)
    assert not any(t.is_alive() for t in threads)
    assert w not in list(in_process._subscribers)


def test_no_message_after_close(make_watcher):
    service = testing.InMemoryCoordinationService()
    w = make_watcher(service)
    w.close()
    service.set_config_key_value(KEY, "too late")
    in_process.publish_local("too late")
    w._receive("too late")  # a publish_local that had listed the watcher before close
    assert w.wait(QUIET_PERIOD) is None
    assert w.preemption_message is None


def test_wait_ends_at_close(make_watcher):
    w = make_watcher(testing.InMemoryCoordinationService())
    box: list = []
    t = threading.Thread(target=lambda: box.append(w.wait()), daemon=True)
    t.start()
    w.close()
    t.join(NOTICE_LATENCY)
    assert not t.is_alive(), "wait() without a timeout outlived close()"
    assert box == [None]


def test_wait_returns_a_message_that_is_already_there(make_watcher):
    service = testing.InMemoryCoordinationService()
    w = make_watcher(service)
    service.set_config_key_value(KEY, "m")
    assert w.wait(NOTICE_LATENCY) == "m"
    message, elapsed = timed_wait(w, NOTICE_LATENCY)
    assert message == "m" and elapsed < NOTICE_LATENCY / 2, "waited for a message it had"
    assert w.wait(0) == "m"


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP, 0, 100000])
def test_uncatchable_signals_are_rejected(sig):
    before = len(in_process._subscribers)
    with pytest.raises(ValueError, match="cannot be watched"):
        PreemptionWatcher(signals=[sig])
    assert len(in_process._subscribers) == before


@pytest.mark.parametrize("signals", ["x", "15", 15, [1.5], [None], [True]], ids=repr)
def test_signals_of_the_wrong_type_are_rejected_clearly(signals):
    with pytest.raises((TypeError, ValueError), match="signals"):
        PreemptionWatcher(signals=signals)


def test_constructor_takes_no_positional_arguments():
    with pytest.raises(TypeError):
        PreemptionWatcher(())  # TF's takes no arguments; ours are keyword-only


# ---------------------------------------------------- real signals (subprocess)

PRELUDE = (
    BLOCK_TENSORFLOW
    + """
import json, os, signal, sys, threading, time

from tf_failure_handling import PreemptionWatcher, _native


def emit(kind, **data):
    print("EVENT", json.dumps(dict(data, event=kind)), flush=True)


def wait_for(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.001)
    return predicate()
"""
)


def run_script(tmp_path, body: str, timeout: float = 55.0, env_extra=None):
    """Runs PRELUDE + body in a fresh interpreter; returns (returncode, events, completed)."""
    script = tmp_path / "script.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    for name in list(env):  # no scheduler, no cloud: SIGTERM alone by default
        if name.startswith(("SLURM_", "TF_FAILURE_HANDLING_", "KUBERNETES_")):
            del env[name]
    env["GCE_METADATA_IP"] = NO_METADATA_SERVER
    env["PYTHONUNBUFFERED"] = "1"
    env.update(env_extra or {})
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(tmp_path),
        stdin=subprocess.DEVNULL,
        check=False,
    )
    events = {}
    for line in proc.stdout.splitlines():
        if line.startswith("EVENT "):
            e = json.loads(line[6:])
            events[e.pop("event")] = e
    return proc.returncode, events, proc


def _details(proc) -> str:
    return f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


@pytest.mark.timeout(60)
def test_sigterm_is_the_message_not_the_end_and_close_restores_the_previous_handler(tmp_path):
    rc, events, proc = run_script(
        tmp_path,
        """
        import ctypes

        def sigaction_handler(signum):  # the process's handler: the first field
            buf = ctypes.create_string_buffer(256)
            assert ctypes.CDLL(None).sigaction(signum, None, buf) == 0
            return buf.raw[: ctypes.sizeof(ctypes.c_void_p)]

        got = []
        signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
        python_action = sigaction_handler(signal.SIGTERM)
        w = PreemptionWatcher()
        sent = time.monotonic()
        os.kill(os.getpid(), signal.SIGTERM)
        message = w.wait(30.0)
        latency = time.monotonic() - sent
        wait_for(lambda: got)
        emit("noticed", message=message, latency=latency, python_handler_calls=len(got))
        w.close()
        restored = sigaction_handler(signal.SIGTERM) == python_action
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: len(got) == 2)
        emit(
            "closed",
            python_handler_calls=len(got),
            restored=restored,
            message=w.preemption_message,
        )
        """,
    )
    assert rc == 0, _details(proc)
    noticed = events["noticed"]
    assert noticed["message"] is not None and "SIGTERM" in noticed["message"], events
    assert noticed["message"].startswith("worker local: termination notice from signal SIGTERM")
    assert noticed["python_handler_calls"] == 1, "the previous handler was not chained"
    closed = events["closed"]
    assert closed["python_handler_calls"] == 2
    assert closed["restored"], "the watcher's sigaction is still installed after close()"
    assert closed["message"] == noticed["message"]


@pytest.mark.timeout(60)
def test_sigterm_does_not_kill_while_open_and_kills_after_close(tmp_path):
    rc, events, proc = run_script(
        tmp_path,
        """
        w = PreemptionWatcher()
        os.kill(os.getpid(), signal.SIGTERM)
        emit("alive", message=w.wait(30.0))
        w.close()
        emit("closed")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        emit("survived")
        """,
    )
    assert rc == -signal.SIGTERM, _details(proc)
    assert "SIGTERM" in events["alive"]["message"]
    assert "closed" in events and "survived" not in events


@pytest.mark.timeout(60)
def test_watcher_built_off_the_main_thread_sees_sigterm(tmp_path):
    rc, events, proc = run_script(
        tmp_path,
        """
        box = []
        t = threading.Thread(target=lambda: box.append(PreemptionWatcher()), name="builder")
        t.start()
        t.join()
        w = box[0]
        os.kill(os.getpid(), signal.SIGTERM)
        emit("alive", message=w.wait(30.0))
        w.close()
        """,
    )
    assert rc == 0, _details(proc)
    assert "SIGTERM" in events["alive"]["message"]


@pytest.mark.timeout(60)
def test_empty_signals_leave_sigterm_alone(tmp_path):
    rc, events, proc = run_script(
        tmp_path,
        """
        w = PreemptionWatcher(signals=())
        emit("ready")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        emit("survived", message=w.preemption_message)
        """,
    )
    assert rc == -signal.SIGTERM, _details(proc)
    assert "ready" in events and "survived" not in events


@pytest.mark.timeout(60)
def test_sigusr1_when_configured_and_sigterm_then_untouched(tmp_path):
    rc, events, proc = run_script(
        tmp_path,
        """
        w = PreemptionWatcher(signals=[signal.SIGUSR1])
        os.kill(os.getpid(), signal.SIGUSR1)
        emit("noticed", message=w.wait(30.0))
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        emit("survived")
        """,
    )
    assert rc == -signal.SIGTERM, _details(proc)
    assert "SIGUSR1" in events["noticed"]["message"], events
    assert "survived" not in events


@pytest.mark.timeout(60)
def test_sigusr1_counts_by_default_under_slurm(tmp_path):
    rc, events, proc = run_script(
        tmp_path,
        """
        w = PreemptionWatcher()
        os.kill(os.getpid(), signal.SIGUSR1)
        emit("noticed", message=w.wait(30.0))
        w.close()
        """,
        env_extra={"SLURM_JOB_ID": "4242"},
    )
    assert rc == 0, _details(proc)
    assert "SIGUSR1" in events["noticed"]["message"], events
