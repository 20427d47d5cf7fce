"""``PreemptionCheckpointHandler`` and ``TerminationConfig``.

The step-resolution protocol (who saves at which step, the two grace rounds)
lives in the Rust core (``src/step_resolution.rs`` explains it); the classes of
``_protocol/`` perform what the core decides against TensorFlow (coordination-service
keys, checkpoint saves, error reports, the exit) and own the handler's threads, one
concern each (``_protocol/__init__.py`` lists them). This module is the API: the
constructor, TF's public methods and the private hooks other libraries call.

Ownership of a notice: while a handler is open it owns its worker's termination
notices. Signal handlers installed before it are not called (as with TF, whose
``signal.signal`` replaces them) until :meth:`PreemptionCheckpointHandler.close`
restores them; a newer handler of the same worker in the same process (a second
``model.fit``) takes the notices over from an older one that is still open; after
a save whose ``exit_fn`` returns, further notices are absorbed (logged) until
``close()``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from . import _errors, records
from ._cluster import coordination as _coordination
from ._cluster import membership as _membership
from ._native import HandlerCore
from ._platforms import notice_sources as _sources
from ._platforms import platform as _platform
from ._protocol.agreement import Agreement
from ._protocol.checkpoints import Checkpoints
from ._protocol.driver import ProtocolDriver
from ._protocol.keys import (  # noqa: F401 - re-exported: the protocol's keys and bounds
    LAST_RUN_TO_CHECKPOINT,
    PEER_TIMEOUT_ENV,
    PEER_WATCH_SLICE,
    PREEMPTION_NOTICE_KEY,
    RUN_TO_CHECKPOINT,
    SHUTDOWN_WRITE_TIMEOUT,
    STOP_WATCHER,
    TERMINATED_WORKER,
    THREAD_JOIN_TIMEOUT,
)
from ._protocol.notices import NoticeResponse
from ._protocol.ownership import NoticeOwnership
from ._protocol.ps_steps import PsSteps
from ._protocol.records_hooks import StageRecords
from ._protocol.reporting import ErrorReporting
from ._protocol.retries import (  # noqa: F401 - re-exported: the protocol's retry pauses
    RETRY_FIRST_PAUSE,
    RETRY_MAX_PAUSE,
    Retries,
)
from ._protocol.save import SaveAndExit
from ._protocol.state import HandlerState
from ._protocol.step_check import StepCheck
from ._protocol.step_keys import StepKeyWatch

if TYPE_CHECKING:
    from ._coordinator.ps_control import ClusterPoller

log = logging.getLogger("tf_failure_handling")


#: Seconds the leader waits for every worker to acknowledge a step key, unless
#: ``TerminationConfig(peer_timeout=...)`` or ``TF_FAILURE_HANDLING_PEER_TIMEOUT``
#: says otherwise. Acknowledgements come from a background thread of each peer and
#: normally take milliseconds; the bound is there for a peer that is gone.
DEFAULT_PEER_TIMEOUT = 300.0
#: How often ``termination_watcher_fn`` is called (TF: once a second).
WATCHER_FN_INTERVAL = _sources.WATCHER_FN_INTERVAL


def _check_callable(name: str, value: Any) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be callable or None, got {type(value).__name__}")


def _check_seconds(name: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite, non-negative number of seconds, got {value}")
    return value


class TerminationConfig:
    """How a worker learns of its end, how it exits, and how long it has.

    Replaces ``tf.distribute.experimental.TerminationConfig`` with the same
    constructor. Differences from TensorFlow:

    * a ``termination_watcher_fn`` is polled *in addition to* the signals, not
      instead of SIGTERM;
    * ``grace_period`` must be a non-negative number (TF accepts anything and
      treats negatives as 0);
    * keyword-only extras: ``peer_timeout`` bounds the wait for peers'
      acknowledgements (TF waits forever), ``signals`` lists the signals that
      count as a notice (default SIGTERM, plus SIGUSR1 under SLURM, whose
      ``--signal`` usually sends it), ``records_dir`` where the preemption
      records go (``tf_failure_handling.records``; default
      ``<checkpoint_dir>/preemption_records``, ``False`` for none),
      ``slurm_requeue`` whether, under SLURM, a job that ends by its time limit or
      a preemption is put back in the queue after the save (default on, unless
      ``TF_FAILURE_HANDLING_SLURM_REQUEUE=0``; see ``_platforms/slurm.py``);
    * the defaults follow the platform (``complete`` in ``_platforms/platform.py``): AWS
      and Azure get a grace period (120 s, 30 s) capped by the deadline their notices
      carry; GCE CPU and TPU VMs are supported.
    """

    def __init__(
        self,
        termination_watcher_fn: Optional[Callable[[], bool]] = None,
        exit_fn: Optional[Callable[[], Any]] = None,
        grace_period: Optional[float] = None,
        save_fn: Optional[Callable[..., Any]] = None,
        *,
        peer_timeout: Optional[float] = None,
        signals: Optional[Sequence[int]] = None,
        records_dir: Any = None,
        slurm_requeue: Optional[bool] = None,
    ) -> None:
        _check_callable("termination_watcher_fn", termination_watcher_fn)
        _check_callable("exit_fn", exit_fn)
        _check_callable("save_fn", save_fn)
        self.termination_watcher_fn = termination_watcher_fn
        self.exit_fn = exit_fn
        self.grace_period = _check_seconds("grace_period", grace_period)
        self.save_fn = save_fn
        self.peer_timeout = _check_seconds("peer_timeout", peer_timeout)
        self.signals = None if signals is None else tuple(_sources.signal_numbers(signals))
        if records_dir is not None and records_dir is not False:
            if not isinstance(records_dir, (str, os.PathLike)):
                raise TypeError(
                    "records_dir must be a path, False (no records) or None, got "
                    f"{type(records_dir).__name__}"
                )
        self.records_dir = records_dir
        if slurm_requeue is not None and not isinstance(slurm_requeue, bool):
            raise TypeError(
                f"slurm_requeue must be True, False or None, got {type(slurm_requeue).__name__}"
            )
        self.slurm_requeue = slurm_requeue

    @classmethod
    def _from_any(cls, config: Any) -> TerminationConfig:
        """Accepts ours, TF's own ``TerminationConfig`` (same attributes), or None."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        if all(
            hasattr(config, a)
            for a in ("termination_watcher_fn", "exit_fn", "grace_period", "save_fn")
        ):
            return cls(
                config.termination_watcher_fn,
                config.exit_fn,
                config.grace_period,
                config.save_fn,
            )
        raise TypeError(
            f"termination_config must be a TerminationConfig or None, got {type(config).__name__}"
        )


