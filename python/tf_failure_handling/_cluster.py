"""Where a worker sits in its cluster, computed as TensorFlow's multi_worker_util does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

_WORKER_TYPES = ("chief", "worker", "evaluator")


@dataclass(frozen=True)
class Membership:
    """``worker_id`` is None in local mode (no cluster, or a ClusterSpec without jobs)."""

    worker_id: Optional[int]
    num_workers: int
    is_chief: bool
    task_type: Optional[str]
    task_id: Optional[int]

    @property
    def local(self) -> bool:
        return self.worker_id is None

    @property
    def id_in_cluster(self) -> str:
        return "single_worker" if self.worker_id is None else str(self.worker_id)


LOCAL = Membership(None, 1, True, None, None)


def _as_dict(cluster_spec: Any) -> dict:
    if isinstance(cluster_spec, dict):
        return cluster_spec
    as_dict = getattr(cluster_spec, "as_dict", None)
    if as_dict is None:
        raise TypeError(
            f"cluster_spec() returned {type(cluster_spec).__name__}, not a ClusterSpec or dict"
        )
    return as_dict()


def membership(cluster_resolver: Any) -> Membership:
    """The membership of the task ``cluster_resolver`` describes.

    Raises:
      NotImplementedError: the cluster has a ``ps`` job (as TF).
      ValueError: the task type is not chief, worker or evaluator, or the task
        id is not in the cluster.
      TypeError: ``cluster_resolver`` is not a cluster resolver.
    """
    if cluster_resolver is None:
        return LOCAL
    if not callable(getattr(cluster_resolver, "cluster_spec", None)):
        raise TypeError(
            "cluster_resolver must be a tf.distribute.cluster_resolver.ClusterResolver "
            f"(or None for local mode), got {type(cluster_resolver).__name__}"
        )
    spec = _as_dict(cluster_resolver.cluster_spec())
    if not spec:
        return LOCAL
    if "ps" in spec:
        raise NotImplementedError(
            "PreemptionCheckpointHandler does not support usage with "
            "tf.distribute.experimental.ParameterServerStrategy (the cluster has a 'ps' job)."
        )
    task_type = cluster_resolver.task_type
    task_id = cluster_resolver.task_id
    if task_type not in _WORKER_TYPES:
        raise ValueError(
            f"task_type {task_type!r} has no id in the cluster; expected one of {_WORKER_TYPES}"
        )
    if not isinstance(task_id, int) or isinstance(task_id, bool):
        raise TypeError(f"task_id must be an int, got {type(task_id).__name__}")
    tasks = spec.get(task_type, [])
    if not 0 <= task_id < len(tasks):
        raise ValueError(
            f"task {task_type}:{task_id} is not in the cluster spec "
            f"({len(tasks)} {task_type} tasks)"
        )
    chiefs = len(spec.get("chief", []))
    if task_type == "evaluator":
        return Membership(task_id, len(spec["evaluator"]), True, task_type, task_id)
    worker_id = 0 if task_type == "chief" else task_id + chiefs
    num_workers = chiefs + len(spec.get("worker", []))
    is_chief = task_type == "chief" or (chiefs == 0 and task_type == "worker" and task_id == 0)
    return Membership(worker_id, num_workers, is_chief, task_type, task_id)
