"""Decisions the Rust core makes for the Python threads: the bounds that depend on the
leading notice (the drain bound of ``Action.Save``),
the driver's writes, and the platforms reached only through one dispatch."""

from __future__ import annotations

import ast
import signal
import sys
import time
from pathlib import Path

import pytest
from tf_failure_handling import TerminationConfig, _native
from tf_failure_handling._platforms import clouds, common, kubernetes, platform, slurm

from . import rust_constants as rust

Event = _native.Event
PACKAGE = Path(__file__).resolve().parents[2] / "python" / "tf_failure_handling"


def _core(
    grace: float = 0.0, worker_id=None, num_workers: int = 1, peer_timeout: float = 300.0
) -> _native.ProtocolCore:
    core = _native.HandlerCore()._protocol_core()
    core.configure(
        worker_id=worker_id, num_workers=num_workers, grace_period=grace, peer_timeout=peer_timeout
    )
    return core


def _at(core, now: float):
    """Stops ``core``'s clock at ``now`` (``configure(clock=...)``); returns ``core``."""
    core.configure(clock=lambda: now)
    return core


def _notice(core, now: float, deadline=None, source: str = "test", message: str = "m"):
    """A notice at ``now`` whose deadline (on the same clock) the platform stated, so it
    is the kill too: a source states Unix times, which the core converts as it takes the
    notice (the wall clock read then: :func:`_converted` says how far from ``deadline``
    the core's deadline may be)."""
    unix = None if deadline is None else time.time() + (deadline - now)
    return _at(core, now).handle(_native.Event.Notice(source, message, unix, unix))


def _converted(value: float, expected: float, span: float) -> bool:
    """Whether ``value`` is ``expected`` less at most ``span`` seconds: a time the core
    read its clock for (a Unix deadline it converted, a wait's time left) at most ``span``
    after the moment ``expected`` is for (the test's clock read before the calls, to the
    end of them). A bound, not a race: a loaded host makes ``span`` longer."""
    return expected - span - 1e-6 <= value <= expected + 1e-6


# ------------------------------------------------------------------ one core, two views


def test_the_protocol_core_and_the_handler_core_are_one_resolver():
    """``_protocol_core()`` hands the handler's parts the same decisions the native
    ``run()`` reads: a notice taken through one is the attention of the other, and the
    run counter is one counter. Holding it does not hold the handler."""
    import gc
    import weakref

    class Handler(_native.HandlerCore):  # as the handler is: a subclass, weakly referenced
        pass

    core = Handler()
    protocol = core._protocol_core()
    protocol.configure(worker_id=None, num_workers=1, grace_period=0.0)
    other = core._protocol_core()
    assert not other.attention and not protocol.attention
    assert isinstance(_notice(protocol, 1.0), _native.Action.Lead)
    assert other.attention and protocol.attention and protocol.state()["leading"]
    protocol.run_counter = 7
    protocol.step_done()
    assert core._run_counter == protocol.run_counter == 8
    action = protocol.handle(_native.Event.BeforeStep())
    # The agreed step is the next one (TF: the largest run count + 1).
    assert isinstance(action, _native.Action.Publish) and action.step == 9
    assert other.state() == protocol.state()
    ref = weakref.ref(core)
    del core
    gc.collect()
    assert ref() is None and protocol.attention


# ------------------------------------------------------------------ the retry rule
# Its table tests are the core's (src/retry.rs: the pauses doubling to the bound, the
# minimum of attempts past it, closing and a last attempt); the handler's calls are
# retried inside the protocol object (test_the_drivers_writes_through_the_protocol_core).


def _shares_wait(core, chief: bool) -> float:
    """Seconds a worker's first shares wait lasts, its own part written at once."""
    save = _native.SharesWaits(core, chief=chief)
    save.handle("part_written")
    return save.poll_timeout()


