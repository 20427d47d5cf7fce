"""One process that builds a PreemptionWatcher and reports what it sees.

Run as a standalone script, one process per MultiWorkerMirroredStrategy worker
(all on 127.0.0.1), or alone without ``--ports`` (local mode, no TF_CONFIG)::

    python watcher_script.py --ports 23001,23002 --index 0 --impl ours --wait 20

``--impl ours`` builds ``tf_failure_handling.PreemptionWatcher()``; ``--impl tf``
builds ``tf.distribute.experimental.PreemptionWatcher()``. The watcher is built
after the strategy, so the coordination service is up. With ``--watcher-file``
the worker also builds a ``tf_failure_handling.PreemptionCheckpointHandler`` whose
``termination_watcher_fn`` is "this file exists" (``{index}`` is replaced by
``--index``, so a test can notify one worker only).

``EVENT {json}`` lines on stdout (see ``mwms_worker.emit``):

* ``ready``: the watcher (and handler) exist: ``platform`` (its name),
  ``has_platform`` (TF's watcher has only ``_platform``), ``coordinated`` (ours:
  whether it watches a coordination service), ``pid``.
* ``message``: the watcher's ``preemption_message`` became set: ``message``.
  The process then exits 0.
* ``no_message``: nothing within ``--wait`` seconds; the process exits 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# Run as a script: this directory is sys.path[0].
from mwms_worker import emit, poll_until, require_loopback, tf_config

NO_MESSAGE_EXIT_CODE = 3


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ports", default=None, help="ports of all workers; none: local mode")
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--impl", choices=("tf", "ours"), default="ours")
    p.add_argument("--wait", type=float, default=20.0, help="seconds to wait for a message")
    p.add_argument("--watcher-file", default=None, help="also build a handler watching this file")
    p.add_argument("--ckpt-dir", default="ckpt", help="the handler's checkpoint directory")
    p.add_argument(
        "--close", action="store_true", help="close the watcher and handler before exiting"
    )
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    cluster = None
    if args.ports:
        ports = [int(p) for p in args.ports.split(",") if p]
        config = tf_config(ports, args.index)
        require_loopback(config["cluster"])
        cluster = config
    else:
        os.environ.pop("TF_CONFIG", None)
    os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")

    import tensorflow as tf

    resolver = None
    if cluster is not None:
        os.environ["TF_CONFIG"] = json.dumps(cluster)
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        resolver = strategy.cluster_resolver

    if args.impl == "ours":
        import tf_failure_handling as tfh

        watcher = tfh.PreemptionWatcher()
        coordinated = watcher._coordination is not None
    else:
        watcher = tf.distribute.experimental.PreemptionWatcher()
        coordinated = None

    handler = None
    if args.watcher_file:
        import tf_failure_handling as tfh

        notice_file = args.watcher_file.format(index=args.index)
        checkpoint = tf.train.Checkpoint(step=tf.Variable(0))
        handler = tfh.PreemptionCheckpointHandler(
            resolver,
            checkpoint,
            checkpoint_dir=args.ckpt_dir,
            termination_config=tfh.TerminationConfig(
                termination_watcher_fn=lambda: os.path.exists(notice_file)
            ),
        )

    emit(
        "ready",
        index=args.index,
        impl=args.impl,
        pid=os.getpid(),
        # TF documents a ``platform`` attribute but only sets ``_platform``.
        has_platform=hasattr(watcher, "platform"),
        platform=(getattr(watcher, "platform", None) or watcher._platform).name,
        coordinated=coordinated,
    )
    seen = poll_until(lambda: watcher.preemption_message is not None, args.wait, 0.002)
    if seen:
        emit("message", message=watcher.preemption_message)
    else:
        emit("no_message", waited=args.wait)
    if args.close:
        if handler is not None:
            handler.close()
        watcher.close()
    return 0 if seen else NO_MESSAGE_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
