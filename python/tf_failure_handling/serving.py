"""``serve(server)``: what a PS or worker process of ParameterServerStrategy runs.

Replaces ``server.join()``: the process serves as before, watches its own termination
notices and exits with the restart code once the coordinator releases it (or at its
deadline). docs/getting-started/parameter-server.md tells the whole exchange.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from ._coordinator import task_calls as _task_calls
from ._native import TaskProtocol
from ._platforms import notice_sources as _sources
from ._platforms import platform as _platform
from .handler import TerminationConfig, _peer_timeout

TaskAction = TaskProtocol.Action

log = logging.getLogger("tf_failure_handling")

#: The log's words for why a task left unreleased (the core's ``serving``).
_LEAVE_WHY = {
    "deadline": lambda leave: "the notice's deadline came",
    "coordinator silent": lambda leave: (
        f"its own bound passed and the coordinator has not asked it for {leave.silence:.0f}s"
    ),
    "cap": lambda leave: f"{leave.cap_factor:g} times its own bound passed",
}


def _job_and_task(server: Any) -> tuple:
    server_def = getattr(server, "server_def", None)
    job = getattr(server_def, "job_name", None)
    task = getattr(server_def, "task_index", None)
    if job is None or task is None:
        raise TypeError(
            "serve() takes the tf.distribute.Server of this PS or worker process, got "
            f"{type(server).__name__}"
        )
    if job not in ("ps", "worker"):
        raise ValueError(
            f"serve() is for the 'ps' and 'worker' tasks of a ParameterServerStrategy "
            f"cluster; this server is {job!r} (the coordinator uses PreemptionCheckpointHandler)"
        )
    return job, int(task)


def serve(server: Any, termination_config: Optional[TerminationConfig] = None) -> None:
    """Serves like ``server.join()`` until this task's termination notice is dealt with.

    Then calls the ``exit_fn`` (by default ``sys.exit(42)``, 143 on GCE), as the
    handler does. Without a notice it returns only if ``exit_fn`` returns.

    Raises:
      TypeError: ``server`` is not a ``tf.distribute.Server``; ``termination_config``
        is not a ``TerminationConfig``.
      ValueError: the server is not a ``ps`` or ``worker`` task.
    """
    job, task = _job_and_task(server)
    config = TerminationConfig._from_any(termination_config)
    peer_timeout = _peer_timeout(config)
    # The control answers the coordinator from now on, before the platform probe (a
    # metadata server may take seconds to answer or time out): a coordinator that
    # asks meanwhile learns this incarnation, with no notice yet.
    control = _task_calls.TaskControl(job, task, peer_timeout)
    control.install()
    env = _platform.environment()
    defaults = _platform.complete(
        env, config.termination_watcher_fn, config.exit_fn, config.grace_period, config.signals
    )
    sources = _sources.NoticeSources(env, defaults.signals, defaults.watcher_fn, owner=True)
    log.info(
        "Serving %s %d (incarnation %s); watching %s for termination notices.",
        job,
        task,
        control.incarnation,
        ", ".join(_sources.signal_name(s) for s in defaults.signals),
    )
    try:
        _serve(control, sources, defaults.grace_period)
    finally:
        sources.close()
    defaults.exit_fn()


def _serve(control: Any, sources: Any, grace_period: float) -> None:
    """Performs the task's protocol (``TaskProtocol``, ``src/ps_control/task.rs``) until
    it says to leave: wait for a notice, serve until the release, the deadline, or the
    task's own bound and the coordinator's silence (its save may still be under way)."""
    job, task, protocol = control.job, control.task, control.protocol
    notice = None
    while True:
        action = protocol.poll()
        if isinstance(action, TaskAction.WaitNotice):
            notice = sources.wait(action.timeout)
            if notice is not None:
                control.set_notice(notice.source, notice.deadline, grace_period)
        elif isinstance(action, TaskAction.Serving):
            log.info(
                "%s %d: termination notice from %s; serving until the coordinator is done "
                "with this task (%.1fs, %s; past it while the coordinator still asks, at "
                "most %.0fs in all).",
                job,
                task,
                notice.source,
                action.own,
                action.source,
                action.at_most,
            )
        elif isinstance(action, TaskAction.Serve):
            control.released.wait(action.timeout)
        else:
            break
    if action.why == "released":
        log.info("%s %d: released by the coordinator (%s). Exiting.", job, task, action.reason)
    else:
        log.warning(
            "%s %d: the coordinator did not release this task (%s, %.1fs after the "
            "notice). Exiting.",
            job,
            task,
            _LEAVE_WHY[action.why](action),
            action.after,
        )
