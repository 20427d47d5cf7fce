"""The coordinator's parts: what ``ClusterCoordinator`` (``coordinator.py``) runs on.

* ``closure_queue``: TensorFlow's ``_CoordinatedClosureQueue`` on the native queue
  (``src/closure_queue.rs``), plus the cancellation manager TF's ``Cluster`` reads;
* ``closures``: the concrete-function cache ``schedule()`` looks the arguments up in,
  the native closure and its ``RemoteValue``, and the worker thread's loop;
* ``ps_control``: the parameter-server cluster's notices over TensorFlow's own RPCs:
  what a PS or worker task serves (``serve()``), the coordinator's poll of every task,
  and a worker's drain.

The failure classifier (``_failure.py``) is the coordinator's too, but stands on the
ground floor: the native module imports it by name. Nothing here imports the
coordinator, the handler or the protocol above. ``ps_control`` imports nothing of this
package; the coordinator, the handler's protocol (``_protocol/ps_steps.py``) and
``serving`` import it.
"""
