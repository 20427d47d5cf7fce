"""``PreemptionCheckpointHandler`` and ``TerminationConfig``: the API, as TensorFlow's
(``TerminationConfig`` is defined in ``_termination_config`` and re-exported here).

The protocol (who saves at which step, the two grace rounds) is decided by the Rust core
(``src/step_resolution.rs``) and performed by the parts in ``_protocol/``, which the
handler builds and wires together; docs/how-it-works.md describes both.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from typing import Any, Callable, Iterator, Optional

from . import _errors, records
from ._cluster import coordination as _coordination
from ._cluster import membership as _membership
from ._native import Event, HandlerCore
from ._platforms import common as _common
from ._platforms import notice_sources as _sources
from ._platforms import platform as _platform
from ._protocol import exit_guard as _exit_guard
from ._protocol import input_position as _input
from ._protocol.agreement import Agreement
from ._protocol.checkpoints import Checkpoints
from ._protocol.context import Context
from ._protocol.driver import Driver
from ._protocol.keys import (  # noqa: F401 - re-exported: the protocol's keys
    EXIT_RESERVE_ENV,
    LAST_RUN_TO_CHECKPOINT,
    PEER_TIMEOUT_ENV,
    PREEMPTION_NOTICE_KEY,
    RUN_TO_CHECKPOINT,
    STOP_WATCHER,
    TERMINATED_WORKER,
)
from ._protocol.notices import NoticeResponse
from ._protocol.ownership import Ownership
from ._protocol.ps_steps import PsSteps
from ._protocol.records_hooks import StageRecords
from ._protocol.reporting import ErrorReports
from ._protocol.retries import Retrier
from ._protocol.save import SaveAndExit
from ._protocol.state import HandlerState, Settings
from ._protocol.step_check import StepCheck
from ._protocol.step_keys import StepKeys
from ._protocol.step_watch import StepWatch
from ._protocol.survivor_save import RAISE, SurvivorSave, lost_worker_mode
from ._termination_config import TerminationConfig, _check_seconds

log = logging.getLogger("tf_failure_handling")


def _peer_timeout(config: TerminationConfig) -> Optional[float]:
    """The peer timeout ``TerminationConfig(peer_timeout=...)`` or
    ``TF_FAILURE_HANDLING_PEER_TIMEOUT`` sets; None: the core's default
    (``DEFAULT_PEER_TIMEOUT``, ``src/step_resolution.rs``): the bound on every wait for a
    peer (acknowledgements, a blocked step before its peers are probed: step_watch)."""
    if config.peer_timeout is not None:
        return config.peer_timeout
    raw = os.environ.get(PEER_TIMEOUT_ENV)
    if raw:
        try:
            value = float(raw)
        except ValueError as e:
            raise ValueError(f"{PEER_TIMEOUT_ENV}={raw!r} is not a number of seconds") from e
        return _check_seconds(PEER_TIMEOUT_ENV, value)
    return None


#: Open handlers: a handler stays alive until ``close()`` even when the script drops it
#: (its threads hold only its parts), so that its notices are still acted on.
_open: set = set()


def _view(path: str) -> property:
    """The handler's attribute as a view of ``path`` (``"_state.grace_period"``): TensorFlow's
    names, and those tests and other libraries read or set, as on TensorFlow's handler."""
    *owners, name = path.split(".")

    def owner(self: Any) -> Any:
        for step in owners:
            self = getattr(self, step)
        return self

    def get(self: Any) -> Any:
        return getattr(owner(self), name)

    def set_(self: Any, value: Any) -> None:
        setattr(owner(self), name, value)

    return property(get, set_, doc=f"``{path}``.")


def _core_view(name: str) -> property:
    """The handler's attribute as a view of its protocol object's configuration
    option ``name``: read from its state, set with ``configure``."""

    def get(self: Any) -> Any:
        return self._core.state()[name]

    def set_(self: Any, value: Any) -> None:
        self._core.configure(**{name: value})

    return property(get, set_, doc=f"``_core``'s ``{name}``.")


