"""The TensorFlow releases this package is tested with.

The coordinator subclasses and re-creates TensorFlow's private Python code, and the
classifier mirrors its error strings. What is relied on, pinned by a fingerprint per
release, is listed in ``tests/unit/tf_internals.py`` and checked on every release of
the compatibility matrix (docs/install.md, "Compatibility matrix"); at run time only
the range below is needed: outside it the coordinator logs a warning once.
"""

from __future__ import annotations

import logging

log = logging.getLogger("tf_failure_handling")

#: The first and last TensorFlow release (major.minor) of the compatibility matrix.
TESTED = ("2.16", "2.21")


def _key(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def is_tested(version: str) -> bool:
    """Whether ``version`` is within :data:`TESTED`."""
    return _key(TESTED[0]) <= _key(version) <= _key(TESTED[1])


_warned: list = []


def warn_if_untested(version: str) -> None:
    """Logs a warning, once per process, when ``version`` is outside :data:`TESTED`."""
    if not is_tested(version) and not _warned:
        _warned.append(version)
        log.warning(
            "TensorFlow %s is outside the releases tf_failure_handling is tested with "
            "(%s to %s); its coordinator internals may differ (see docs/install.md).",
            version,
            *TESTED,
        )
