"""The protocol driver of ``PreemptionCheckpointHandler``: every effect in one place.

The Rust core (``HandlerCore``, ``src/step_resolution.rs``) decides; this class
performs each decision against TensorFlow and owns the threads that feed the core:

* **inputs** arrive in one inbox (``_native.Inbox``, ``src/inbox.rs``), read by one
  loop (:meth:`ProtocolDriver._drive`): notices from every termination source (the
  Rust signal dispatcher and metadata pollers post them directly; the watcher-fn
  poller and ``testing`` from Python), the step keys a leader publishes (the reader
  thread, :meth:`ProtocolDriver._watch_step_keys`, only reads and posts them), a
  reader's failure, and the stop of ``close()``. The training thread is the other
  actor: ``run()``'s check before a step (:meth:`ProtocolDriver._act_before_step`)
  publishes and saves;
* **decisions** come back typed: ``_native.NoticeAction`` (lead, claim, absorb),
  ``_native.StepAction`` (proceed, publish, save), ``_native.KeyAction`` (acknowledge,
  stop), ``_native.SaveAction`` (exit, countdown);
* **effects** (claim, announce, publish, acknowledge, await, save, exit, shutdown
  writes, error reports) each follow one rule when they fail, the table in
  ``src/step_resolution.rs`` ("Failures"): retried within the bound (the driver's
  writes by :meth:`ProtocolDriver._attempt`, between which it keeps taking inputs;
  the training thread's by :meth:`ProtocolDriver._retrying`), then an error naming
  the key and the cause reaches the next ``run()``
  (:meth:`ProtocolDriver._fail_in_background`), so no thread of the handler ends
  without the handler learning of it.

``PreemptionCheckpointHandler`` (``handler.py``) is this class plus the API.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable, Optional

from . import _errors, _native
from ._cluster import membership as _membership
from ._platforms import in_process
from ._platforms import platform as _platform
from ._platforms import slurm as _slurm
from ._platforms import sources as _sources

log = logging.getLogger("tf_failure_handling")

RUN_TO_CHECKPOINT = _native.RUN_TO_CHECKPOINT
LAST_RUN_TO_CHECKPOINT = _native.LAST_RUN_TO_CHECKPOINT
TERMINATED_WORKER = _native.TERMINATED_WORKER
STOP_WATCHER = _native.STOP_WATCHER
PREEMPTION_NOTICE_KEY = _native.PREEMPTION_NOTICE_KEY

PEER_TIMEOUT_ENV = "TF_FAILURE_HANDLING_PEER_TIMEOUT"
#: Longest single blocking get of the step-key reader; it re-checks for shutdown
#: between gets. Shutdown normally releases it at once (``STOP_WATCHER``).
PEER_WATCH_SLICE = 5.0
#: A failed coordination-service call of the protocol is retried after this pause,
#: doubled after each failure up to :data:`RETRY_MAX_PAUSE`, until the protocol's bound
#: has passed: :data:`TRANSIENT_FAILURE_WINDOW`, or less when the peer timeout or the
#: time left before the notice's deadline is shorter.
RETRY_FIRST_PAUSE = 0.05
RETRY_MAX_PAUSE = 1.0
#: Seconds of failing calls after which a failure is not transient. A cluster whose
#: service is in an error state (a peer reported an error) fails every call for good:
#: that error must reach the worker promptly, with its own type, not after the peer
#: timeout (300 s by default).
TRANSIENT_FAILURE_WINDOW = 10.0
#: Bound on joining a watcher thread at shutdown.
THREAD_JOIN_TIMEOUT = 10.0
#: Bound on one coordination-service write that nothing waits for (releasing
#: blocked readers at shutdown, reporting an error, announcing a notice). The
#: protocol's own writes are bounded by the peer timeout (60 s at most).
SHUTDOWN_WRITE_TIMEOUT = 10.0

#: The handler that owns the notices of each worker of this process, keyed by
#: (coordination service, worker id): the newest one built. An older one that is
#: still open hands every notice it sees to it and acts on none.
_owners_lock = threading.RLock()  # RLock: __del__ (GC, any moment) takes it too
_owners: dict = {}


class _Write:
    """One coordination-service write of the driver, retried within ``bound`` seconds.

    The driver never sleeps between attempts: ``due`` is when the next attempt may
    start, and until then the driver takes its inputs (``ProtocolDriver._drive``).
    ``on_done(result)`` and ``on_failed(error)`` return the write that follows (the
    announce after a won claim), or None.
    """

    def __init__(
        self,
        what: str,
        call: Callable[[], Any],
        bound: float,
        on_done: Callable[[Any], Optional[_Write]],
        on_failed: Callable[[BaseException], Optional[_Write]],
        notice: bool,
    ) -> None:
        self.what = what
        self.call = call
        self.bound = bound
        self.on_done = on_done
        self.on_failed = on_failed
        #: Part of handling a notice (claim, announce), not an acknowledgement.
        self.notice = notice
        #: Gets one last attempt at ``close()`` instead of being dropped (the announce:
        #: the claim was won, and peers' watchers learn of the notice only from it).
        self.finish_on_close = False
        self.start = time.monotonic()
        self.due = self.start
        self.pause = RETRY_FIRST_PAUSE
        self.attempts = 0


def _first_due(acks: deque, current: Optional[_Write]) -> Optional[_Write]:
    """The write to attempt now: the oldest due acknowledgement, else the notice's."""
    now = time.monotonic()
    for write in acks:
        if write.due <= now:
            return write
    if current is not None and current.due <= now:
        return current
    return None


