"""The steps only a ParameterServerStrategy coordinator takes.

The coordinator (the chief) runs no training steps of its own: it schedules closures on
the workers, which, with the parameter servers, only serve (``serving``). Its handler
watches every PS and worker task for notices (``_cluster_poller.ClusterPoller``, over TF's
own RPCs) and:

* a **PS task's notice** counts as its own: the handler saves at its next ``run()``
  (or in ``ClusterCoordinator.join()``), in the same check
  that publishes the run count (:attr:`PsSteps.active`), after the
  scheduled closures finished within the notice's deadline
  (:meth:`PsSteps.before_save`), and releases that PS once the checkpoint is written
  (:meth:`PsSteps.after_save`);
* a **worker task's notice** drains that worker (``_worker_drain.WorkerDrain``): its closure
  in flight finishes, it gets no new one, and it is released.

Every stage is recorded through ``StageRecords`` (``records_hooks``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

from .._cluster import membership as _membership
from .._coordinator import closure_drain as _closure_drain
from .._coordinator import cluster_poller as _cluster_poller
from .._coordinator import coordinators as _coordinators
from .._coordinator import grpc_keepalive as _grpc_keepalive
from .._coordinator import join_checks as _join_checks
from .._coordinator import worker_drain as _worker_drain
from .._integrations import tf_exit as _tf_exit
from .._native import CoordinatorProtocol, ProtocolCore
from .records_hooks import StageRecords
from .state import HandlerState

CoordinatorAction = CoordinatorProtocol.Action
CoordinatorEvent = CoordinatorProtocol.Event
Lane = CoordinatorProtocol.Lane

log = logging.getLogger("tf_failure_handling")


class PsSteps:
    """A parameter-server coordinator's watch over its tasks (``poller``), and its steps
    around a save. ``active`` is False on every other handler, whose calls do nothing.
    The bound of the wait for closures is the core's (``core.drain_bound``)."""

    def __init__(
        self, state: HandlerState, core: ProtocolCore, records: StageRecords, sources: Any
    ) -> None:
        self._state = state
        self._core = core
        self._records = records
        self._sources = sources
        self.poller: Optional[_cluster_poller.ClusterPoller] = None
        #: The strategy of the checkpoint's variables (where TensorFlow keeps its
        #: coordinator), and what the last save left unfinished.
        self._strategy: Any = None
        self._unfinished: Any = None
        #: The finished runs after the last save's first unfinished one: they run again.
        self._finished_after: list = []
        self._join_check: Any = None
        #: How long a failed release after the save is retried (``after_save``: the
        #: core's bound, None until then).

    @property
    def active(self) -> bool:
        """Whether this handler is a PS coordinator's, watching its tasks: then the check
        that publishes the agreed step also saves at it, before scheduling anything more."""
        return self.poller is not None

    def start_watch(
        self, cluster_resolver: Any, checkpoint: Any, join_check: Any, peer_timeout: float
    ) -> None:
        """Starts polling the PS and worker tasks for notices, and makes ``join_check``
        (the handler's step check) the one ``ClusterCoordinator.join()`` makes. The
        strategy of the checkpoint's variables is kept: TensorFlow's own coordinator is
        found on it at save time."""
        self._strategy = _coordinators.strategy_of(checkpoint)
        self.poller = _cluster_poller.ClusterPoller(
            _membership._as_dict(cluster_resolver.cluster_spec()),
            self._on_cluster_notice,
            on_released=self._records.task_release,
            on_stale_context=self._reconnect,
            peer_timeout=peer_timeout,
            # Ours has one: its failure handling's, which then watches the tasks too.
            protocol=_coordinators.protocol_of(self._coordinator()),
        )
        self.poller.start()
        self._join_check = join_check
        _join_checks.register_join(join_check, self.poller.protocol)
        # TF_PSS_ENABLE_COORDINATION_SERVICE: TensorFlow's own coordinator's poller
        # would keep the process from exiting (ours installs this itself).
        _tf_exit.install(self._coordinator())
        if _grpc_keepalive.grpc_keepalive_time() is None:
            log.warning(
                "TF_GRPC_DEFAULT_OPTIONS sets no grpc.keepalive_time_ms (%s=0): a PS or "
                "worker task that is stopped but not gone (SIGSTOP, a hung host) stalls this "
                "coordinator's save until it runs again.",
                _grpc_keepalive.GRPC_KEEPALIVE_ENV,
            )

    def end_watch(self, stop_poller: bool = True) -> None:
        """``close()``; ``__del__`` passes ``stop_poller=False``: it joins no thread."""
        if self.poller is not None:
            _join_checks.unregister_join(self._join_check)
            coordinator = self._coordinator()
            if coordinator is not None:
                _closure_drain.resume_all(coordinator)
            if stop_poller:
                self.poller.stop()

    def _coordinator(self) -> Any:
        return _coordinators.find_coordinator(self._strategy)

    def _reconnect(self, task: str, bound: float) -> None:
        """A task restarted and this coordinator's context does not reach it (the
        poller's thread): TensorFlow's worker recovery is asked to reconnect, each step
        within ``bound`` seconds."""
        coordinator = self._coordinator()
        if coordinator is not None:
            _coordinators.request_reconnect(coordinator, task, bound)

    def on_notice(self, final_round: bool) -> None:
        """A notice this coordinator acts on (its own or a PS's; the driver's thread):
        with no grace period the save comes next, so from now on no worker takes a new
        closure -- unless a ``schedule()`` waits for room in a full queue (a non-strict
        hold), which must return to reach the check that saves. ``final_round``: the
        handler's final save round is under way (the core's ``Action.Lead``)."""
        if self.poller is not None:
            self._perform(CoordinatorEvent.OwnNotice(final_round))

    def _perform(self, event: Any) -> None:
        """Reports ``event`` to the coordinator's protocol and performs what it says
        the handler's thread does then (the save's wait itself is ``closure_drain``'s)."""
        protocol = self.poller.protocol
        protocol.handle(event)
        while True:
            action = protocol.poll(Lane.Save())
            if isinstance(action, CoordinatorAction.HoldAll):
                coordinator = self._coordinator()
                if coordinator is not None and _closure_drain.hold_all(
                    coordinator, strict=action.strict
                ):
                    log.info("Termination notice: the workers take no new closures until the save.")
            elif isinstance(action, CoordinatorAction.ReleaseSaved):
                self._release_saved(action)
            elif isinstance(action, CoordinatorAction.StopWatch):
                self.poller.stop()
            elif isinstance(action, CoordinatorAction.ResumeAll):
                if action.runs is not None:
                    self._core.run_counter = action.runs
                coordinator = self._coordinator()
                if coordinator is not None:
                    _closure_drain.resume_all(coordinator)
            else:
                return

    def _on_cluster_notice(
        self, job: str, task: int, source: str, deadline: Optional[float]
    ) -> None:
        """A PS or worker task's notice (the poller's thread)."""
        self._records.task_notice(job, task, source, deadline)
        if job == "ps":
            log.info("Termination notice of ps %d (%s): saving at the next run().", task, source)
            if self._sources is not None:
                self._sources.trigger(f"ps {task}: {source}", deadline)
        elif job == "worker" and self.poller is not None:
            drain = _worker_drain.WorkerDrain(self.poller, task, coordinator=self._coordinator())
            threading.Thread(target=drain.run, name=f"WorkerDrain-{task}", daemon=True).start()

    def before_save(self, bound: float) -> None:
        """Holds every worker and lets the closures in flight finish within ``bound``
        seconds (the handler's core's: the notice's deadline less the longest save seen;
        without one, peer_timeout), so that the saved run count is the number of closures
        whose effect is in the variables.

        Closures still queued at the bound never ran: they are not counted and run after
        the restart. A closure still in flight at the bound keeps running during the
        save: it is not counted, so it runs again after the restart, and its effect may
        be in the checkpoint too (TensorFlow's at-least-once). The log and the
        ``save_start`` record name them.
        """
        self._unfinished = None
        self._finished_after = []
        if self.poller is None:
            return
        coordinator = self._coordinator()
        if coordinator is None:
            log.warning(
                "No ClusterCoordinator found (neither tf_failure_handling's nor one on the "
                "checkpoint's strategy): saving without waiting for closures."
            )
            return
        scheduled = self._core.run_counter
        unfinished = _closure_drain.wait_for_closures(
            coordinator, bound, scheduled=scheduled, protocol=self.poller.protocol
        )
        self._unfinished = unfinished
        if unfinished.gap_runs:
            log.info(
                "Run(s) %s, put back in the queue after later runs had finished, ran "
                "before the save.",
                _ids(unfinished.gap_runs),
            )
        if not unfinished:
            log.info(
                "All scheduled closures finished in %.3fs; saving at run %d.",
                unfinished.took,
                scheduled,
            )
            return
        # The checkpoint holds the runs before the first unfinished one (a restart
        # schedules from its count on): the core's count (the save lane's). Only the
        # handler's runs are in it: a closure scheduled outside run() (an evaluation,
        # say) is not, and is never run again after the restart.
        runs, self._finished_after = unfinished.runs, unfinished.finished_after
        self._core.run_counter = runs
        if self._finished_after:
            log.warning(
                "%d run(s) after run %d had finished before it (%s): they are in the "
                "checkpoint and run again after the restart (restarts count runs from the "
                "first that did not finish).",
                len(self._finished_after),
                runs,
                _ids(self._finished_after),
            )
        if unfinished.queued:
            log.warning(
                "%d queued run(s) were not given to a worker before the save: not "
                "counted at run %d, they run after the restart.",
                unfinished.queued,
                self._core.run_counter,
            )
        if unfinished.in_flight_count:
            runs_of = unfinished.in_flight_runs_by_worker
            running = [
                f"{fn} on worker {i}" + (f" (run {runs_of[i]})" if i in runs_of else "")
                for i, fn in unfinished.in_flight.items()
            ]
            if unfinished.unnamed:
                running.append(
                    f"{unfinished.unnamed} on TensorFlow's coordinator, which cannot hold "
                    "its workers"
                )
            log.warning(
                "%d run(s) did not finish within %.1fs (%s): saving without counting "
                "them at run %d. Each may be in the checkpoint and will run again after the "
                "restart (at least once, as in TensorFlow).",
                unfinished.in_flight_count,
                bound,
                ", ".join(running),
                self._core.run_counter,
            )
        if unfinished.outside_count:
            running = [f"{fn} on worker {i}" for i, fn in unfinished.outside_in_flight.items()]
            log.warning(
                "%d closure(s) scheduled outside handler.run() were not finished at the "
                "save (%d queued: they do not run, %d in flight%s: they may be in the "
                "checkpoint). They are not in the run count and are not run again after the "
                "restart.",
                unfinished.outside_count,
                unfinished.outside_queued,
                len(unfinished.outside_in_flight),
                f": {', '.join(running)}" if running else "",
            )

    def save_fields(self) -> dict:
        """The ``save_start`` record's account of the closures left unfinished."""
        unfinished = self._unfinished
        if unfinished is None:
            return {}
        fields = {
            "queued_at_bound": unfinished.queued,
            "in_flight_at_bound": unfinished.in_flight_count,
        }
        if unfinished.in_flight:
            fields["in_flight"] = {str(i): fn for i, fn in unfinished.in_flight.items()}
        if unfinished.in_flight_runs:
            fields["in_flight_runs"] = sorted(unfinished.in_flight_runs)
        if unfinished.in_flight_count:
            fields["in_flight_effect"] = "may be in the checkpoint and will run again"
        if self._finished_after:
            fields["finished_after_first_unfinished"] = list(self._finished_after)
        if unfinished.gap_runs:
            fields["gap_runs"] = list(unfinished.gap_runs)
        if unfinished.outside_count:
            fields["outside_run_at_bound"] = {
                "queued": unfinished.outside_queued,
                "in_flight": len(unfinished.outside_in_flight),
            }
        return fields

    def after_save(self) -> None:
        """Releases the PS tasks whose notice this save answered, then stops the watch
        (the core's order: until then the tasks see the coordinator ask, and wait for
        it); a failed release is retried within the bound each release action carries."""
        if self.poller is not None:
            self._perform(CoordinatorEvent.CheckpointSaved())

    def _release_saved(self, action: Any) -> None:
        """Releases the PS task of ``action`` after the save; a failed release is sent
        again by the core's retry rule, within the action's bound."""
        task = action.task
        if not self.poller.release(task, "checkpoint saved", action.bound):
            log.warning(
                "ps %d was not released after the save: it leaves on its own once this "
                "coordinator stops asking it (%.0fs later) or at its notice's deadline.",
                _cluster_poller._job_task(task)[1],
                action.silence,
            )

    def training_goes_on(self) -> None:
        """Training goes on in this process after the save (a grace period's countdown,
        a save that raised, an ``exit_fn`` that returned): the closures left unfinished
        count again and the workers take closures again (the core's)."""
        self._unfinished = None
        if self.poller is not None:
            self._perform(CoordinatorEvent.TrainingGoesOn())


def _ids(runs: list) -> str:
    """Run indices for a log line (at most 10 named)."""
    shown = ", ".join(str(r) for r in runs[:10])
    return shown + (f" and {len(runs) - 10} more" if len(runs) > 10 else "")