class PreemptionCheckpointHandler(HandlerCore):
    """Saves a checkpoint at one agreed step when any worker gets a termination notice.

    Replaces ``tf.distribute.experimental.PreemptionCheckpointHandler`` with the same
    constructor, methods, coordination-service keys, checkpoint layout and exit codes.
    ``run(fn, *args, **kwargs)`` is native: with no notice pending it adds a clock read
    (the step time) and two atomic loads to calling ``fn``. It differs where TensorFlow
    hangs, loses a notice or does not support a platform: docs/differences.md.
    """

    _membership = _view("_state.membership")
    _environment = _view("_state.environment")
    _coordination = _view("_state.coordination")
    _cluster_resolver = _view("_state.cluster_resolver")
    _peer_timeout = _core_view("peer_timeout")
    _grace_period = _view("_state.grace_period")
    _closed = _view("_state.closed")
    _attention = _view("_core.attention")
    _thread_error = _view("_errors.pending")
    _notices_handled = _view("_driver.notices_handled")
    _local_mode = _view("_state.membership.local")
    _id_in_cluster = _view("_state.membership.id_in_cluster")
    _is_chief = _view("_state.membership.is_chief")
    _platform_device = _view("_state.settings.device")
    _termination_watcher_fn = _view("_driver.sources.watcher_fn")
    _exit_fn = _view("_saver.exit_fn")
    _save_fn = _view("_checkpoints.save_fn")
    _api_made_checkpoint_manager = _view("_checkpoints.api_made")
    _checkpointed_runs = _view("_checkpoints.counter")
    _checkpoint_time = _view("_checkpoints.last_save_seconds")
    _read_checkpoint_manager = _view("_checkpoints.read")
    _write_checkpoint_manager = _view("_checkpoints.write")

    def __init__(
        self,
        cluster_resolver: Any,
        checkpoint_or_checkpoint_manager: Any,
        checkpoint_dir: Optional[str] = None,
        termination_config: Optional[TerminationConfig] = None,
    ) -> None:
        #: What the parts share; first, so that ``__del__`` of a handler whose
        #: constructor raised finds it.
        self._state = state = HandlerState()
        super().__init__()
        # A new handler: this process trains on, whatever an earlier one's exit
        # guard was waiting for (a SystemExit caught, as TensorFlow's own tests do).
        _exit_guard.disarm()
        #: The decisions (the Rust resolver ``run()`` reads too), for the parts.
        self._core = core = self._protocol_core()
        self._total_run_calls_warned = False

        _errors.module()
        config = TerminationConfig._from_any(termination_config)
        self._termination_config = termination_config
        self._checkpoint_or_checkpoint_manager = checkpoint_or_checkpoint_manager
        self._checkpoint_dir = checkpoint_dir

        member = _membership.membership(cluster_resolver)
        environment = _platform.environment()
        defaults = _platform.complete(
            environment,
            config.termination_watcher_fn,
            config.exit_fn,
            config.grace_period,
            config.signals,
        )
        peer_timeout = _peer_timeout(config)
        exit_reserve = _common.seconds(EXIT_RESERVE_ENV, minimum=0.0)
        # Each scheduler's options (SLURM's requeue), for its step after the save.
        platform_options = _platform.attach(environment, config)
        options: dict = {} if exit_reserve is None else {"exit_reserve": exit_reserve}
        if peer_timeout is not None:
            options["peer_timeout"] = float(peer_timeout)
        # A bad value of the variable fails here, before any thread.
        lost_worker = lost_worker_mode(config.lost_worker)
        # The protocol object, configured: it answers with the bound on one of its
        # coordination-service writes, the client's default.
        write_bound = core.configure(
            worker_id=member.worker_id,
            num_workers=member.num_workers,
            grace_period=float(defaults.grace_period),
            save_at_current_run=member.ps_coordinator,
            lost_worker_saves=lost_worker != RAISE,
            **options,
        )
        state.configure(
            Settings(
                membership=member,
                environment=environment,
                coordination=None
                if member.local
                else _coordination.Client(_coordination.current(), write_bound),
                cluster_resolver=cluster_resolver,
                grace_period=defaults.grace_period,
                device=defaults.device or environment.device,
                exit_fn=defaults.exit_fn,
                platform_options=platform_options,
            )
        )

        self._checkpoints = Checkpoints(
            checkpoint_or_checkpoint_manager,
            checkpoint_dir,
            member.is_chief,
            member.task_id,
            config.save_fn,
            member.worker_id,
            member.num_workers if member.task_type in ("chief", "worker") else 1,
            state.coordination,
        )

        # The core times the restore (and each save) on its clock.
        self._checkpoints.core = core
        self._run_counter = self._checkpoints.restore()
        self._records = records.Recorder(
            records.folder_for(
                # With a save_fn the user saves elsewhere: nothing is written beside
                # the checkpoints unless records_dir or the variable says where.
                None
                if config.save_fn is not None
                else checkpoint_dir or getattr(checkpoint_or_checkpoint_manager, "directory", None),
                config.records_dir,
            ),
            member.task_type or "local",
            member.task_id or 0,
            platform=state.environment.cloud or state.environment.scheduler or "local",
        )
        #: Each stage of a preemption as a line of the records.
        self._stage_records = stage = StageRecords(
            self._records,
            state,
            f"{member.task_type} {member.task_id}" if member.task_type else "local 0",
        )
        stage.resumed(self._run_counter)
        restore = self._checkpoints.restore_seconds
        if restore is not None and self._checkpoints.restore_deferred:
            log.info(
                "Checkpoint restored in %.3fs, but part of it waits for variables not made "
                "yet (restored when they are): no save estimate until a save is timed.",
                restore,
            )
        elif restore is not None:
            # Until this process has saved, the restore is its estimate of a save.
            core.handle(Event.Restored())
            log.info("Checkpoint restored in %.3fs: the save estimate until one is timed.", restore)

        # The parts, each given what it uses (docs/how-it-works.md, "Who does what").
        sources = _sources.NoticeSources(
            state.environment, defaults.signals, defaults.watcher_fn, owner=True
        )
        retrier = Retrier(state, core)  # the reader's and the leader's; the driver makes its own
        self._errors = errors = ErrorReports(state, core)
        self._ownership = ownership = Ownership(state, core)
        ownership.sources = sources
        ctx = Context(state, core, errors, stage)
        self._step_keys = step_keys = StepKeys(ctx, sources, retrier, ownership)
        self._ps = ps = PsSteps(state, core, stage, sources)
        self._agreement = agreement = Agreement(state, core, retrier, stage)
        notices = NoticeResponse(ctx, ownership, ps)
        self._saver = saver = SaveAndExit(ctx, self._checkpoints, ps, step_keys)
        self._driver = Driver(ctx, sources, notices, step_keys.acknowledge)
        self._steps = StepCheck(ctx, agreement, saver)
        #: The last whole step, held after each run() (``_hold_step``), saved by survivors.
        self._survivors = errors.survivors = SurvivorSave(
            ctx, self._checkpoints, checkpoint_dir, lost_worker, saver.exit_after_loss
        )

        self._driver.start()
        if not member.local:
            step_keys.start_reader()
        self._step_watch = StepWatch(ctx).start()  # a step blocked on a peer that is gone
        _open.add(self)
        ownership.take_over()
        if member.ps_coordinator:
            ps.start_watch(
                cluster_resolver, checkpoint_or_checkpoint_manager, self._steps, peer_timeout
            )
        #: The input whose position is saved (``track_input``, or tf_keras fit's own).
        self._input_tracker: Optional[_input.InputTracker] = _input.track_tf_keras_fit(
            self._checkpoints, max(1, member.num_workers or 1), lambda: self._run_counter
        )
        log.info(
            "PreemptionCheckpointHandler initialized or restored: worker %s, %d run(s) restored, "
            "platform %s (cloud %s, scheduler %s), grace period %gs, signals %s.",
            self._id_in_cluster,
            self._run_counter,
            self._platform_device.name,
            state.environment.cloud or "none",
            state.environment.scheduler or "none",
            state.grace_period,
            ", ".join(_sources.signal_name(s) for s in defaults.signals),
        )

    # ------------------------------------------------------------------ API

    def save_checkpoint_if_preempted(self, *args: Any, **kwargs: Any) -> None:
        """Saves (and maybe exits) at the agreed step, then counts one run.

        For loops that do not wrap their step in :meth:`run`; the arguments go to
        the checkpoint manager's ``save`` (orbit passes ``checkpoint_number``).
        """
        if self._core.begin_step():
            self._steps.check(args, kwargs)
        self._core.step_done()

    @property
    def total_run_calls(self) -> int:
        """Calls to ``run`` so far, including those restored from the checkpoint.

        Deprecated in TensorFlow (track steps in a checkpointed variable); kept
        for scripts that use it.
        """
        if not self._total_run_calls_warned:
            self._total_run_calls_warned = True
            log.warning(
                "total_run_calls is deprecated in TensorFlow: track steps using a "
                "tf.Variable saved in the checkpoint instead."
            )
        return self._run_counter

    def track_input(
        self,
        dataset: Any,
        steps_per_epoch: Optional[int] = None,
        batches_per_run: int = 1,
    ) -> Any:
        """Saves the position of ``dataset`` with every checkpoint and resumes it there.

        ``dataset`` is the loop's input: a ``tf.data.Dataset`` or what
        ``strategy.experimental_distribute_dataset`` or
        ``distribute_datasets_from_function`` returned. It is returned, tracked: each
        ``iter(dataset)`` is counted, and the checkpoint records which iterator was in
        use and how many batches it had given at the agreed step (each :meth:`run`
        since the iterator was made draws ``batches_per_run`` of them). After a restart
        the first ``iter(dataset)`` is the interrupted run's iterator at its next batch:
        a shuffle reshuffled each epoch gives the same order, so every element is
        trained as often as in an uninterrupted run. ``steps_per_epoch``: the steps the
        loop takes from one iterator before it makes the next, when fewer than the
        input holds (tells a save at an epoch's last step from one mid-epoch).

        One line in TensorFlow's docstring loop, after the handler is made::

            multi_worker_dataset = handler.track_input(multi_worker_dataset)

        An input that allows random access (elements read by index) is restored in a
        time that does not grow with the position when ``dataset`` is a function
        ``builder(iteration, batch)`` returning the input of that iteration (a pass
        over the data, from 0) from its ``batch``-th batch on, e.g.
        ``Dataset.range(batch * B, N).map(read)`` with a permutation that depends on
        ``iteration``: nothing is replayed. It returns an iterable to make iterators of.

        Input whose order cannot be replayed (a Python generator, ``deterministic=False``,
        a shuffle with no seed, ``sample_from_datasets`` with no seed, a ``cache()`` in
        memory after a shuffle that reshuffles each epoch) gets a warning naming why,
        and today's behaviour. Any other iterable (a list, a NumPy array, an iterator)
        is returned unchanged, with the warning. docs/input-position.md.

        Raises:
          TypeError: ``dataset`` is not iterable (``None``, a number) and no builder.
          ValueError: ``steps_per_epoch`` or ``batches_per_run`` is not a positive
            integer.
        """
        member = self._state.membership
        tracker = _input.track_input(
            self._checkpoints,
            max(1, member.num_workers or 1),
            dataset,
            steps_per_epoch,
            batches_per_run,
            runs=lambda: self._run_counter,
        )
        self._input_tracker = tracker
        return tracker.dataset

    @contextlib.contextmanager
    def watch_preemption_scope(self) -> Iterator[None]:
        """Reports an ``OpError`` raised inside the block to the cluster, then re-raises it.

        With MultiWorkerMirroredStrategy ``run`` already does this; the scope is for
        TPUStrategy-style loops, as in TensorFlow, and tf_keras' batch loop (the step
        watch follows ``_run_counter`` inside it, as inside ``run()``)."""
        try:
            with self._step_watch.scope():
                yield
        except _errors.module().OpError as e:
            self._errors.propagate(e)
            raise

    def close(self) -> None:
        """Stops the watchers and restores the signal handlers. Idempotent.

        TensorFlow relies on ``__del__`` for this; ``__del__`` calls it too."""
        if self._state.closed:
            return
        self._state.closed = True
        _open.discard(self)
        self._ownership.give_up()
        self._driver.stop()
        self._step_keys.stop_reader()
        self._step_watch.stop()
        self._records.close()
        self._ps.end_watch()
        tracker = getattr(self, "_input_tracker", None)
        if tracker is not None:
            tracker.close()

    def __del__(self) -> None:
        # On the main thread, outside interpreter exit (an explicit ``del``, the last
        # reference dropped by the training loop, TF's tests calling ``__del__()``): a
        # full close(), as TensorFlow's __del__ stops its peer watcher (writes
        # STOP_WATCHER) and joins it. Anywhere else it never joins, writes to the cluster
        # or starts a thread: __del__ may run at interpreter exit, where a new thread
        # blocks forever, or on one of the handler's own threads. A handler whose
        # constructor raised lacks some parts: each step is skipped then.
        state = getattr(self, "_state", None)
        if state is None or state.closed:
            return
        complete = getattr(self, "_driver", None) is not None
        if (
            complete
            and not sys.is_finalizing()
            and threading.current_thread() is threading.main_thread()
        ):
            try:
                self.close()
                return
            except Exception:  # noqa: BLE001 - fall back to the stops that cannot block
                pass
        state.closed = True
        for stop in (
            lambda: self._ownership.give_up(),
            lambda: self._driver.stop(join=False),
            lambda: self._records.close(wait=False),
            lambda: self._ps.end_watch(stop_poller=False),
        ):
            with contextlib.suppress(Exception):
                stop()

    # ------------------------------------------- hooks other libraries call

    def _check_preemption_and_maybe_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """Acts on a notice or an agreed step before the next step; the arguments go to
        the checkpoint manager's ``save``.

        For libraries that count their own steps instead of calling :meth:`run`:
        tf_keras' ``BackupAndRestore(save_before_preemption=True)`` does
        ``_run_counter += 1`` and then calls this once per batch. As with ``run()``,
        the time between two calls (less any save or agreement) is a step time for the
        grace period's plan. The batch that just ended is the last whole step the
        survivors of a lost worker would save (held as after a ``run()``).
        """
        self._survivors.hold_counted(self._run_counter)
        self._steps.check_now(args, kwargs)

    def _save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """Saves now, recording the run count (TF's private method of this name)."""
        self._checkpoints.save(self._run_counter, args, kwargs)

    def _hold_step(self) -> None:
        """After a step that returned, in a cluster (``run()`` calls it): the variables
        are held as the last whole step (``_protocol/survivor_save.py``)."""
        self._survivors.hold(self._run_counter)

    def _core_state(self) -> dict:
        """The protocol object's state, for logs and tests."""
        return self._core.state()

    def _propagate_error(self, error: BaseException) -> Optional[BaseException]:
        """Reports a step's ``OpError`` to every worker (keras.py calls it)."""
        return self._errors.propagate(error)

    def _notify_termination(self, deadline: Optional[float] = None) -> None:
        """Delivers a notice as a termination source would (used by ``testing``);
        ``deadline`` is on the handler's clock (the protocol object's: ``time.monotonic``
        unless a simulation substituted its own with ``_core.configure(clock=...)``)."""
        self._driver.notify(deadline)

    # The native run() calls these three on the slow path.

    def _run_with_keywords(
        self, distributed_train_function: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """``run(distributed_train_function=f, ...)``: TF's signature, by keyword."""
        return self.run(distributed_train_function, *args, **kwargs)

    def _run_check(self) -> None:
        self._steps.run_check()

    def _run_failed(self, error: BaseException) -> BaseException:
        return self._steps.run_failed(error)
