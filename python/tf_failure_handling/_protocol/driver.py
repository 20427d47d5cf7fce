"""The protocol driver: one thread takes every input of the handler and performs the writes.

The Rust core (``HandlerCore``, ``src/step_resolution.rs``) decides; the driver thread
(named as TF's notice thread, ``WorkerTerminationSignalWatcher-<id>``) feeds it. Every
input arrives in one inbox (``_native.Inbox``, ``src/inbox.rs``, behind
``NoticeSources``): notices from every termination source (the Rust signal dispatcher and
metadata pollers post them directly; the watcher-fn poller and ``testing`` from Python),
the step keys a leader publishes (posted by the reader thread of ``step_keys``), a
reader's failure, and the stop of ``close()``. One loop (:meth:`Driver._drive`) takes
them one at a time, hands each to the core (``ProtocolCore.handle``: a notice, a step
key, a write's outcome, the close), performs what the core says (``ProtocolCore.poll``:
at most one attempt at one write a turn, and the report of what a write came to) and
waits for the next input until ``ProtocolCore.poll_timeout`` (it never sleeps). The
driver holds no write: what each sets, its call's timeout, when it is retried or given
up, and what follows it are the core's (``src/protocol/driver.rs``).

This module owns the driver thread (:meth:`Driver.start`, stopped at ``close()`` by
:meth:`Driver.stop`); the handler starts and stops the reader beside it.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any, Callable, Optional

from .. import _errors
from .._native import Action, Event, Inbox, ProtocolCore
from .._platforms import notice_sources as _sources
from .context import Context
from .notices import NoticeResponse
from .retries import Retrier

log = logging.getLogger("tf_failure_handling")
Input, WriteKind = Inbox.Input, ProtocolCore.WriteKind


class Driver:
    """The driver thread's loop over the inbox (``sources``), and the handler's threads."""

    def __init__(
        self,
        ctx: Context,
        sources: _sources.NoticeSources,
        notices: NoticeResponse,
        acknowledge: Callable[[str, str], Any],
    ) -> None:
        self._ctx = ctx
        self._state, self._core = ctx.state, ctx.core
        self._errors, self._records = ctx.errors, ctx.records
        self.sources = sources
        #: Names a write's error when the core gives up on it, and logs its retries.
        self._retrier = Retrier(ctx.state, ctx.core)
        self._notices = notices
        #: The error of the last attempt that failed: the core's verdict names it.
        self._last_error: Optional[BaseException] = None
        #: A peer's step key read: its acknowledgement is queued (``StepKeys.acknowledge``).
        self._acknowledge = acknowledge
        self.thread: Optional[threading.Thread] = None
        #: Notices finished with (acted on, absorbed, handed on or dropped at close),
        #: under :attr:`_handled_changed`, notified at each one and at the stop.
        self.notices_handled = 0
        self._handled_changed = threading.Condition()

    def start(self) -> None:
        """Starts the driver thread (the handler starts the step-key reader)."""
        # Named as TF's notice thread (tools and tests look for it by name).
        self.thread = threading.Thread(
            target=self._drive,
            name=f"WorkerTerminationSignalWatcher-{self._state.membership.id_in_cluster}",
            daemon=True,
        )
        self.thread.start()

    def notify(self, deadline: Optional[float] = None) -> None:
        """Delivers a notice as a termination source would (used by ``testing``).

        ``deadline`` is on the handler's clock (``time.monotonic()``); the caller plays
        the platform and states it, so it is the kill too. A notice after the handler
        exited or was closed is ignored, as a signal would be.
        """
        unix_deadline = (
            None if deadline is None else ProtocolCore.unix_time_of(deadline, self._core)
        )
        if self._state.closing.is_set() or not self.sources.trigger(
            "a termination source", unix_deadline, unix_deadline
        ):
            log.info("Termination notice after shutdown ignored.")

    def _handled(self) -> None:
        """One more notice finished with: its waiters (:meth:`wait_handled`) wake."""
        with self._handled_changed:
            self.notices_handled += 1
            self._handled_changed.notify_all()

    def wait_handled(self, before: int, timeout: float) -> bool:
        """Until more than ``before`` notices were finished with, or the handler closes
        (True), or ``timeout`` seconds pass (False)."""
        with self._handled_changed:
            return self._handled_changed.wait_for(
                lambda: self.notices_handled > before or self._state.closing.is_set(), timeout
            )

    def stop(self, join: bool = True) -> None:
        """``close()``: stops the inbox (the driver takes ``Stop``) and joins the threads,
        for as long as the core's shutdown says; ``__del__`` passes ``join=False`` and
        nothing is joined or written."""
        self._state.closing.set()
        with self._handled_changed:
            self._handled_changed.notify_all()
        self.sources.close(join=join)
        if not join:
            return
        if self.thread is not None and self.thread is not threading.current_thread():
            _, bound = self._core.handle(Event.Shutdown())
            self.thread.join(bound)
        self.thread = None

    def _drive(self) -> None:
        """The protocol driver: takes every input from the inbox and performs the effects.

        Each turn takes at most one input (``NoticeSources.receive``: stop first, then
        step keys and key-read failures, then notices) and makes at most one attempt
        at one write, the most urgent that is due:

        * a **step key** goes to the core (``Event.StepKey``), which, unless it is
          ``STOP_WATCHER`` or a newer handler owns the notices, queues its
          acknowledgement;
        * a **key-read failure** (the reader gave up) reaches the next ``run()``;
        * a **notice** waits until the one before it is done, then goes to the
          core (``Event.Notice``): claim ``TERMINATED_WORKER`` (then announce it
          when won), lead (local mode), absorb it, or hand it to a newer handler;
        * a **write** (acknowledge, claim, announce) that fails is retried within the
          core's rule (``src/retry.rs``), but never by sleeping: the pause before its
          next attempt is the deadline of the next receive, so whatever arrives
          meanwhile is taken at once. **Acknowledgements go first**: a leader waits
          for them, bounded by its peer timeout, so one is never queued behind a
          claim's retries, only behind the one call already in flight;
        * **stop** (``close()``) ends the loop after one last look (:meth:`_finish`).

        No exception ends this thread unnoticed: whatever a turn raises reaches the
        next ``run()`` (``ErrorReports.fail_in_background``).
        """
        notices: deque = deque()  # notices waiting for the current one
        core = self._core
        while True:
            # A notice that waited for the writes before it is started at once
            # when they have ended: no input need come to wake the driver.
            wait = core.poll_timeout(bool(notices))
            try:
                item = self.sources.receive(wait)
            except BaseException as e:  # noqa: BLE001 - handed to the next run()
                self._errors.fail_in_background("the protocol driver's receive", e)
                return
            if self._state.closing.is_set() or isinstance(item, Input.Stop):
                self._finish(item, notices)
                return
            self._take(item, notices)
            while notices:
                started = self._notices.start(notices[0])
                if started is None:  # the writes of the notice before it go on
                    break
                notices.popleft()
                if not started:
                    self._handled()
            self._perform()

    def _perform(self) -> None:
        """Performs what the core says now: every report of what a write came to, and
        at most one attempt (an input is taken between two attempts)."""
        attempted = False
        while True:
            action = self._core.poll()
            if action is None or (attempted and isinstance(action, Action.Write)):
                return
            attempted = attempted or isinstance(action, Action.Write)
            self._act(action)

    def _act(self, action: Any) -> None:
        """One action of the core: attempt a write, or report what one came to."""
        try:
            if isinstance(action, Action.Write):
                self._attempt(action)
            else:
                self._report(action)
        except BaseException as e:  # noqa: BLE001 - handed to the next run()
            self._errors.fail_in_background(getattr(action, "what", "a write"), e)

    def _attempt(self, write: Any) -> None:
        """One attempt of ``write`` (``Action.Write``), its outcome reported to the core:
        written (a claim: True when this worker wrote the key first), failed with a
        coordination-service error (retried or given up by the core), or raised
        anything else (a bug, handed on at once)."""
        try:
            result = self._state.coordination.set(write.key, write.value, write.timeout)
        except _errors.module().OpError as e:
            self._last_error = e
            event = Event.Failed(write.id, self._state.closing.is_set())
        except BaseException as e:  # noqa: BLE001 - a bug: handed on at once
            self._last_error = e
            event = Event.Raised(write.id)
        else:
            event = Event.Written(write.id, bool(result))
        self._core.handle(event)

    def _report(self, action: Any) -> None:
        """What the core says a write came to: a retry (logged), a claim's outcome and an
        announce's local publish (``notices``), an acknowledgement's line, or the error
        for the next ``run()``; a claim dropped at close. A notice whose last write
        ended is counted as handled (a won claim's is its announce)."""
        if isinstance(action, Action.Retrying):
            self._retrier.retrying(
                action.what, self._last_error, action.attempts, action.pause, action.left
            )
            return
        if isinstance(action, Action.Dropped):
            log.info(
                "Closing: %s dropped (a notice is not acted on while the handler closes).",
                action.what,
            )
            self._handled()
            return
        error: Optional[BaseException] = None
        if isinstance(action, Action.WriteGaveUp):
            error = self._retrier.named(
                self._last_error, action.what, action.attempts, action.seconds
            )
        elif isinstance(action, Action.Raised):
            error = self._last_error
        try:
            if isinstance(action.kind, WriteKind.Claim):
                self._notices.claimed(action, error)
            elif isinstance(action.kind, WriteKind.Announce):
                self._notices.announced(action, error)
            elif error is None:
                log.info("%s received; acknowledged with %s.", action.subject, action.key)
            else:
                self._errors.fail_in_background("watching the peers' step keys", error)
        finally:
            if action.ends_notice:
                self._handled()

    def _finish(self, item: Any, notices: deque) -> None:
        """The stop of ``close()``: what arrived with it is dealt with, nothing waits.

        * a step key is acknowledged, and every acknowledgement still pending gets
          one last attempt: a leader may be waiting for it, and without it would
          wait out its peer timeout and fail;
        * an announce in progress (the claim was won) gets one last attempt too: the
          peers' watchers learn of the notice only from it;
        * a notice, or the claim of one in progress, is dropped (logged): a claim now
          would make the other workers stand down for a leader that is closing and
          will never publish a step.

        Which writes get the last attempt and which are dropped is the core's
        (``Event.Close``).
        """
        try:
            if item is not None and not isinstance(item, Input.Stop):
                self._take(item, notices)
            for later in self.sources.drain():
                self._take(later, notices)
        except BaseException as e:  # noqa: BLE001 - closing: logged there
            self._errors.fail_in_background("the protocol driver's last look", e)
        try:
            self._core.handle(Event.Close())
            while (action := self._core.poll()) is not None:
                self._act(action)
        except BaseException as e:  # noqa: BLE001 - closing: logged there
            self._errors.fail_in_background("the protocol driver's last attempts", e)
        for notice in notices:
            log.info(
                "Closing: the notice from %s dropped (a notice is not acted on while the "
                "handler closes).",
                notice.source,
            )
            self._handled()

    def _take(self, item: Any, notices: deque) -> None:
        """Files one input: a notice waits its turn, a step key may queue an
        acknowledgement, a key-read failure reaches the next ``run()``."""
        if item is None:  # a write is due: nothing arrived
            return
        try:
            if isinstance(item, _sources.Notice):
                notices.append(item)
            elif isinstance(item, Input.StepKey):
                self._acknowledge(item.round, item.value)  # the core queues it
            elif isinstance(item, _sources.KeyReadFailed):
                self._errors.fail_in_background("watching the peers' step keys", item.error)
        except BaseException as e:  # noqa: BLE001 - handed to the next run()
            self._errors.fail_in_background("watching the peers' step keys", e)
