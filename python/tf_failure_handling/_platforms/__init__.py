"""Platforms and notice sources: where this process runs, and what tells it that it ends.

* ``platform``: where this process runs (detected once) and the defaults it gets, one
  dispatch over the platforms; the handler reaches them only through it;
* each platform behind ``common.Platform`` (detect, defaults, deadline, attach, after
  the save, resume fields): ``clouds`` (GCE, AWS, Azure: one class serving each row of
  the core's table, ``src/sources/clouds.rs``; their notices are Rust's too),
  ``slurm``, ``kubernetes``;
* ``notice_sources``: every termination source of a process behind one inbox;
* ``in_process``: the notices a handler hands to the open ``PreemptionWatcher`` objects
  of its process.

Floors, bottom up: ``common``; the platforms and ``in_process``; ``platform``;
``notice_sources``. Nothing here imports the handler, the watcher or the protocol.
"""