def _merge_start(save):
    """The chief's decision on the merge, its parts all in."""
    save.handle("parts_checked")
    return save.poll()


def test_the_shares_wait_is_bounded_by_the_notice_s_deadline_less_the_exit_s_reserve():
    """Issue 50: the chief's wait for the parts (and a non-chief's for the merge) was at
    least 60 s whatever the notice's deadline. (Its table, with the rule's 4 x own part:
    ``src/shares.rs``; the core's clock is read by ``SharesWaits`` itself.)"""
    t0 = time.monotonic()  # every wait is its value less the time since, at most
    core = _core(grace=0.0)
    core.configure(exit_reserve=5.0)
    # No notice, or one that names no time: the rule (4 x own, at least the minimum).
    assert _converted(_shares_wait(core, True), 60.0, time.monotonic() - t0)
    assert _converted(_shares_wait(core, False), 120.0, time.monotonic() - t0)
    assert _converted(_shares_wait(None, True), 60.0, time.monotonic() - t0)
    _notice(core, time.monotonic())  # a notice that names no time
    assert _converted(_shares_wait(core, True), 60.0, time.monotonic() - t0)
    # Kubernetes' 30 s: 3 s gone, the exit's 5 s reserve left.
    core = _core(grace=0.0)
    core.configure(exit_reserve=5.0)
    t = time.monotonic()
    _notice(core, t - 3.0, t + 27.0)
    assert _converted(_shares_wait(core, True), 22.0, time.monotonic() - t0)
    assert _converted(_shares_wait(core, False), 22.0, time.monotonic() - t0)
    # Into the reserve: the quickest wait there is (one ask, then the error).
    core = _core(grace=0.0)
    core.configure(exit_reserve=5.0)
    _notice(core, time.monotonic(), time.monotonic() + 2.0)
    assert _shares_wait(core, True) == 0.001
    # A grace period names a time too.
    graced = _core(grace=20.0)
    graced.configure(exit_reserve=5.0)
    _notice(graced, time.monotonic())
    assert _converted(_shares_wait(graced, True), 15.0, time.monotonic() - t0)


def test_the_shares_merge_starts_only_when_it_fits_before_the_deadline_less_the_reserve():
    """Issue 60 part 2: a merge cannot be cancelled once started; the chief started it
    whatever the time left. (The estimate, the chief's own part until a merge is
    measured, then the longest measured: ``src/protocol/tests/mod.rs``.)"""
    t0 = time.monotonic()  # every bound is its value less the time since, at most
    core = _core(grace=0.0)
    core.configure(exit_reserve=5.0)
    # No notice: it starts, waited for as the chief waits for the parts.
    save = _native.SharesWaits(core, chief=True)
    save.handle("part_written")
    start = _merge_start(save)
    assert isinstance(start, _native.SharesWaits.Action.Merge)
    assert _converted(start.bound, 60.0, time.monotonic() - t0)
    assert _converted(save.poll_timeout(), 60.0, time.monotonic() - t0), "the merge's bound"
    save.handle("merged")
    # Kubernetes' 30 s, 3 s gone: 22 s left before the reserve.
    t = time.monotonic()
    _notice(core, t - 3.0, t + 27.0)
    fits = _merge_start(_native.SharesWaits(core, chief=True))
    assert isinstance(fits, _native.SharesWaits.Action.Merge)
    assert _converted(fits.bound, 22.0, time.monotonic() - t0)
    # Into the reserve: not started, nothing left.
    late = _core(grace=0.0)
    late.configure(exit_reserve=5.0)
    _notice(late, time.monotonic(), time.monotonic() + 4.0)
    kept = _merge_start(_native.SharesWaits(late, chief=True))
    assert isinstance(kept, _native.SharesWaits.Action.Keep) and kept.left == 0.0
    # Without a handler's core: the rule alone.
    assert isinstance(
        _merge_start(_native.SharesWaits(chief=True)), _native.SharesWaits.Action.Merge
    )


