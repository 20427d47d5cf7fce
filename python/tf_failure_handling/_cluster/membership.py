"""Where a worker sits in its cluster, computed as TensorFlow's multi_worker_util does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

from .._native import coordination_bounds

_WORKER_TYPES = ("chief", "worker", "evaluator")


@dataclass(frozen=True)
class Membership:
    """``worker_id`` is None in local mode (no cluster, or a ClusterSpec without jobs)."""

    worker_id: Optional[int]
    num_workers: int
    is_chief: bool
    task_type: Optional[str]
    task_id: Optional[int]
    #: The coordinator (chief) of a ParameterServerStrategy cluster: it decides
    #: alone (local mode for the step protocol) and watches the PS and worker
    #: tasks through ``_coordinator/cluster_poller.py``.
    ps_coordinator: bool = False

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

    A cluster with a ``ps`` job (ParameterServerStrategy) gives the coordinator's
    membership (TF raises ``NotImplementedError`` there).

    Raises:
      ValueError: the task type is not chief, worker or evaluator (with a ``ps``
        job: not chief), or the task id is not in the cluster.
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
    task_type = cluster_resolver.task_type
    task_id = cluster_resolver.task_id
    if "ps" in spec:
        # ParameterServerStrategy: the handler runs on the coordinator. TF's
        # resolvers for it often name no task (SimpleClusterResolver(spec)).
        if task_type not in (None, "chief"):
            raise ValueError(
                f"In a ParameterServerStrategy cluster the PreemptionCheckpointHandler runs on "
                f"the coordinator (task type 'chief'), not on {task_type!r}: PS and worker "
                "processes call tf_failure_handling.serve(server) instead of server.join()."
            )
        return Membership(None, 1, True, "chief", 0, ps_coordinator=True)
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


def _peer_tasks(cluster_resolver: Any, me: Membership) -> list:
    """``(label, task, address, worker id)`` of every other chief/worker task of the
    cluster (worker ids as :func:`membership` gives them: the chief 0, then the workers)."""
    spec = _as_dict(cluster_resolver.cluster_spec())
    chiefs = len(spec.get("chief") or [])
    peers = []
    for job in ("chief", "worker"):
        addresses = spec.get(job) or []
        if isinstance(addresses, dict):
            addresses = [addresses[k] for k in sorted(addresses)]
        for index, address in enumerate(addresses):
            if job == me.task_type and index == me.task_id:
                continue
            worker_id = 0 if job == "chief" else index + chiefs
            task = f"/job:{job}/replica:0/task:{index}"
            peers.append((f"{job} {index}", task, address, worker_id))
    return peers


def coordination_leader(cluster_resolver: Any) -> Optional[str]:
    """The task that hosts TF's coordination service: the chief, else worker 0."""
    spec = _as_dict(cluster_resolver.cluster_spec())
    for job in ("chief", "worker"):
        if spec.get(job):
            return f"/job:{job}/replica:0/task:0"
    return None


class Unreachable(NamedTuple):
    """A peer that failed a health probe."""

    label: str  # "worker 1"
    task: str  # "/job:worker/replica:0/task:1"
    address: str
    why: str  # the probe's exception type, or "no answer"
    worker_id: int  # as :func:`membership` gives it


def unreachable_peers(service: Any, cluster_resolver: Any, me: Membership) -> Optional[list]:
    """The :class:`Unreachable` peers: those that fail a health probe.

    Asked by the protocol (``Action.Probe``: the step's error can come from a peer that
    is gone); None (no probe made) when the service cannot probe (not TF's context).
    Each probe and its thread's join are bounded by the core (``coordination_bounds``:
    TF's timeout for the probe); TF holds the GIL inside a probe, so the threads do not
    make them run in parallel, and the join bound cannot cut one short.
    """
    import threading

    probe = getattr(service, "check_collective_ops_peer_health", None)
    if probe is None:
        return None
    peers = _peer_tasks(cluster_resolver, me)
    answers: dict = {}
    bounds = coordination_bounds()
    probe_ms, join = bounds["probe_ms"], bounds["probe_join"]

    def check(task: str) -> None:
        try:
            probe(task, probe_ms)
        except Exception as e:  # noqa: BLE001 - the answer is the exception
            answers[task] = type(e).__name__
        else:
            answers[task] = None

    threads = [
        threading.Thread(target=check, args=(task,), name="tfh-peer-probe", daemon=True)
        for _, task, _, _ in peers
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join)
    return [
        Unreachable(label, task, address, answers.get(task) or "no answer", worker_id)
        for label, task, address, worker_id in peers
        if task not in answers or answers[task] is not None
    ]


def with_unreachable_named(error: Any, unreachable: list, me: Membership) -> Optional[Any]:
    """``error`` again (same type) with ``unreachable`` named in its message, or None."""
    if not unreachable:
        return None
    names = ", ".join(f"{p.label} ({p.address}: {p.why})" for p in unreachable)
    note = (
        f"{getattr(error, 'message', error)}\n[tf_failure_handling] peers that did not answer "
        f"a health probe from worker {me.id_in_cluster}: {names}"
    )
    try:
        return type(error)(getattr(error, "node_def", None), getattr(error, "op", None), note)
    except TypeError:
        return None
