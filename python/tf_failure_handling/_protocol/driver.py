"""The protocol driver: one thread takes every input of the handler and performs the writes.

The Rust core (``HandlerCore``, ``src/step_resolution.rs``) decides; the driver thread
(named as TF's notice thread, ``WorkerTerminationSignalWatcher-<id>``) feeds it. Every
input arrives in one inbox (``_native.Inbox``, ``src/inbox.rs``, behind
``NoticeSources``): notices from every termination source (the Rust signal dispatcher and
metadata pollers post them directly; the watcher-fn poller and ``testing`` from Python),
the step keys a leader publishes (posted by the reader thread of ``step_keys``), a
reader's failure, and the stop of ``close()``. One loop (:meth:`ProtocolDriver._drive`)
takes them one at a time and makes at most one attempt at one write a turn: the one the
core's ``Writes`` (``src/writes.rs``) polls as due, which also says when to wake for the
next (it never sleeps). What an input starts is decided elsewhere: a notice in
``notices``, a step key's acknowledgement in ``step_keys``.

This module owns the handler's threads: it starts the driver and the reader
(:meth:`ProtocolDriver._start_watchers`) and stops both at ``close()``
(:meth:`ProtocolDriver._stop_watchers`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any, Optional

from .._native import Input, WriteKind, Writes
from .._platforms import notice_sources as _sources
from .keys import THREAD_JOIN_TIMEOUT
from .retries import Write

log = logging.getLogger("tf_failure_handling")


class ProtocolDriver:
    """The driver thread's loop over the inbox, and the handler's threads.

    Owns ``_sources``, ``_driver_thread``, ``_peer_thread``, ``_notices_handled`` and the
    writes (``_writes``, the core's schedule; ``_pending_writes``, each one's call);
    reads ``_state.closing``, ``_state.environment``, ``_signals``, ``_termination_watcher_fn``,
    ``_local_mode``, ``_id_in_cluster`` and ``_state.clock``. The inputs go to
    ``_start_notice`` (``notices``) and ``_on_step_key`` (``step_keys``), the writes to
    ``_attempt`` (``retries``), an error to ``_fail_in_background`` (``reporting``).
    """

    def _start_watchers(self) -> None:
        self._writes = Writes()
        self._pending_writes: dict = {}
        self._sources = _sources.NoticeSources(
            self._state.environment, self._signals, self._termination_watcher_fn, owner=True
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
        unix_deadline = None if deadline is None else time.time() + (deadline - self._state.clock())
        if (
            sources is None
            or self._state.closing.is_set()
            or not sources.trigger("a termination source", unix_deadline)
        ):
            log.info("Termination notice after shutdown ignored.")

    def _stop_watchers(self) -> None:
        """``close()``: stops the inbox (the driver takes ``Stop``) and joins the threads."""
        self._state.closing.set()
        if self._sources is not None:
            self._sources.close()
        if (
            self._driver_thread is not None
            and self._driver_thread is not threading.current_thread()
        ):
            self._driver_thread.join(THREAD_JOIN_TIMEOUT)
        self._driver_thread = None
        self._stop_peer_watcher()

    def _drive(self) -> None:
        """The protocol driver: takes every input from the inbox and performs the effects.

        Each turn takes at most one input (``NoticeSources.receive``: stop first, then
        step keys and key-read failures, then notices) and makes at most one attempt
        at one write, the most urgent that is due:

        * a **step key** goes to the resolver (``_core.step_key``) and, unless it is
          ``STOP_WATCHER`` or a newer handler owns the notices, queues its
          acknowledgement;
        * a **key-read failure** (the reader gave up) reaches the next ``run()``;
        * a **notice** waits until the one before it is done, then goes to the
          resolver (``_core.notice``): claim ``TERMINATED_WORKER`` (then announce it
          when won), lead (local mode), absorb it, or hand it to a newer handler;
        * a **write** (acknowledge, claim, announce) that fails is retried within the
          core's rule (``retries``), but never by sleeping: the pause before its
          next attempt is the deadline of the next receive, so whatever arrives
          meanwhile is taken at once. **Acknowledgements go first**: a leader waits
          for them, bounded by its peer timeout, so one is never queued behind a
          claim's retries, only behind the one call already in flight;
        * **stop** (``close()``) ends the loop after one last look (:meth:`_finish`).

        No exception ends this thread unnoticed: whatever a turn raises reaches the
        next ``run()`` (:meth:`_fail_in_background`).
        """
        notices: deque = deque()  # notices waiting for the current one
        writes = self._writes
        while True:
            due = writes.poll_timeout()
            try:
                item = self._sources.receive(
                    None if due is None else max(0.0, due - time.monotonic())
                )
            except BaseException as e:  # noqa: BLE001 - handed to the next run()
                self._fail_in_background("the protocol driver's receive", e)
                return
            if self._state.closing.is_set() or isinstance(item, Input.Stop):
                self._finish(item, notices)
                return
            self._take(item, notices)
            while not writes.busy and notices:
                self._start_notice(notices.popleft())
            handle = writes.poll_action(time.monotonic())
            if handle is not None:
                self._attempt_and_follow(self._pending_writes[handle])

    def _attempt_and_follow(self, write: Write) -> None:
        """One attempt of ``write``; once it is finished, the write that follows it (the
        announce after a won claim) is queued by ``on_done``, and a notice whose last write
        finished is counted as handled."""
        try:
            finished, after = self._attempt(write)
        except BaseException as e:  # noqa: BLE001 - handed to the next run()
            self._writes.done(write.id)
            self._fail_in_background(write.what, e)
            finished, after = True, None
        if not finished:
            return
        self._pending_writes.pop(write.id, None)
        if write.kind != WriteKind.Acknowledge and after is None:
            self._notices_handled += 1

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
        (``Writes.close``).
        """
        try:
            if item is not None and not isinstance(item, Input.Stop):
                self._take(item, notices)
            for later in self._sources.drain():
                self._take(later, notices)
        except BaseException as e:  # noqa: BLE001 - closing: logged there
            self._fail_in_background("the protocol driver's last look", e)
        last_attempts, dropped_claim = self._writes.close(time.monotonic())
        for handle in last_attempts:
            write = self._pending_writes.pop(handle)
            try:
                self._attempt(write)
            except BaseException as e:  # noqa: BLE001 - closing: logged there
                self._fail_in_background(write.what, e)
            if write.kind != WriteKind.Acknowledge:
                self._notices_handled += 1
        dropped = [f"the notice from {n.source}" for n in notices]
        if dropped_claim is not None:
            dropped.append(self._pending_writes.pop(dropped_claim).what)
        for what in dropped:
            log.info(
                "Closing: %s dropped (a notice is not acted on while the handler closes).", what
            )
            self._notices_handled += 1

    def _take(self, item: Any, notices: deque) -> None:
        """Files one input: a notice waits its turn, a step key may queue an
        acknowledgement, a key-read failure reaches the next ``run()``."""
        if item is None:  # the deadline of a retry: nothing arrived
            return
        try:
            if isinstance(item, _sources.Notice):
                notices.append(item)
            elif isinstance(item, Input.StepKey):
                self._on_step_key(item.round_key, item.value)  # queues the acknowledgement
            elif isinstance(item, Input.KeyReadFailed):
                self._fail_in_background("watching the peers' step keys", item.error)
        except BaseException as e:  # noqa: BLE001 - handed to the next run()
            self._fail_in_background("watching the peers' step keys", e)