def test_a_sources_unix_deadline_is_converted_once_by_the_core():
    """A source's Unix deadline is converted when the core takes the notice, on its
    clock (the wall clock read then)."""
    core = _at(_core(grace=60.0), 100.0)
    before = time.time()
    core.handle(_native.Event.Notice("test", "m", before + 4.0))
    deadline = core.state()["deadline"]
    assert _converted(deadline, 104.0, time.time() - before), deadline
    # The conversion the other way (a deadline on the core's clock for the sources).
    before = time.time()
    unix = _native.ProtocolCore.unix_time_of(104.0, core)
    assert before + 4.0 - 1e-6 <= unix <= time.time() + 4.0 + 1e-6, (before, unix)


def test_a_worker_that_lost_the_claim_reports_its_own_final_round_plan():
    """Any worker with a notice of its own publishes the final round when its own plan is
    due, leader or not: its state shows that plan (``final_round_at``) and whether it
    published (``published_final``); ``deadline`` stays the leader's."""
    core = _core(grace=60.0, worker_id=1, num_workers=2)
    before = time.time()
    assert isinstance(_notice(core, 100.0, 130.0), _native.Action.Claim)
    span = time.time() - before
    claim = core.poll()
    core.handle(_native.Event.Written(claim.id, False))  # worker 0 holds it
    state = core.state()
    assert not state["leading"] and "deadline" not in state
    assert _converted(state["planned_deadline"], 130.0, span), state
    assert state["final_round_at"] == pytest.approx(state["planned_deadline"] - state["margin"])
    assert state["published_final"] is False
    _at(core, 100.5).handle(_native.Event.StepKey("RUN_TO_CHECKPOINT", "5"))
    core.run_counter = 5
    save = _at(core, 101.0).handle(Event.BeforeStep())
    # Not leading: a PS coordinator's closures would get the peer timeout.
    assert isinstance(save, _native.Action.Save) and save.drain == 300.0
    _at(core, 101.0).handle(Event.Timing())
    assert _at(core, 101.5).handle(Event.Timed()) == 0.5
    saved = core.handle(_native.Event.Saved("RUN_TO_CHECKPOINT"))
    assert isinstance(saved, _native.Action.Countdown)
    assert core.state()["longest_save"] == 0.5, "the save the core timed"
    early = _at(core, state["final_round_at"] - 1.0).handle(Event.BeforeStep())
    assert isinstance(early, _native.Action.Proceed)
    assert core.state()["published_final"] is False
    action = _at(core, state["final_round_at"]).handle(Event.BeforeStep())
    assert isinstance(action, _native.Action.Publish)
    assert action.round == "LAST_RUN_TO_CHECKPOINT"
    assert core.state()["published_final"] is True


# ------------------------------------------------------------------ the PS drain bound


def _drain(core, now: float) -> float:
    """The drain bound of the save the core asks for at ``now`` (``Action.Save``),
    after the local round it publishes first."""
    action = _at(core, now).handle(Event.BeforeStep())
    if isinstance(action, _native.Action.Publish):
        answer = core.handle(Event.Resume())
        while not isinstance(answer, _native.Action.Agreed):
            answer = core.handle(Event.Resume())
        core.run_counter = action.step
        action = core.handle(Event.BeforeStep())
    assert isinstance(action, _native.Action.Save), action
    return action.drain


def test_the_drain_bound_is_the_peer_timeout_without_a_leading_deadline():
    core = _core(peer_timeout=77.0)
    _notice(core, 10.0)  # no grace period, no platform deadline
    assert _drain(core, 10.0) == 77.0


