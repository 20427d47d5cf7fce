"""Whether this is a CI run (``CI=true``): there a test that cannot run fails, never skips.

A skip is a pass that nobody reads. On a developer's machine without TensorFlow, or
without the right to create network namespaces, the tests that need them skip and
say why; in CI (``CI=true``, as CI services set it) the same situation is a
failure, so that a broken environment or a renamed export cannot pass as green.
"""

from __future__ import annotations

import os


def is_ci() -> bool:
    """True when the environment variable ``CI`` is set to true (``1``, ``yes``, ``on``)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")