def _peer_timeout(config: TerminationConfig) -> float:
    if config.peer_timeout is not None:
        return config.peer_timeout
    raw = os.environ.get(PEER_TIMEOUT_ENV)
    if raw:
        try:
            value = float(raw)
        except ValueError as e:
            raise ValueError(f"{PEER_TIMEOUT_ENV}={raw!r} is not a number of seconds") from e
        return _check_seconds(PEER_TIMEOUT_ENV, value)
    return DEFAULT_PEER_TIMEOUT


def _state_view(name: str) -> property:
    """The handler's attribute ``_<name>`` as a view of ``_state.<name>`` (TensorFlow's
    names, and those tests and other libraries read or set)."""

    def get(self: Any) -> Any:
        return getattr(self._state, name)

    def set_(self: Any, value: Any) -> None:
        setattr(self._state, name, value)

    return property(get, set_, doc=f"``_state.{name}`` (``_protocol/state.py``).")


class PreemptionCheckpointHandler(
    # The training thread: the check before a step, the leader's round, the save.
    StepCheck,
    Agreement,
    SaveAndExit,
    # The driver and reader threads: the inbox, a notice, the step keys.
    ProtocolDriver,
    NoticeResponse,
    StepKeyWatch,
    # What they share: retries, errors, which handler of a worker acts.
    Retries,
    ErrorReporting,
    NoticeOwnership,
    # A parameter-server coordinator's steps.
    PsSteps,
    # The resolver (src/step_resolution.rs) and the native run().
    HandlerCore,
):
    """Saves a checkpoint at one agreed step when any worker gets a termination notice.

    Replaces ``tf.distribute.experimental.PreemptionCheckpointHandler`` with the
    same constructor, methods, coordination-service keys, checkpoint layout and
    exit codes. ``run(fn, *args, **kwargs)`` is native: with no notice pending it
    adds a clock read (the step time) and two atomic loads to calling ``fn``.
    Differences from TensorFlow:

    * every wait for peers is bounded (``TerminationConfig(peer_timeout=...)``),
      and a timeout raises ``tf.errors.DeadlineExceededError`` naming the workers
      that did not answer;
    * it can be built off the main thread; SIGTERM is caught through
      ``sigaction``. As with TF, a handler installed before it is not called
      while it is open (it could end the process before the save); unlike TF,
      :meth:`close` restores it, and one installed later is warned about;
    * a second handler of the same worker takes the notices over from an open
      older one (TF: both react); after an ``exit_fn`` that returns, further
      notices are absorbed until :meth:`close`;
    * SIGTERM is watched even when a ``termination_watcher_fn`` is given;
    * a notice from any source wakes the watcher at once (TF polls once a second);
    * the final save of a grace period is planned from measured save and step
      times (see ``src/grace.rs``);
    * ``_run_counter`` is a plain ``int``;
    * a ``tf.train.Checkpoint`` without ``checkpoint_dir`` raises
      ``InvalidArgumentError`` (TF raises a ``TypeError`` while trying to);
    * GCE CPU and TPU VMs are supported.
    """

    _membership = _state_view("membership")
    _environment = _state_view("environment")
    _coordination = _state_view("coordination")
    _cluster_resolver = _state_view("cluster_resolver")
    _peer_timeout = _state_view("peer_timeout")
    _grace_period = _state_view("grace_period")
    _clock = _state_view("clock")
    _closing = _state_view("closing")
    _closed = _state_view("closed")

    def __init__(
        self,
        cluster_resolver: Any,
        checkpoint_or_checkpoint_manager: Any,
        checkpoint_dir: Optional[str] = None,
        termination_config: Optional[TerminationConfig] = None,
    ) -> None:
        #: What the parts share (``_protocol/state.py``); first, so that ``__del__`` of a
        #: handler whose constructor raised finds it.
        self._state = HandlerState()
        super().__init__()
        #: The decisions (the Rust resolver ``run()`` reads too), for the parts.
        self._core = self._protocol_core()
        #: The protocol driver's thread (``_protocol.driver.ProtocolDriver._drive``).
        self._driver_thread: Optional[threading.Thread] = None
        self._peer_thread: Optional[threading.Thread] = None
        self._sources: Optional[_sources.NoticeSources] = None
        self._total_run_calls_warned = False
        #: The newer handler of the same worker that owns the notices now, if any.
        self._successor: Optional[weakref.ref] = None
        #: An error a background thread of this handler met; raised by the next run().
        self._thread_error: Optional[BaseException] = None
        #: Notices the driver has finished with (acted on, absorbed, handed on or dropped at close).
        self._notices_handled = 0
        #: ParameterServerStrategy: the watch over the PS and worker tasks.
        self._ps_poller: Optional[ClusterPoller] = None
        #: PS tasks whose notice this coordinator acts on (released after the save).
        self._ps_with_notice: set = set()
        #: ParameterServerStrategy: the strategy of the checkpoint's variables (where
        #: TensorFlow keeps its coordinator), and what the last save left unfinished.
        self._ps_strategy: Any = None
        self._ps_unfinished: Any = None

        _errors.module()
        config = TerminationConfig._from_any(termination_config)
        self._state.cluster_resolver = cluster_resolver
        self._termination_config = termination_config
        self._checkpoint_or_checkpoint_manager = checkpoint_or_checkpoint_manager
        self._checkpoint_dir = checkpoint_dir

        self._state.membership = _membership.membership(cluster_resolver)
        self._local_mode = self._state.membership.local
        self._id_in_cluster = self._state.membership.id_in_cluster
        self._is_chief = self._state.membership.is_chief

        self._state.environment = _platform.environment()
        self._platform_device = self._state.environment.device
        defaults = _platform.complete(
            self._state.environment,
            config.termination_watcher_fn,
            config.exit_fn,
            config.grace_period,
            config.signals,
        )
        self._termination_watcher_fn = defaults.watcher_fn
        self._exit_fn = defaults.exit_fn
        self._state.grace_period = defaults.grace_period
        self._save_fn = config.save_fn
        self._state.peer_timeout = _peer_timeout(config)
        self._signals = defaults.signals
        self._platform_options = _platform.attach(self._state.environment, config)

        self._checkpoints = Checkpoints(
            checkpoint_or_checkpoint_manager,
            checkpoint_dir,
            self._is_chief,
            self._state.membership.task_id,
        )
        self._api_made_checkpoint_manager = self._checkpoints.api_made
        self._checkpointed_runs = self._checkpoints.counter

        self._state.coordination = (
            None
            if self._local_mode
            else _coordination.Client(
                _coordination.current(), max(1.0, min(self._state.peer_timeout, 60.0))
            )
        )

        self._run_counter = self._checkpoints.restore()
        member = self._state.membership
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
            platform=self._state.environment.cloud or self._state.environment.scheduler or "local",
        )
        #: Each stage of a preemption as a line of the records (``_records`` writes them).
        self._stage_records = StageRecords(
            self._records,
            self._state,
            f"{member.task_type} {member.task_id}" if member.task_type else "local 0",
        )
        self._stage_records.resumed(self._run_counter)
        self._core.configure(
            self._state.membership.worker_id,
            self._state.membership.num_workers,
            float(self._state.grace_period),
            self._state.membership.ps_coordinator,
        )
        self._start_watchers()
        self._take_over_notices()
        if self._state.membership.ps_coordinator:
            self._start_ps_watch(cluster_resolver, checkpoint_or_checkpoint_manager)
        log.info(
            "PreemptionCheckpointHandler initialized or restored: worker %s, %d run(s) restored, "
            "platform %s (cloud %s, scheduler %s), grace period %gs, signals %s.",
            self._id_in_cluster,
            self._run_counter,
            self._platform_device.name,
            self._state.environment.cloud or "none",
            self._state.environment.scheduler or "none",
            self._state.grace_period,
            ", ".join(_sources.signal_name(s) for s in self._signals),
        )

    # ------------------------------------------------------------------ API

    def save_checkpoint_if_preempted(self, *args: Any, **kwargs: Any) -> None:
        """Saves (and maybe exits) at the agreed step, then counts one run.

        For loops that do not wrap their step in :meth:`run`; the arguments go to
        the checkpoint manager's ``save`` (orbit passes ``checkpoint_number``).
        """
        if self._core.begin_step():
            self._check_before_step(args, kwargs)
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

    @contextlib.contextmanager
    def watch_preemption_scope(self) -> Iterator[None]:
        """Reports an ``OpError`` raised inside the block to the cluster, then re-raises it.

        With MultiWorkerMirroredStrategy ``run`` already does this; the scope is
        for TPUStrategy-style loops, as in TensorFlow.
        """
        try:
            yield
        except _errors.module().OpError as e:
            self._propagate_error(e)
            raise

    def close(self) -> None:
        """Stops the watchers and restores the signal handlers. Idempotent.

        TensorFlow relies on ``__del__`` for this; ``__del__`` calls it too.
        """
        if self._state.closed:
            return
        self._state.closed = True
        self._give_up_ownership()
        self._stop_watchers()
        self._records.close()
        self._end_ps_watch()

    def __del__(self) -> None:
        # Never joins, writes to the cluster or starts a thread: __del__ may run
        # at interpreter exit, where a new thread blocks forever.
        with contextlib.suppress(Exception):
            if not self._state.closed:
                self._state.closed = True
                self._give_up_ownership()
                self._state.closing.set()
                if self._sources is not None:
                    self._sources.close(join=False)
                self._records.close(wait=False)
                self._end_ps_watch(stop_poller=False)

    # ------------------------------------------- hooks other libraries call

    def _check_preemption_and_maybe_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """Acts on a notice or an agreed step before the next step; the arguments go to
        the checkpoint manager's ``save``.

        For libraries that count their own steps instead of calling :meth:`run`:
        tf_keras' ``BackupAndRestore(save_before_preemption=True)`` does
        ``_run_counter += 1`` and then calls this once per batch. As with ``run()``,
        the time between two calls (less any save or agreement) is a step time for the
        grace period's plan.
        """
        self._core.begin_step()
        try:
            self._act_before_step(args, kwargs)
        finally:
            self._core.after_check()

    @property
    def _read_checkpoint_manager(self) -> Any:
        """The manager restored from at construction (TF's attribute; tf_keras assigns
        its own after construction, as TF's handler allows)."""
        return self._checkpoints.read

    @_read_checkpoint_manager.setter
    def _read_checkpoint_manager(self, manager: Any) -> None:
        self._checkpoints.read = manager

    @property
    def _write_checkpoint_manager(self) -> Any:
        """The manager a preemption save goes through (TF's attribute; assignable)."""
        return self._checkpoints.write

    @_write_checkpoint_manager.setter
    def _write_checkpoint_manager(self, manager: Any) -> None:
        self._checkpoints.write = manager

    def _save_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        """Saves now, recording the run count (TF's private method of this name)."""
        start = self._state.clock()
        self._checkpoints.save(self._run_counter, self._save_fn, args, kwargs)
        self._checkpoint_time = self._state.clock() - start
        log.info(
            "Checkpoint finished at path %s in %.3fs.",
            self._write_checkpoint_manager.directory,
            self._checkpoint_time,
        )