def test_the_drain_bound_leaves_the_longest_save_before_the_deadline():
    # The deadline less now, no save measured yet, and the exit's reserve.
    core = _core(grace=60.0, peer_timeout=77.0)
    before = time.time()
    _notice(core, 0.0, 30.0)
    drain = _drain(core, 10.0)
    assert _converted(drain, 20.0 - rust.EXIT_RESERVE, time.time() - before), drain
    late = _core(grace=60.0, peer_timeout=77.0)
    _notice(late, 0.0, 30.0)
    assert _drain(late, 40.0) == 0.0


# ------------------------------------------------------------------ the driver's writes


def test_the_drivers_writes_through_the_protocol_core():
    """The driver's writes as it makes them, through ``ProtocolCore.handle``/``poll``/
    ``poll_timeout`` (``src/writes.rs`` and ``src/protocol/driver.rs`` have the rows):
    each queued by the event that starts it, retried for the core's bound,
    acknowledgements before the notice's write, a failure due again after the rule's
    pause, and close's last attempts and dropped claim. No assertion depends on how long
    a call takes: the schedule counts on the binding's clock."""
    Kind, Action, Event = _native.ProtocolCore.WriteKind, _native.Action, _native.Event
    peer_timeout = 3.0  # shorter than the transient-failure window: the bound
    assert peer_timeout < rust.TRANSIENT_FAILURE_WINDOW
    core = _core(worker_id=0, num_workers=2, peer_timeout=peer_timeout)
    assert core.poll() is None and core.poll_timeout() is None
    assert isinstance(_notice(core, 0.0, source="a source"), _native.Action.Claim)
    claim = core.poll()
    assert isinstance(claim, Action.Write) and core.poll_timeout() == 0.0
    # Its write pending, a second notice is not taken yet.
    assert isinstance(_notice(core, 0.0), _native.Action.Wait)
    # The call is the core's: the key and value, bounded as a claim is, named for logs.
    assert isinstance(claim.kind, Kind.Claim)
    assert (claim.key, claim.value) == ("TERMINATED_WORKER", "0")
    # (``configure`` answers with that bound: the coordination client's default.)
    assert claim.timeout == core.configure(peer_timeout=peer_timeout) == peer_timeout
    assert claim.what == "claiming TERMINATED_WORKER after the notice from a source"
    assert claim.subject == "a source"
    core.handle(Event.Failed(claim.id))
    retrying = core.poll()
    assert isinstance(retrying, Action.Retrying) and retrying.attempts == 1
    # The pause is the next attempt's time less now, both on the binding's clock: equal
    # to the rule's first pause up to the rounding of that subtraction (a fresh-clone
    # run saw 0.05000000000291038), which depends on the clock's value, not on the rule.
    assert 0.0 < retrying.pause <= rust.RETRY_FIRST_PAUSE + 1e-9
    assert retrying.left <= peer_timeout
    assert 0.0 <= core.poll_timeout() <= retrying.pause
    assert isinstance(
        core.handle(Event.StepKey("RUN_TO_CHECKPOINT", "3")), _native.Action.Acknowledge
    )
    ack = core.poll()  # due at once, and first
    assert isinstance(ack.kind, Kind.Acknowledge)
    assert (ack.key, ack.subject) == (
        "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_0",
        "RUN_TO_CHECKPOINT=3",
    )
    core.handle(Event.Close())
    dropped = core.poll()
    assert isinstance(dropped, Action.Dropped) and dropped.what == claim.what
    assert core.poll_timeout(True) == 0.0 and core.poll().id == ack.id
    core.handle(Event.Failed(ack.id, True))
    gave_up = core.poll()
    assert isinstance(gave_up, Action.WriteGaveUp) and gave_up.attempts == 1
    assert not gave_up.ends_notice and gave_up.key == ack.key
    assert core.poll() is None and core.poll_timeout() is None
    core.handle(Event.Failed(ack.id))
    assert core.poll() is None, "a stale handle changes nothing"


