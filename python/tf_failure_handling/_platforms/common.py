"""What the clouds' modules share: reading a variable, a metadata URL, a sysfs line,
the native probe, and the default exit.

The bottom of ``_platforms``: imports nothing of the package but ``_native``.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import sys
from typing import Any, Callable, Optional

log = logging.getLogger("tf_failure_handling")

#: Seconds a metadata request (or probe) may take, DNS included.
METADATA_TIMEOUT = 1.0
#: The DMI tables the kernel exposes (world-readable files of one line each).
DMI_DIR = "/sys/class/dmi/id"
#: The exit code Borg and TF's default ``exit_fn`` use.
DEFAULT_EXIT_CODE = 42

#: A host name's bytes, as the native client accepts them (``http::BaseUrl``).
_HOST_NAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")


def default_exit_fn() -> None:
    sys.exit(DEFAULT_EXIT_CODE)


def bad(name: str, raw: str, expected: str) -> ValueError:
    return ValueError(f"{name}={raw!r}: expected {expected}")


def env(name: str) -> Optional[str]:
    """The variable's value, stripped; None when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def seconds(name: str, minimum: Optional[float] = None) -> Optional[float]:
    """The variable as a finite number (at least ``minimum``); None when unset or blank."""
    raw = env(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or (minimum is not None and value < minimum):
        at_least = "" if minimum is None else f" >= {minimum:g}"
        raise bad(name, os.environ[name], f"a finite number of seconds{at_least}")
    return value


def base_url_problem(url: str) -> Optional[str]:
    """Why ``url`` is not ``http://host[:port]`` (one trailing slash allowed), or None.

    The same rules as the native client's ``BaseUrl::parse`` (``src/sources/http.rs``),
    which checks again when the metadata watch starts; here the error can name the
    variable.
    """
    if url[:7].lower() != "http://":
        return "the scheme must be http://"
    rest = url[7:-1] if url.endswith("/") else url[7:]
    if any(c in rest for c in "/?#@"):
        return "no path, query, fragment or user info is allowed"
    if rest.startswith("["):
        host, bracket, port = rest[1:].partition("]")
        if not bracket:
            return "unclosed ["
        if not _is_ip(host, ipaddress.IPv6Address):
            return "invalid IPv6 literal"
    else:
        host, colon, port = rest.partition(":")
        port = colon + port
        name = 0 < len(host) <= 253 and set(host.encode()) <= _HOST_NAME_BYTES
        if not (name or _is_ip(host, ipaddress.IPv4Address)):
            return "invalid host"
    if port and not port.startswith(":"):
        return "unexpected text after the host"
    digits = port[1:]
    if port and not (digits.isascii() and digits.isdigit() and len(digits) <= 5):
        return "invalid port"
    if port and not 0 < int(digits) < 65536:
        return "invalid port"
    return None


def _is_ip(text: str, kind: Callable[[str], Any]) -> bool:
    try:
        kind(text)
    except ValueError:
        return False
    return True


def metadata_url(name: str) -> Optional[str]:
    """The variable as ``http://host[:port]`` (``http://`` added if no scheme), or None."""
    raw = env(name)
    if raw is None:
        return None
    url = raw if "://" in raw else "http://" + raw
    problem = base_url_problem(url)
    if problem:
        raise bad(name, os.environ[name], f"[http://]host[:port] ({problem})")
    return url.rstrip("/")


def read_line(path: str) -> Optional[str]:
    """The stripped first line of a small sysfs file; None if it cannot be read."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline(4096).strip()
    except OSError:
        return None


def dmi(name: str) -> str:
    """One DMI table's line (``/sys/class/dmi/id/<name>``), "" when unreadable."""
    return read_line(os.path.join(DMI_DIR, name)) or ""


def probe(cloud: str, base: str) -> bool:
    """``_native.probe_metadata``, with any failure meaning "not that cloud"."""
    try:
        from .._native import probe_metadata

        return bool(probe_metadata(cloud, base, METADATA_TIMEOUT))
    except Exception as e:  # noqa: BLE001 - off that cloud anything can come back
        log.debug("not on %s (%s): %s", cloud, base, e)
        return False


def probed_if_named(
    cloud: str, configured: Optional[str], default_base: str, dmi_says: Callable[[], bool]
) -> bool:
    """A link-local cloud's detection: its variable is set or the DMI tables name it,
    and then its metadata service answers (at the configured base, else the default)."""
    return (configured is not None or dmi_says()) and probe(cloud, configured or default_base)
