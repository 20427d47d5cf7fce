"""A follower's side of a round: read the step keys a leader publishes, acknowledge each.

A leader publishes ``RUN_TO_CHECKPOINT`` (and, with a grace period,
``LAST_RUN_TO_CHECKPOINT``) = the step every worker saves at. On every worker a reader
thread (``PeerTerminationWatcher-<id>``) blocks on those keys, in the slices the core
gives (``Action.Read``, ``src/protocol/reader.rs``), and posts each value it reads
into the driver's inbox; it writes nothing. The driver hands the value to the core
(``Event.StepKey``), which queues the acknowledgement, ``RECEIVED_SIGNAL_<round>_<id>``,
which the leader waits for ("Why the driver acknowledges" in ``src/step_resolution.rs``).
At shutdown, every worker writes ``STOP_WATCHER`` to both step keys (the core's writes,
``shutdown_writes``), which releases the readers still blocked on them.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

from .. import _errors
from .._native import Action, Event, Inbox
from .._platforms.notice_sources import NoticeSources
from .context import Context
from .keys import RUN_TO_CHECKPOINT
from .ownership import Ownership
from .retries import Retrier

log = logging.getLogger("tf_failure_handling")
Input = Inbox.Input


class StepKeys:
    """The reader thread over the step keys (``thread``), and the acknowledgement of each
    value it reads (queued for the driver)."""

    def __init__(
        self, ctx: Context, sources: NoticeSources, retrier: Retrier, ownership: Ownership
    ) -> None:
        self._ctx = ctx
        self._state, self._core = ctx.state, ctx.core
        self._errors, self._records = ctx.errors, ctx.records
        self._sources = sources
        self._retrier = retrier
        self._ownership = ownership
        self._reading_key = RUN_TO_CHECKPOINT
        self.thread: Optional[threading.Thread] = None

    def start_reader(self) -> None:
        self.thread = threading.Thread(
            target=self._watch,
            name=f"PeerTerminationWatcher-{self._state.membership.id_in_cluster}",
            daemon=True,
        )
        self.thread.start()

    def acknowledge(self, round_key: str, value: str) -> None:
        """A step key the reader posted, handed to the core, which queues its
        acknowledgement for the driver (none for ``STOP_WATCHER``, nor once a newer
        handler of this worker acknowledges)."""
        superseded = self._ownership.current_owner() is not None
        action = self._core.handle(Event.StepKey(round_key, value, superseded))
        if not isinstance(action, Action.Stop) and not self._core.state()["leading"]:
            self._records.peer_agreement(round_key, value)

    def _watch(self) -> None:
        """The step-key reader: reads the keys a leader publishes (one round, or two with
        a grace period) and posts each value into the inbox, until ``STOP_WATCHER``,
        shutdown, or a newer handler takes over. It writes nothing: the driver
        acknowledges.

        A failed read is retried until reads have failed without a break for longer
        than the bound; then, or on anything unexpected, the error is posted and the
        driver hands it to the next ``run()``.
        """
        try:
            self._watch_until_done()
        except BaseException as e:  # noqa: BLE001 - handed to the driver
            if not self._sources.read_failed(self._reading_key, e):
                # The inbox is stopped: closing (ignored there), or the driver is gone.
                self._errors.fail_in_background("watching the peers' step keys", e)

    def _watch_until_done(self) -> None:
        """The reads the core asks for (``Action.Read``: which key, for how long, each
        pause of the retry rule, what to post and when it is done), made until closing
        or a newer handler takes over."""
        core, state = self._core, self._state
        last_error: Optional[BaseException] = None
        event: Any = Event.Reading()
        while not state.closing.is_set():
            action = core.handle(event)
            if isinstance(action, Action.Read):
                self._reading_key = action.key
                try:
                    value = state.coordination.get(action.key, action.timeout)
                except _errors.module().OpError as e:
                    last_error = e
                    event = Event.ReadFailed(state.closing.is_set())
                else:
                    event = Event.Read(value)
            elif isinstance(action, Action.Post):
                if not self._sources.inbox.post(Input.StepKey(action.round, action.value)):
                    return  # closing
                if self._ownership.current_owner() is not None:
                    return
                event = Event.Reading()
            elif isinstance(action, Action.Pause):
                self._retrier.retrying(
                    action.what, last_error, action.attempts, action.seconds, action.left
                )
                state.closing.wait(action.seconds)
                event = Event.Reading()
            elif isinstance(action, Action.GaveUp):
                raise self._retrier.named(
                    last_error, action.what, action.attempts, action.seconds
                ) from last_error
            else:
                return

    def stop_reader(self) -> None:
        """Releases the peer watcher, the step-key reader (``STOP_WATCHER`` on the step
        keys), and joins it.

        A handler that a newer one took over from writes nothing: the keys belong
        to the newer one's protocol, and its own peer watcher stops by itself.
        """
        thread = self.thread
        if thread is None:
            return
        self.thread = None
        writes, bound = self._core.handle(Event.Shutdown())
        if self._ownership.current_owner() is None:
            for write in writes:
                try:
                    self._state.coordination.set(write.key, write.value, write.timeout)
                except Exception as e:  # noqa: BLE001 - peers may have exited already
                    log.info("Ignoring error while releasing %s: %s", write.key, e)
        if thread is threading.current_thread():
            return
        thread.join(bound)
        if thread.is_alive():
            log.warning(
                "The peer watcher did not stop within %gs; leaving it (daemon thread).",
                bound,
            )