def test_what_follows_a_claim_is_the_cores():
    """A won claim queues its announce, of the message its notice came with, due at
    once; a lost one queues nothing; a claim given up or raised (a bug in its attempt)
    leaves the worker not leading. A superseded handler acknowledges nothing."""
    Kind, Action, Event = _native.ProtocolCore.WriteKind, _native.Action, _native.Event

    def claimed(won):
        core = _core(worker_id=0, num_workers=2)
        _notice(core, 0.0, message="worker 0: m")
        claim = core.poll()
        core.handle(Event.Written(claim.id, won))
        written = core.poll()
        assert isinstance(written, Action.Written) and written.won is won
        assert written.ends_notice is not won
        return core

    core = claimed(True)
    call = core.poll()
    assert isinstance(call, Action.Write)
    assert isinstance(_notice(core, 0.0), _native.Action.Wait)
    assert isinstance(call.kind, Kind.Announce)
    assert (call.key, call.value) == (
        "TF_DEFAULT_PREEMPTION_NOTICE_KEY",
        "worker 0: m",
    )
    assert core.state()["leading"]
    core = claimed(False)
    assert core.poll() is None and not core.state()["leading"]

    for end in ("give up", "raise"):
        core = _core(worker_id=0, num_workers=2, peer_timeout=0.0 if end == "give up" else 3.0)
        _notice(core, 0.0)
        claim = core.poll()
        if end == "give up":
            core.handle(Event.Failed(claim.id))
            assert isinstance(core.poll(), Action.WriteGaveUp)
        else:
            core.handle(Event.Raised(claim.id))
            assert isinstance(core.poll(), Action.Raised)
        assert core.poll() is None and core.poll_timeout(True) == 0.0, end
        assert not core.state()["leading"], end
        core.handle(Event.Written(claim.id, True))
        assert core.poll() is None, "a stale handle"

    core = _core(worker_id=0, num_workers=2)
    core.handle(Event.StepKey("RUN_TO_CHECKPOINT", "3", True))
    assert core.poll() is None, "a newer handler acknowledges"


# ------------------------------------------------------------------ platforms


@pytest.mark.parametrize("p", platform.PLATFORMS, ids=lambda p: p.NAME)
def test_every_platform_is_behind_one_interface(p):
    """A scheduler is one module; the clouds are one class, a row of the core's table each."""
    assert isinstance(p, common.Platform) and p.KIND in ("cloud", "scheduler")
    module = sys.modules[type(p).__module__]
    if p.KIND == "cloud":
        assert module is clouds and p in clouds.CLOUDS
    else:
        assert module.PLATFORM is p


def _environment(**fields) -> platform.Environment:
    fields = {"cloud": None, "metadata_base": None, "scheduler": None, **fields}
    return platform.Environment(device=platform.PlatformDevice.INTERNAL_CPU, **fields)


