"""Integrations: what this package relies on inside Keras and TensorFlow, pinned by release.

* ``keras_internals``: every Keras 3 internal that ``tf_failure_handling.keras`` relies
  on, each checked when ``fit`` starts, with the Keras file it comes from;
* ``tf_versions``: the TensorFlow releases this package is tested with (the
  internals it mirrors or subclasses are pinned by tests/unit/tf_internals.py);
* ``tf_exit``: stops TensorFlow's coordination-service poller (a chain of non-daemon
  timer threads) at interpreter shutdown, so that a coordinator process can exit.

``patch()`` (``_patch.py``) is an integration too, but it stands above the API, whose
classes it puts into TensorFlow by name; TensorFlow's error types (``_errors.py``) stand
on the ground floor, where the native module imports them by name. Nothing here imports
another module of this package.
"""
