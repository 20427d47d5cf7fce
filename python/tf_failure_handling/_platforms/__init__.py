"""Platforms and notice sources: where this process runs, and what tells it that it ends.

* ``platform``: where this process runs (detected once) and the defaults it gets, one
  dispatch over the platforms; the handler reaches them only through it;
* one module per platform behind ``common.Platform`` (detect, defaults, deadline,
  attach, after the save, resume fields): ``cloud_gce``, ``cloud_aws``, ``cloud_azure``
  (their notices are Rust's, ``src/sources/``), ``slurm``, ``kubernetes``;
* ``notice_sources``: every termination source of a process behind one inbox;
* ``in_process``: the notices a handler hands to the open ``PreemptionWatcher`` objects
  of its process.

Floors, bottom up: ``common``; the platforms and ``in_process``; ``platform``;
``notice_sources``. Nothing here imports the handler, the watcher or the protocol.
"""
