"""The steps only a ParameterServerStrategy coordinator takes.

The coordinator (the chief) runs no training steps of its own: it schedules closures on
the workers, which, with the parameter servers, only serve (``serving``). Its handler
watches every PS and worker task for notices (``_ps_control.ClusterPoller``, over TF's
own RPCs) and:

* a **PS task's notice** counts as its own: the handler saves at its next ``run()``
  (or in ``ClusterCoordinator.join()``, :meth:`PsSteps._check_in_join`), in the same check
  that publishes the run count (:meth:`PsSteps._saves_where_it_publishes`), after the
  scheduled closures finished within the notice's deadline
  (:meth:`PsSteps._ps_before_save`), and releases that PS once the checkpoint is written
  (:meth:`PsSteps._ps_after_save`);
* a **worker task's notice** drains that worker (``_ps_control.WorkerDrain``): its closure
  in flight finishes, it gets no new one, and it is released.

Every stage is recorded through the records hooks (``records_hooks``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Optional

from .._cluster import membership as _membership
from .._coordinator import ps_control as _ps_control

log = logging.getLogger("tf_failure_handling")


class PsSteps:
    """A parameter-server coordinator's watch over its tasks, and its steps around a save.

    Owns ``_ps_poller`` and ``_ps_with_notice``; reads ``_sources``, ``_notice_deadline``,
    ``_grace_period``, ``_peer_timeout``, ``_clock`` and ``_run_counter`` (which it lowers
    by the closures abandoned before a save).
    """

    def _start_ps_watch(self, cluster_resolver: Any) -> None:
        """Starts polling the PS and worker tasks for notices, and makes this handler the
        one ``ClusterCoordinator.join()`` checks."""
        self._ps_poller = _ps_control.ClusterPoller(
            _membership._as_dict(cluster_resolver.cluster_spec()),
            self._on_cluster_notice,
            on_released=self._on_cluster_release,
        )
        self._ps_poller.start()
        _ps_control.register_handler(self)

    def _end_ps_watch(self, stop_poller: bool = True) -> None:
        """``close()``; ``__del__`` passes ``stop_poller=False``: it joins no thread."""
        if self._ps_poller is not None:
            _ps_control.unregister_handler(self)
            if stop_poller:
                self._ps_poller.stop()

    def _saves_where_it_publishes(self) -> bool:
        """Whether the check that publishes the agreed step also saves at it: the
        coordinator of a PS cluster saves at the run count it published, in that same
        check, before scheduling anything more."""
        return self._ps_poller is not None

    def _check_in_join(self) -> None:
        """What ``run()`` checks before a step, made by ``ClusterCoordinator.join()``
        while it waits (the only place a notice can be seen once everything is
        scheduled)."""
        if self._attention or self._thread_error is not None:
            self._check_preemption_and_maybe_checkpoint()

    def _on_cluster_notice(
        self, job: str, task: int, source: str, deadline: Optional[float]
    ) -> None:
        """A PS or worker task's notice (the poller's thread)."""
        self._record_task_notice(job, task, source, deadline)
        if job == "ps":
            log.info("Termination notice of ps %d (%s): saving at the next run().", task, source)
            self._ps_with_notice.add(task)
            if self._sources is not None:
                self._sources.trigger(f"ps {task}: {source}", deadline)
        elif job == "worker" and self._ps_poller is not None:
            drain = _ps_control.WorkerDrain(self._ps_poller, task, deadline)
            threading.Thread(target=drain.run, name=f"WorkerDrain-{task}", daemon=True).start()

    def _on_cluster_release(self, job: str, task: int, reason: str) -> None:
        """The coordinator released a PS or worker task (it exits with the restart code)."""
        self._record_task_release(job, task, reason)

    def _ps_before_save(self) -> None:
        """Lets the scheduled closures finish (bounded by the notice's deadline) so that
        the saved run count is the number of closures whose effect is in the variables."""
        if self._ps_poller is None:
            return
        coordinator = _ps_control.find_coordinator()
        if coordinator is None:
            log.warning("No ClusterCoordinator found: saving without waiting for closures.")
            return
        # The closures may take until the save must start: the notice's deadline
        # (or the grace period's end) less the longest save seen; with neither,
        # peer_timeout bounds the wait.
        state = self._core_state()
        deadline = (
            state.get("deadline")
            if (self._notice_deadline is not None or self._grace_period > 0)
            else None
        )
        if deadline is None:
            bound = self._peer_timeout
        else:
            longest = state.get("longest_save") or 0.0
            bound = max(0.0, deadline - self._clock() - longest)
        start = self._clock()
        queued, in_flight = _ps_control.join_within(coordinator, bound)
        if queued or in_flight:
            abandoned = queued + in_flight
            self._run_counter = max(0, self._run_counter - abandoned)
            log.warning(
                "%d scheduled closure(s) did not finish within %.1fs (%d queued, %d in flight): "
                "saving without them at run %d.",
                abandoned,
                bound,
                queued,
                in_flight,
                self._run_counter,
            )
        else:
            log.info(
                "All scheduled closures finished in %.3fs; saving at run %d.",
                self._clock() - start,
                self._run_counter,
            )

    def _ps_after_save(self) -> None:
        """Releases the PS tasks whose notice this save answered; stops the watch."""
        poller = self._ps_poller
        if poller is None:
            return
        poller.stop()
        for task in sorted(self._ps_with_notice):
            poller.release(f"/job:ps/replica:0/task:{task}", "checkpoint saved")
