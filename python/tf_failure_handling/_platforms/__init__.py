"""Platforms and notice sources: where this process runs, and what tells it that it ends.

* ``platform``: the cloud (GCE, AWS, Azure), the scheduler (SLURM, Kubernetes) and the
  device, detected once per process, and the defaults each gets (signals, exit code,
  grace period, the deadline a signal carries);
* ``registry``: the clouds behind one interface (detect, the metadata service, the
  default exit and grace period) and the schedulers behind another (detect, signals,
  the deadline a signal carries, attach, after the save, resume fields); the handler
  reaches them only through it (by way of ``platform``);
* ``cloud_gce``, ``cloud_aws``, ``cloud_azure``: one module per cloud, over ``common``
  (variables, the native probe, the default exit);
* ``slurm``, ``kubernetes``: one module per scheduler (SLURM: the job's deadlines, and
  the job back in the queue after the save);
* ``notice_sources``: every termination source of a process (signals, metadata
  services, a ``termination_watcher_fn``) behind one inbox, and the
  :class:`~.notice_sources.Notice` they deliver;
* ``in_process``: the notices a handler hands to the open ``PreemptionWatcher`` objects
  of its process.

Floors, bottom up: ``common``; ``cloud_gce``, ``cloud_aws``, ``cloud_azure``, ``slurm``,
``kubernetes`` and
``in_process``; ``registry``;
``platform``; ``notice_sources``. Nothing here imports the handler, the watcher or the protocol.
"""
