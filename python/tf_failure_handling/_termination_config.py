"""``TerminationConfig``, as TensorFlow's: how a worker learns of its end, how it exits
and how long it has, each value checked when the config is made. Scripts import it from
``tf_failure_handling`` or ``tf_failure_handling.handler``, which re-exports it; the
handler reads it, and the platform fills in what it leaves unset
(``_platforms/platform.py``).
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Callable, Optional, Sequence

from ._platforms import notice_sources as _sources


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


#: What the survivors of a worker lost without notice may do (``lost_worker``).
LOST_WORKER_MODES = ("save", "exit", "raise")


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
      ``TF_FAILURE_HANDLING_SLURM_REQUEUE=0``; see ``_platforms/slurm.py``),
      ``lost_worker`` what the survivors of a worker lost without notice do:
      ``"save"`` the last whole step then raise TensorFlow's error (the default),
      ``"exit"`` save then exit with the restart code (``exit_fn``), ``"raise"`` only
      raise, as TensorFlow (default: ``TF_FAILURE_HANDLING_LOST_WORKER``, else
      ``"save"``; docs/lost-worker.md);
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
        lost_worker: Optional[str] = None,
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
        if lost_worker is not None and lost_worker not in LOST_WORKER_MODES:
            raise ValueError(
                f"lost_worker must be one of {', '.join(map(repr, LOST_WORKER_MODES))} or "
                f"None, got {lost_worker!r}"
            )
        self.lost_worker = lost_worker

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