def test_the_first_scheduler_detected_wins(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert platform._detected("scheduler", platform.settings()) is None
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert platform._detected("scheduler", platform.settings()) is kubernetes.PLATFORM
    monkeypatch.setenv("SLURM_JOB_ID", "12")
    assert platform._detected("scheduler", platform.settings()) is slurm.PLATFORM


def test_a_schedulers_signals_deadline_and_options_come_through_the_dispatch(monkeypatch):
    env = _environment(scheduler="kubernetes", settings={"kubernetes": 45.0})
    assert platform.complete(env, None, None, None, None).signals == (signal.SIGTERM,)
    assert platform.signal_deadlines(env, 1000.0) == (1045.0, 1045.0)
    slurm_env = _environment(scheduler="slurm")
    signals = platform.complete(slurm_env, None, None, None, None).signals
    assert signals == (signal.SIGTERM, signal.SIGUSR1)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    options = platform.attach(slurm_env, TerminationConfig(slurm_requeue=False))
    assert options["slurm"] is False
    asked = []
    monkeypatch.setattr(slurm.PLATFORM, "after_save", lambda *a: asked.append(a))
    recorder = object()
    platform.after_save(env, options, recorder)
    assert asked == []  # not SLURM's environment
    platform.after_save(slurm_env, options, recorder)
    assert asked == [(slurm_env, False, recorder)]


def test_clouds_are_detected_in_tfs_order_and_each_answers_for_itself(monkeypatch):
    """GCE first (TF detects it unconditionally), then AWS and Azure; each cloud's
    ``detect`` is asked with its own configured base, and the first yes wins."""
    assert platform.CLOUDS == ("gce", "aws", "azure")
    asked = []
    for p in platform.PLATFORMS:
        monkeypatch.setattr(
            p, "detect", lambda checked, name=p.NAME: asked.append((name, checked)) or name == "aws"
        )
    checked = {"gce": None, "aws": "http://127.0.0.1:9", "azure": None}
    settings = platform.Settings(forced_cloud=None, checked=checked)
    assert platform._detected("cloud", settings) is clouds.AWS
    assert asked == [("gce", None), ("aws", "http://127.0.0.1:9")]


def test_a_clouds_defaults_come_from_its_row():
    for cloud, gpu_grace, cpu_grace, code in (
        (clouds.GCE, 3600, 0, 143),
        (clouds.AWS, 120, 120, 42),
        (clouds.AZURE, 30, 30, 42),
    ):
        for device, grace in (
            (platform.PlatformDevice.GCE_GPU, gpu_grace),
            (platform.PlatformDevice.GCE_CPU, cpu_grace),
        ):
            env = platform.Environment(
                device=device, cloud=cloud.NAME, metadata_base=None, scheduler=None
            )
            defaults = platform.complete(env, None, None, None, None)
            assert defaults.exit_fn is cloud.defaults(env)["exit_fn"] is cloud.exit_fn
            assert platform.exit_code(defaults.exit_fn) == code
            assert defaults.grace_period == grace
    off = platform.Environment(
        device=platform.PlatformDevice.INTERNAL_GPU, cloud=None, metadata_base=None, scheduler=None
    )
    assert platform.complete(off, None, None, None, None).grace_period == 0
    assert platform.exit_code(platform.complete(off, None, None, None, None).exit_fn) == 42


def _imports(path: Path) -> set:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.update(f"{node.module or ''}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize(
    "path",
    [
        PACKAGE / "handler.py",
        PACKAGE / "_termination_config.py",
        *sorted((PACKAGE / "_protocol").glob("*.py")),
    ],
    ids=lambda p: p.name,
)
def test_the_handler_knows_no_platform_by_name(path):
    schedulers = {type(p).__module__.rsplit(".", 1)[1] for p in platform.PLATFORMS}
    named = {i for i in _imports(path) if i.rsplit(".", 1)[-1] in schedulers}
    assert not named, f"{path.name} imports {sorted(named)}: go through _platforms.platform"


def test_the_exit_guard_waits_only_for_a_kill_the_platform_named():
    """The kill the core names at the exit (``Event.Exiting``: what ``SaveAndExit`` arms
    the exit guard for, in seconds from now) is the notice's own deadline: a grace period
    alone names no kill (TensorFlow's tests set one with nothing ending the process
    then), so the guard is not armed for it. A scheduler's later statement moves it."""
    core = _core(grace=60.0)
    assert core.handle(Event.Exiting()) is None
    _notice(core, 100.0)
    assert core.handle(Event.Exiting()) is None
    fit = core.handle(Event.Fit())
    assert fit[1] == pytest.approx(60.0), "the grace period's deadline, 160"
    assert fit[3] is True, "a grace period: a final round"
    core = _core(grace=60.0)
    before = time.time()
    _notice(core, 100.0, 130.0)  # Kubernetes' 30 s, say
    ends_in = core.handle(Event.Exiting())
    assert _converted(ends_in, 30.0, time.time() - before), ends_in
    assert _at(core, 110.0).handle(Event.Exiting(5.0)) == pytest.approx(5.0)
