"""What the platforms share: the interface each implements (:class:`Platform`), reading
a variable (a number, a flag, a metadata URL), the native probe, and the default exits.

The bottom of ``_platforms``: imports nothing of the package but ``_native``.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import sys
from typing import Any, Callable, Optional

from .._native import DEFAULT_EXIT_CODE, platforms

log = logging.getLogger("tf_failure_handling")

# DEFAULT_EXIT_CODE is the core's (src/sources/clouds.rs: Borg's and TF's default
# ``exit_fn``'s).

#: The core's table of the platforms (``_native.platforms``): a row per cloud, in
#: detection order (its variable, default base, exit code, grace periods and probe),
#: then Kubernetes' (its SIGTERM's deadlines).
TABLE: dict = {row["name"]: row for row in platforms()}

#: A host name's bytes, as the native client accepts them (``http::BaseUrl``).
_HOST_NAME_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._")


class Platform:
    """One platform, one module of ``_platforms`` (``platform.PLATFORMS`` lists them):
    what ``platform`` asks of each. A hook here does nothing; a platform overrides its
    own. No hook receives the handler; the hooks marked "its" are asked only of the
    platform ``env`` names (``env.cloud`` or ``env.scheduler``)."""

    #: ``Environment.cloud`` or ``Environment.scheduler`` when detected.
    NAME = ""
    #: ``"cloud"`` (with a metadata service ``_native.MetadataWatch`` watches) or
    #: ``"scheduler"``. Of each kind, the first detected in ``PLATFORMS`` wins.
    KIND = "scheduler"

    def check(self) -> Any:
        """Its variables, read and checked before any detection; the answer is kept in
        ``Environment.settings[NAME]``. Raises ValueError naming a variable."""
        return None

    def detect(self, checked: Any) -> bool:
        """Whether this process runs on it (bounded probes; any failure is no)."""
        return False

    def metadata_base(self, checked: Any) -> Optional[str]:
        """A cloud's metadata service, ``http://host[:port]``."""
        return None

    def defaults(self, env: Any) -> dict:
        """Its defaults for what the user left unset: ``exit_fn``, ``grace_period``,
        ``signals`` (counted besides SIGTERM)."""
        return {}

    def start(self, env: Any) -> None:
        """Its start, once per process: what reads its limits off the training thread."""

    def deadlines(self, env: Any, unix_now: float) -> tuple:
        """Its ``(deadline, kill)`` after a signal, Unix times or None: what the saves
        are planned against, and when it ends this process if it stated that moment
        (the exit guard's, ``_protocol/exit_guard.py``). The core decides both
        (``src/sources/``). Never raises."""
        return None, None

    def attach(self, env: Any, config: Any) -> Any:
        """Handler construction, its or not: checks its options (an error now) and
        returns what :meth:`after_save` gets as ``options``."""
        return None

    def after_save(self, env: Any, options: Any, recorder: Any) -> Optional[float]:
        """Its step after the final checkpoint, before ``exit_fn`` (``recorder``: the
        ``records.Recorder``, or None). Returns the seconds from now until it ends this
        process when the step stated that (SLURM: a requeue), else None. Never raises."""
        return None

    def resume_fields(self, env: Any) -> dict:
        """What a ``resumed`` preemption record says about it."""
        return {}


#: Each default ``exit_fn`` and its code (:func:`exit_code`).
_EXIT_CODES: list = []


def exit_with(code: int) -> Callable[[], None]:
    """A default ``exit_fn``: ``sys.exit(code)``."""

    def exit_fn() -> None:
        sys.exit(code)

    _EXIT_CODES.append((exit_fn, code))
    return exit_fn


def exit_code(exit_fn: Any) -> Optional[int]:
    """The code ``exit_fn`` exits with, when it is a default one; else None."""
    return next((code for fn, code in _EXIT_CODES if fn is exit_fn), None)


default_exit_fn = exit_with(DEFAULT_EXIT_CODE)


def exit_for(code: int) -> Callable[[], None]:
    """The default ``exit_fn`` that exits with ``code``: one per code, so that
    :func:`exit_code` knows it."""
    known = next((fn for fn, c in _EXIT_CODES if c == code), None)
    return exit_with(code) if known is None else known


def bad(name: str, raw: str, expected: str) -> ValueError:
    return ValueError(f"{name}={raw!r}: expected {expected}")


def env(name: str) -> Optional[str]:
    """The variable's value, stripped; None when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


#: What :func:`env_flag` reads as on, and as off (any case).
ON = ("1", "true", "on", "yes")
OFF = ("0", "false", "off", "no")


def env_flag(name: str, unset: str) -> Optional[bool]:
    """The variable as on (True) or off (False); None when unset or blank.

    Raises:
      ValueError: anything else, naming the variable and what ``unset`` means.
    """
    value = (env(name) or "").lower()
    if not value:
        return None
    if value in ON + OFF:
        return value in ON
    raise bad(name, os.environ[name], f"one of {', '.join(ON + OFF)} (or unset, which is {unset})")


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


def probe(
    row_probe: Callable[..., bool], cloud: str, base: str, sysfs: Optional[str] = None
) -> bool:
    """A cloud's native probe (its row's ``probe`` in ``_native.platforms()``; with
    ``sysfs``: only when the lines there name the cloud's machines), with any failure
    meaning "not that cloud"."""
    try:
        return bool(row_probe(base, sysfs=sysfs))
    except Exception as e:  # noqa: BLE001 - off that cloud anything can come back
        log.debug("not on %s (%s): %s", cloud, base, e)
        return False