def _time_to_next(acks: deque, current: Optional[_Write]) -> Optional[float]:
    """Seconds until the next write is due (0: one is due now), None with none pending."""
    dues = [w.due for w in acks]
    if current is not None:
        dues.append(current.due)
    if not dues:
        return None
    return max(0.0, min(dues) - time.monotonic())


class ProtocolDriver:
    """Performs the core's decisions; mixed into ``PreemptionCheckpointHandler``."""

    def _act_before_step(self, args: tuple, kwargs: dict) -> None:
        """The check before a step: raise a background thread's error, publish, or save."""
        error = self._thread_error
        if error is not None:
            self._thread_error = None
            self._core_set_pending(False)
            raise error
        action = self._core_before_step(self._clock())
        if isinstance(action, _native.StepAction.Publish):
            self._publish(action.round_key, action.step, action.ack_keys)
            if self._ps_poller is not None:
                # The coordinator of a PS cluster saves at the run count it
                # published, in this same check, before scheduling anything more.
                action = self._core_before_step(self._clock())
        if isinstance(action, _native.StepAction.Save):
            self._save_checkpoint_at(action.round_key, action.step, args, kwargs)

    def _check_before_step(self, args: tuple, kwargs: Optional[dict]) -> None:
        """The check before a step of ``run()`` or ``save_checkpoint_if_preempted``, which
        recorded the step's start themselves."""
        try:
            self._act_before_step(args, kwargs or {})
        finally:
            self._core_after_check()

    # ``run(fn, *args, **kwargs)`` is native (HandlerCore.run, src/python/handler.rs):
    # it calls these two only when a notice needs attention or the step failed.

    def _run_with_keywords(
        self, distributed_train_function: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """``run(distributed_train_function=f, ...)``: TF's signature, by keyword."""
        return self.run(distributed_train_function, *args, **kwargs)

    def _run_check(self) -> None:
        """The check before ``run()``'s step. As in TF it is inside the reporting scope:
        a peer that did not acknowledge, or a failed save, reaches every worker."""
        try:
            self._check_before_step((), None)
        except BaseException as error:
            replacement = self._reported(error)
            if replacement is None:
                raise
            raise replacement from error

    def _run_failed(self, error: BaseException) -> BaseException:
        """``run()``'s step raised ``error``: not counted, reported; returns what to raise."""
        self._core_step_failed()
        replacement = self._reported(error)
        if replacement is None:
            return error
        replacement.__cause__ = error
        return replacement

    def _reported(self, error: BaseException) -> Optional[BaseException]:
        """Reports ``error`` to the cluster (outside local mode); the error to raise in
        its place, or None to raise ``error`` itself."""
        if self._local_mode:
            return None
        try:
            return self._propagate_error(error)
        except Exception as e:  # noqa: BLE001 - the step's own error wins
            log.error("Reporting %r to the cluster failed: %r", error, e)
            return None

    def _propagate_error(self, error: BaseException) -> Optional[BaseException]:
        """Reports a step's ``OpError`` to every worker; never raises.

        Returns the error ``run()`` raises instead, or None for ``error`` itself:
        when the error looks like a lost peer (a collective aborted, a deadline
        or an unavailable task), the peers that do not answer a health probe
        are named in its message (same type; TF's message often names nobody).
        """
        if self._local_mode or not isinstance(error, _errors.module().OpError):
            return None
        replacement, unreachable = None, None
        try:
            unreachable = _membership.unreachable_peers(
                error, self._coordination.service, self._cluster_resolver, self._membership
            )
            replacement = _membership.with_unreachable_named(error, unreachable, self._membership)
        except Exception as e:  # noqa: BLE001 - only a better message is at stake
            log.info("Could not probe the peers after %r: %s", error, e)
        leader = _membership.coordination_leader(self._cluster_resolver)
        if unreachable and any(task == leader for _, task, _, _ in unreachable):
            # TF's report_error_to_cluster blocks, holding the GIL, until the
            # service's leader answers: with the leader cut off, never.
            log.warning(
                "Not reporting %r to the cluster: the coordination service's leader (%s) "
                "does not answer.",
                error,
                leader,
            )
            return replacement
        log.info("Propagating error to cluster: %r: %s", error, error)
        try:
            self._coordination.report_error(error.error_code, error.message, SHUTDOWN_WRITE_TIMEOUT)
        except Exception as e:  # noqa: BLE001 - the step's own error matters more
            log.warning("Could not report the error to the cluster: %r: %s", e, e)
        return replacement

    # ------------------------------------------------------------ protocol

    def _retry_bound(self) -> float:
        """Seconds a failing protocol call is retried: :data:`TRANSIENT_FAILURE_WINDOW`, or
        the peer timeout or the time left before the leading notice's deadline (at least
        1 s) when shorter (a machine that is gone cannot be waited for)."""
        bound = min(self._peer_timeout, TRANSIENT_FAILURE_WINDOW)
        deadline = self._core_state().get("deadline")
        if deadline is not None:
            bound = min(bound, max(1.0, deadline - self._clock()))
        return bound

    def _named(self, error: BaseException, what: str, attempts: int, seconds: float) -> Any:
        """``error``'s type (TF's), its message prefixed with what failed, how often and
        for how long; ``error`` is its cause."""
        errors = _errors.module()
        name = type(error).__name__ if isinstance(error, errors.OpError) else "UnavailableError"
        try:
            named = _errors.make(
                name,
                f"Worker {self._id_in_cluster}: {what} failed {attempts} time(s) over "
                f"{seconds:.1f}s: {getattr(error, 'message', error)}",
            )
        except (AttributeError, TypeError):  # not one of TF's public error classes
            named = _errors.make("UnavailableError", f"{what} failed: {error!r}")
        named.__cause__ = error
        return named

    def _retrying(self, what: str, call: Callable[[], Any]) -> Any:
        """``call()``, retrying a failed coordination-service call within the bound.

        Coordination-service errors (any ``OpError``: a transient failure can look like
        Unavailable, Internal or Aborted) are retried after growing pauses; once the
        bound has passed, the last error is raised again, of its own type, naming what
        failed (:meth:`_named`). Anything else is a bug and is raised at once.
        """
        errors = _errors.module()
        bound = self._retry_bound()
        start = time.monotonic()
        pause = RETRY_FIRST_PAUSE
        attempts = 0
        while True:
            attempts += 1
            try:
                return call()
            except errors.OpError as e:
                left = start + bound - time.monotonic()
                if left <= 0 or self._closing.is_set():
                    raise self._named(e, what, attempts, time.monotonic() - start) from e
                (log.warning if attempts == 1 else log.info)(
                    "%s failed (%s: %s); retrying in %gs (%.1fs left).",
                    what,
                    type(e).__name__,
                    e,
                    min(pause, left),
                    left,
                )
                self._closing.wait(min(pause, left))
                pause = min(pause * 2, RETRY_MAX_PAUSE)

    def _publish(self, round_key: str, step: int, ack_keys: list) -> None:
        log.info(
            "Worker %s leads the %s round: every worker saves after run %d.",
            self._id_in_cluster,
            "final" if round_key == LAST_RUN_TO_CHECKPOINT else "first",
            step,
        )
        self._records.write("agreement", step=step, proposer=self._records_label, round=round_key)
        if self._local_mode:
            return
        start = self._clock()
        published = self._retrying(
            f"publishing {round_key}={step}",
            lambda: self._coordination.set(round_key, str(step)),
        )
        if not published:
            log.warning(
                "%s was already set (a peer shut down?); not waiting for acknowledgements.",
                round_key,
            )
            return
        self._await_acknowledgements(round_key, step, ack_keys)
        self._core_agreement(self._clock() - start)

    def _await_acknowledgements(self, round_key: str, step: int, ack_keys: list) -> None:
        """Waits, bounded by the peer timeout, until every worker acknowledged."""
        deadline = time.monotonic() + self._peer_timeout
        pending = list(ack_keys)
        last_error: Optional[BaseException] = None
        failing_since: Optional[float] = None
        failures = 0
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                got = self._coordination.get(pending[0], min(remaining, 1.0))
            except _errors.module().OpError as e:
                # A failed read is retried like a slow peer, but a failure that lasts
                # longer than the bound is the service's (a peer reported an error).
                now = time.monotonic()
                failures += 1
                if failing_since is None:
                    failing_since = now
                    log.warning("Reading %s failed (%s); retrying.", pending[0], e)
                elif now - failing_since > self._retry_bound():
                    raise self._named(
                        e, f"reading {pending[0]}", failures, now - failing_since
                    ) from e
                last_error = e
                self._closing.wait(min(RETRY_FIRST_PAUSE, max(0.0, remaining)))
                continue
            failing_since, failures = None, 0
            if got is not None:
                log.info("Acknowledgement %s received.", pending[0])
                pending.pop(0)
        if not pending:
            return
        if failing_since is not None and last_error is not None:
            # The wait ended while reads were failing: the service's error, not a
            # silent peer, is what to report.
            raise self._named(
                last_error,
                f"reading {pending[0]}",
                failures,
                time.monotonic() - failing_since,
            ) from last_error
        # Name every worker still missing, not only the first one waited on.
        missing = []
        for key in pending:
            try:
                if self._coordination.get(key, 0.001) is None:
                    missing.append(key)
            except _errors.module().OpError as e:
                last_error = e
                missing.append(key)
        if not missing:
            return
        cause = "" if last_error is None else f" The last read failed: {last_error}."
        workers = ", ".join(k.rsplit("_", 1)[1] for k in missing)
        raise _errors.make(
            "DeadlineExceededError",
            f"Worker {self._id_in_cluster} published {round_key}={step} but worker(s) "
            f"{workers} did not acknowledge within {self._peer_timeout:g}s "
            f"(missing keys: {', '.join(missing)}).{cause} Set "
            f"TerminationConfig(peer_timeout=...) or {PEER_TIMEOUT_ENV} to wait longer.",
        )

    def _save_checkpoint_at(self, round_key: str, step: int, args: tuple, kwargs: dict) -> None:
        if self._ps_poller is not None:
            self._ps_before_save()
        log.info("Saving a checkpoint at the agreed step %d (%s).", step, round_key)
        if self._records.current is None:
            self._records.new_preemption()
        self._records.write("save_start", step=self._run_counter, round=round_key)
        start = self._clock()
        try:
            self._save_checkpoint(*args, **kwargs)
        except BaseException as e:
            self._core_save_failed()
            self._records.write("error", error=f"save failed: {e!r}")
            raise
        self._records.write("save_end", path=self._saved_path())
        after = self._core_saved(round_key, self._clock() - start)
        if after == _native.SaveAction.Exit:
            # The signal watch stays: until close(), a further notice is absorbed,
            # not handed back to whatever was installed before (which could kill
            # a worker that exit_fn chose to keep running).
            self._stop_peer_watcher()
            self._checkpoints.remove_worker_temp(self._is_chief)
            if self._ps_poller is not None:
                self._ps_after_save()
            log.info("PreemptionCheckpointHandler: checkpoint saved. Exiting.")
            # Written before exit_fn: one that calls os._exit leaves no later moment.
            self._records.write("exit", code=_platform.exit_code(self._exit_fn))
            self._records.close()
            # SLURM: the job back in the queue now that the checkpoint is saved (issue 23).
            _slurm.requeue_after_save(self)
            self._exit_fn()
            # TF carries on silently here; say what state the worker is in.
            log.warning(
                "exit_fn returned instead of ending the process: training continues, the "
                "checkpoint of run %d is complete, and this handler absorbs further notices "
                "until close().",
                step,
            )
        else:
            state = self._core_state()
            if state.get("leading"):
                log.info(
                    "Continue training for the grace period; the final round starts %.2fs "
                    "before the deadline (save, steps and acknowledgements as measured).",
                    state["margin"],
                )
            else:
                log.info("Continue training for the grace period.")

    # ------------------------------------------------------------ watchers

    def _owner_key(self) -> tuple:
        service = None if self._coordination is None else id(self._coordination.service)
        return (service, self._id_in_cluster)

    def _take_over_notices(self) -> None:
        """Makes this handler the one that acts on its worker's notices.

        An older handler of the same worker that is still open (tf_keras leaves
        the handler of an earlier ``fit`` open) stops acting on notices and
        watching the step keys; any notice it still sees is handed to this one,
        whose resolver ignores one it already has.
        """
        key = self._owner_key()
        with _owners_lock:
            ref = _owners.get(key)
            _owners[key] = weakref.ref(self)
        older = None if ref is None else ref()
        if older is not None and older is not self and not older._closed:
            older._successor = weakref.ref(self)
            log.info(
                "A new PreemptionCheckpointHandler of worker %s takes over termination "
                "notices from an earlier one that is still open (close() it when done).",
                self._id_in_cluster,
            )

    def _give_up_ownership(self) -> None:
        key = self._owner_key()
        with _owners_lock:
            ref = _owners.get(key)
            if ref is not None and ref() in (self, None):
                del _owners[key]

    def _current_owner(self) -> Optional[ProtocolDriver]:
        """The newer handler that owns the notices now, or None when this one does."""
        successor = None if self._successor is None else self._successor()
        while successor is not None and successor._successor is not None:
            later = successor._successor()
            if later is None:
                break
            successor = later
        return successor

    def _fail_in_background(self, what: str, error: BaseException) -> None:
        """A background thread met an error it cannot handle: the next ``run()`` raises it.

        The error is TF's ``UnavailableError`` naming what failed and why (the
        original is its ``__cause__``), so no thread ends without the handler
        learning of it.
        """
        log.error("PreemptionCheckpointHandler: %s failed: %r", what, error)
        if self._closing.is_set():
            return
        if isinstance(error, _errors.module().OpError):
            raised = error
        else:
            raised = _errors.make(
                "UnavailableError", f"worker {self._id_in_cluster}: {what} failed: {error!r}"
            )
            raised.__cause__ = error
        if self._thread_error is None:
            self._thread_error = raised
        self._core_set_pending(True)

    def _start_watchers(self) -> None:
        self._sources = _sources.NoticeSources(
            self._environment, self._signals, self._termination_watcher_fn, owner=True
        )
        # Named as TF's notice thread (tools and tests look for it by name).
        self._driver_thread = threading.Thread(
            target=self._drive,
            name=f"WorkerTerminationSignalWatcher-{self._id_in_cluster}",
            daemon=True,
        )
        self._driver_thread.start()
        if not self._local_mode:
            self._peer_thread = threading.Thread(
                target=self._watch_step_keys,
                name=f"PeerTerminationWatcher-{self._id_in_cluster}",
                daemon=True,
            )
            self._peer_thread.start()

    def _notify_termination(self, deadline: Optional[float] = None) -> None:
        """Delivers a notice as a termination source would (used by ``testing``).

        ``deadline`` is on the handler's clock (``time.monotonic()``). A notice after the
        handler exited or was closed is ignored, as a signal would be.
        """
        sources = self._sources
        unix_deadline = None if deadline is None else time.time() + (deadline - self._clock())
        if (
            sources is None
            or self._closing.is_set()
            or not sources.trigger("a termination source", unix_deadline)
        ):
            log.info("Termination notice after shutdown ignored.")

    # ------------------------------------------------------------ the driver loop

    def _drive(self) -> None:
        """The protocol driver: takes every input from the inbox and performs the effects.

        Each turn takes at most one input (``NoticeSources.receive``: stop first, then
        step keys and key-read failures, then notices) and makes at most one attempt
        at one write, the most urgent that is due:

        * a **step key** goes to the resolver (``_core_step_key``) and, unless it is
          ``STOP_WATCHER`` or a newer handler owns the notices, queues its
          acknowledgement;
        * a **key-read failure** (the reader gave up) reaches the next ``run()``;
        * a **notice** waits until the one before it is done, then goes to the
          resolver (``_core_notice``): claim ``TERMINATED_WORKER`` (then announce it
          when won), lead (local mode), absorb it, or hand it to a newer handler;
        * a **write** (acknowledge, claim, announce) that fails is retried within the
          bound (:meth:`_retry_bound`), but never by sleeping: the pause before its
          next attempt is the deadline of the next receive, so whatever arrives
          meanwhile is taken at once. **Acknowledgements go first**: a leader waits
          for them, bounded by its peer timeout, so one is never queued behind a
          claim's retries, only behind the one call already in flight;
        * **stop** (``close()``) ends the loop after one last look (:meth:`_finish`).

        No exception ends this thread unnoticed: whatever a turn raises reaches the
        next ``run()`` (:meth:`_fail_in_background`).
        """
        acks: deque = deque()  # acknowledgement writes, oldest first
        notices: deque = deque()  # notices waiting for the current one
        current: Optional[_Write] = None  # the write of the notice being handled
        while True:
            try:
                item = self._sources.receive(_time_to_next(acks, current))
            except BaseException as e:  # noqa: BLE001 - handed to the next run()
                self._fail_in_background("the protocol driver's receive", e)
                return
            if self._closing.is_set() or isinstance(item, _native.Input.Stop):
                self._finish(item, acks, notices, current)
                return
            self._take(item, acks, notices)
            while current is None and notices:
                current = self._start_notice(notices.popleft())
            write = _first_due(acks, current)
            if write is None:
                continue
            try:
                finished, after = self._attempt(write)
            except BaseException as e:  # noqa: BLE001 - handed to the next run()
                self._fail_in_background(write.what, e)
                finished, after = True, None
            if not finished:
                continue
            if write is current:
                current = after
                if current is None:
                    self._notices_handled += 1
            else:
                acks.remove(write)

    def _finish(self, item: Any, acks: deque, notices: deque, current: Optional[_Write]) -> None:
        """The stop of ``close()``: what arrived with it is dealt with, nothing waits.

        * a step key is acknowledged, and every acknowledgement still pending gets
          one last attempt: a leader may be waiting for it, and without it would
          wait out its peer timeout and fail;
        * an announce in progress (the claim was won) gets one last attempt too: the
          peers' watchers learn of the notice only from it;
        * a notice, or the claim of one in progress, is dropped (logged): a claim now
          would make the other workers stand down for a leader that is closing and
          will never publish a step.
        """
        try:
            if item is not None and not isinstance(item, _native.Input.Stop):
                self._take(item, acks, notices)
            for later in self._sources.drain():
                self._take(later, acks, notices)
        except BaseException as e:  # noqa: BLE001 - closing: logged there
            self._fail_in_background("the protocol driver's last look", e)
        for write in acks:
            write.bound = 0.0  # one attempt: a failure is not retried while closing
            try:
                self._attempt(write)
            except BaseException as e:  # noqa: BLE001 - closing: logged there
                self._fail_in_background(write.what, e)
        if current is not None and current.finish_on_close:
            current.bound = 0.0  # one attempt, as for the acknowledgements
            try:
                self._attempt(current)
            except BaseException as e:  # noqa: BLE001 - closing: logged there
                self._fail_in_background(current.what, e)
            self._notices_handled += 1
            current = None
        dropped = list(notices) + ([] if current is None else [current])
        for what in dropped:
            log.info(
                "Closing: %s dropped (a notice is not acted on while the handler closes).",
                what.what if isinstance(what, _Write) else f"the notice from {what.source}",
            )
            self._notices_handled += 1

    def _take(self, item: Any, acks: deque, notices: deque) -> None:
        """Files one input: a notice waits its turn, a step key may queue an
        acknowledgement, a key-read failure reaches the next ``run()``."""
        if item is None:  # the deadline of a retry: nothing arrived
            return
        try:
            if isinstance(item, _sources.Notice):
                notices.append(item)
            elif isinstance(item, _native.Input.StepKey):
                ack = self._on_step_key(item.round_key, item.value)
                if ack is not None:
                    acks.append(ack)
            elif isinstance(item, _native.Input.KeyReadFailed):
                self._fail_in_background("watching the peers' step keys", item.error)
        except BaseException as e:  # noqa: BLE001 - handed to the next run()
            self._fail_in_background("watching the peers' step keys", e)

    def _attempt(self, write: _Write) -> tuple:
        """One attempt of ``write``: ``(finished, next write)``.

        A coordination-service error (any ``OpError``) schedules the next attempt after
        a growing pause while the bound lasts; after it, ``write.on_failed`` gets the
        last error, of its own type, naming what failed (:meth:`_named`). Anything else
        is a bug and goes to ``on_failed`` at once.
        """
        write.attempts += 1
        try:
            result = write.call()
        except _errors.module().OpError as e:
            now = time.monotonic()
            left = write.start + write.bound - now
            if left <= 0 or self._closing.is_set():
                named = self._named(e, write.what, write.attempts, now - write.start)
                return True, write.on_failed(named)
            (log.warning if write.attempts == 1 else log.info)(
                "%s failed (%s: %s); retrying in %gs (%.1fs left).",
                write.what,
                type(e).__name__,
                e,
                min(write.pause, left),
                left,
            )
            write.due = now + min(write.pause, left)
            write.pause = min(write.pause * 2, RETRY_MAX_PAUSE)
            return False, None
        except Exception as e:  # noqa: BLE001 - a bug: handed on at once
            return True, write.on_failed(e)
        return True, write.on_done(result)

    def _write(
        self,
        what: str,
        call: Callable[[], Any],
        on_done: Callable[[Any], Optional[_Write]],
        on_failed: Callable[[BaseException], Optional[_Write]],
        notice: bool = False,
    ) -> _Write:
        return _Write(what, call, self._retry_bound(), on_done, on_failed, notice)

    # ------------------------------------------------------------ notices

    def _start_notice(self, notice: _sources.Notice) -> Optional[_Write]:
        """Acts on ``notice``: the write it starts, or None when it is done with
        (absorbed, handed to a newer handler, or led in local mode)."""
        try:
            owner = self._current_owner()
            if owner is not None:
                log.info(
                    "Termination notice from %s handed to the newer handler of worker %s.",
                    notice.source,
                    self._id_in_cluster,
                )
                if owner._sources is not None:
                    owner._sources.trigger(notice.source, notice.deadline)
                write = None
            else:
                write = self._on_own_notice(notice)
        except BaseException as e:  # noqa: BLE001 - handed to the next run()
            self._fail_in_background(f"handling the notice from {notice.source}", e)
            write = None
        if write is None:
            self._notices_handled += 1
        return write

    def _on_own_notice(self, notice: _sources.Notice) -> Optional[_Write]:
        source, deadline = notice.source, None
        if self._records.current is None:
            self._records.new_preemption()
            self._records.write(
                "notice",
                source=source,
                deadline=notice.deadline,
                grace_period=self._grace_period,
            )
        if notice.deadline is not None:
            # Platforms announce wall-clock times; the resolver runs on the monotonic clock.
            deadline = self._clock() + (notice.deadline - time.time())
            log.info(
                "The notice from %s gives %.1fs until the machine goes away.",
                source,
                notice.deadline - time.time(),
            )
        action = self._core_notice(self._clock(), deadline)
        if deadline is not None and self._notice_deadline is None:
            self._notice_deadline = deadline
        if isinstance(action, _native.NoticeAction.Lead):
            log.info("Received termination notice from %s.", source)
            return self._announce(source)
        if isinstance(action, _native.NoticeAction.Claim):
            return self._claim(action.key, action.value, source)
        log.info(
            "Termination notice from %s absorbed: this handler already acts on an earlier one.",
            source,
        )
        return None

    def _claim(self, key: str, value: str, source: str) -> _Write:
        """Writes ``TERMINATED_WORKER``; the resolver learns whether this worker got it first.

        A failure of the coordination service is retried within the bound (TF drops
        the notice at the first failure); after it, the ``UnavailableError`` reaches
        the next ``run()``.
        """

        def claimed(won: bool) -> Optional[_Write]:
            self._core_claim(won)
            if won:
                log.info("Member %s has received termination notice (%s).", value, source)
                return self._announce(source)
            log.info(
                "Member %s has received termination notice (%s), but another worker "
                "received one first; it decides when to checkpoint.",
                value,
                source,
            )
            return None

        def failed(error: BaseException) -> None:
            self._core_claim(False)
            self._fail_in_background(f"handling the notice from {source}", error)

        return self._write(
            f"claiming {key} after the notice from {source}",
            lambda: self._coordination.set(key, value),
            claimed,
            failed,
            notice=True,
        )

    def _announce(self, source: str) -> Optional[_Write]:
        """Tells PreemptionWatchers: in this process, and through the coordination service
        (the write it starts; the protocol does not wait on it beyond the bound)."""
        message = in_process.notice_message(self._id_in_cluster, source)
        if self._local_mode:
            in_process.publish_local(message)
            return None

        # No longer than the protocol's writes: an acknowledgement may be waiting
        # behind this call (see "Why the driver acknowledges" in step_resolution.rs).
        timeout = max(1.0, min(SHUTDOWN_WRITE_TIMEOUT, self._peer_timeout))

        # This process's watchers get the message once the cluster has it (or the
        # write gave up): a script that closes and exits when its own watcher reports
        # must not take the coordination service down before peers could read it.
        def published(_: Any) -> None:
            in_process.publish_local(message)

        def failed(error: BaseException) -> None:
            # For PreemptionWatchers only; the protocol goes on.
            log.warning("Could not publish %s: %s", PREEMPTION_NOTICE_KEY, error)
            in_process.publish_local(message)

        write = self._write(
            f"publishing {PREEMPTION_NOTICE_KEY}",
            lambda: self._coordination.set(PREEMPTION_NOTICE_KEY, message, timeout),
            published,
            failed,
            notice=True,
        )
        write.finish_on_close = True
        return write

    # ------------------------------------------------------------ step keys

    def _on_step_key(self, round_key: str, value: str) -> Optional[_Write]:
        """A step key the reader posted: the acknowledgement to write, if any."""
        action = self._core_step_key(round_key, value)
        if isinstance(action, _native.KeyAction.Stop):
            return None
        if not self._core_state().get("leading"):
            if self._records.current is None:
                self._records.new_preemption()
                self._records.write("notice", source="peer", grace_period=self._grace_period)
            try:
                step = int(value)
            except ValueError:
                step = None
            self._records.write("agreement", step=step, proposer="peer", round=round_key)
        if self._current_owner() is not None:
            # A newer handler of this worker acknowledges now.
            return None
        ack_key = action.ack_key

        def acknowledged(_: Any) -> None:
            log.info("%s=%s received; acknowledged with %s.", round_key, value, ack_key)

        def failed(error: BaseException) -> None:
            self._fail_in_background("watching the peers' step keys", error)

        return self._write(
            f"acknowledging {round_key}={value} with {ack_key}",
            lambda: self._coordination.set(ack_key, _native.ACK_VALUE),
            acknowledged,
            failed,
        )

    def _watch_step_keys(self) -> None:
        """The step-key reader: reads the keys a leader publishes (one round, or two with
        a grace period) and posts each value into the inbox, until ``STOP_WATCHER``,
        shutdown, or a newer handler takes over. It writes nothing: the driver
        acknowledges.

        A failed read is retried until reads have failed without a break for longer
        than the bound; then, or on anything unexpected, the error is posted and the
        driver hands it to the next ``run()``.
        """
        self._reading_key = RUN_TO_CHECKPOINT
        try:
            self._watch_step_keys_until_done()
        except BaseException as e:  # noqa: BLE001 - handed to the driver
            if not self._sources.inbox.post_key_read_failed(self._reading_key, e):
                # The inbox is stopped: closing (ignored there), or the driver is gone.
                self._fail_in_background("watching the peers' step keys", e)

    def _watch_step_keys_until_done(self) -> None:
        rounds = [RUN_TO_CHECKPOINT]
        if self._grace_period > 0:
            rounds.append(LAST_RUN_TO_CHECKPOINT)
        for round_key in rounds:
            self._reading_key = round_key
            value = self._read_step_key(round_key)
            if value is None or not self._sources.inbox.post_step_key(round_key, value):
                return  # closing
            if value == STOP_WATCHER or self._current_owner() is not None:
                return

    def _read_step_key(self, round_key: str) -> Optional[str]:
        """The value of ``round_key`` once a leader set it; None once closing."""
        errors = _errors.module()
        failing_since: Optional[float] = None
        failures = 0
        pause = RETRY_FIRST_PAUSE
        while not self._closing.is_set():
            try:
                value = self._coordination.get(round_key, PEER_WATCH_SLICE)
            except errors.OpError as e:
                if self._closing.is_set():
                    return None
                failures += 1
                now = time.monotonic()
                if failing_since is None:
                    failing_since = now
                    log.warning("Reading %s failed (%s); retrying.", round_key, e)
                elif now - failing_since > self._retry_bound():
                    raise self._named(
                        e, f"reading {round_key}", failures, now - failing_since
                    ) from e
                self._closing.wait(pause)
                pause = min(pause * 2, RETRY_MAX_PAUSE)
                continue
            failing_since, failures, pause = None, 0, RETRY_FIRST_PAUSE
            if value is not None:
                return value
        return None

    def _stop_watchers(self) -> None:
        """``close()``: stops the inbox (the driver takes ``Stop``) and joins the threads."""
        self._closing.set()
        if self._sources is not None:
            self._sources.close()
        if (
            self._driver_thread is not None
            and self._driver_thread is not threading.current_thread()
        ):
            self._driver_thread.join(THREAD_JOIN_TIMEOUT)
        self._driver_thread = None
        self._stop_peer_watcher()

    def _stop_peer_watcher(self) -> None:
        """Releases the peer watcher, the step-key reader (``STOP_WATCHER`` on the step
        keys), and joins it.

        A handler that a newer one took over from writes nothing: the keys belong
        to the newer one's protocol, and its own peer watcher stops by itself.
        """
        thread = self._peer_thread
        if thread is None:
            return
        self._peer_thread = None
        if self._current_owner() is None:
            for key in self._core_shutdown_keys():
                try:
                    self._coordination.set(key, STOP_WATCHER, SHUTDOWN_WRITE_TIMEOUT)
                except Exception as e:  # noqa: BLE001 - peers may have exited already
                    log.info("Ignoring error while releasing %s: %s", key, e)
        if thread is threading.current_thread():
            return
        thread.join(THREAD_JOIN_TIMEOUT)
        if thread.is_alive():
            log.warning(
                "The peer watcher did not stop within %gs; leaving it (daemon thread).",
                THREAD_JOIN_TIMEOUT,
            )
