"""The cluster as a worker sees it.

* ``membership``: where a worker sits in its cluster (its id, the number of workers,
  whether it is the chief or a parameter-server coordinator), computed as TensorFlow's
  ``multi_worker_util`` does, and which peers still answer after an error;
* ``coordination``: the coordination service (TensorFlow's key-value store and error
  reporting, or a test's stand-in), with every write bounded.

Both stand on the ground floor's ``_errors``; nothing here imports the handler, the
watcher or the protocol.
"""
