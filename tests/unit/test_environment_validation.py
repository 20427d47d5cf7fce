"""Every environment variable ``_platform`` reads is checked at construction (issue 8, item 6).

A malformed ``TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD`` ("30s") used to raise in
the notice thread when SIGTERM arrived: the thread died, and the worker trained on
until SIGKILL. Now ``_platform.environment()`` (called when a handler or watcher is
built) parses every variable first and raises a ValueError naming the variable and the
value; ``signal_deadlines`` only reads what it parsed and cannot raise.
"""

from __future__ import annotations

import re
import signal
import threading

import pytest
from tf_failure_handling import PreemptionCheckpointHandler, PreemptionWatcher, testing
from tf_failure_handling._platforms import clouds, kubernetes, slurm
from tf_failure_handling._platforms import common as shared
from tf_failure_handling._platforms import platform as _platform

GRACE = kubernetes.GRACE_ENV
END = slurm.END_TIME_ENV
NOW = 1_700_000_000.0


@pytest.fixture(autouse=True)
def _fresh_environment(monkeypatch):
    """Each test computes the environment anew; no probe leaves 127.0.0.1."""
    monkeypatch.setenv(_platform.CLOUD_ENV, "none")
    _platform.environment.cache_clear()
    _platform.detect.cache_clear()
    yield
    _platform.environment.cache_clear()
    _platform.detect.cache_clear()


def names_variable_and_value(name: str, value: str) -> str:
    """A ``pytest.raises(match=...)`` pattern: the message holds ``name=repr(value)``."""
    return re.escape(f"{name}={value!r}")


# Bad values per variable; each must fail environment() with its name and value.
BAD = [
    (_platform.CLOUD_ENV, ["gcp", "yes", "aws,azure", "ec2"]),
    (
        clouds.GCE.variable,
        [
            "http://169.254.169.254",
            "127.0.0.1:99999",
            "127.0.0.1:0",
            "127.0.0.1:x",
            "metadata/computeMetadata",
            "user@metadata",
            "[::1",
            "[zz]:80",
            "meta data",
            "host:80:80",
        ],
    ),
    (
        clouds.AWS.variable,
        ["https://169.254.169.254", "ftp://x", "http://x/latest", "http://", "127.0.0.1:0", "a b"],
    ),
    (
        clouds.AZURE.variable,
        ["https://169.254.169.254", "http://x?api-version=1", "http://[::1", "http://x:65536"],
    ),
    (GRACE, ["30s", "abc", "-1", "-0.5", "nan", "inf", "-inf", "1e400", "30,5"]),
    (END, ["garbage", "nan", "inf", "1e400", "2026-11-22T19:00:00Z"]),
]

BAD_CASES = [(name, value) for name, values in BAD for value in values]


@pytest.mark.parametrize(("name", "value"), BAD_CASES)
def test_a_bad_value_fails_environment_naming_the_variable_and_the_value(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=names_variable_and_value(name, value)):
        _platform.environment()


@pytest.mark.parametrize(("name", "value"), BAD_CASES)
def test_settings_raise_the_same_error(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=names_variable_and_value(name, value)):
        _platform.settings()


def test_every_variable_is_checked_before_any_probe(monkeypatch):
    asked = []
    monkeypatch.delenv(_platform.CLOUD_ENV)
    monkeypatch.setattr(shared, "probe", lambda *a, **k: asked.append(a) or False)
    monkeypatch.setenv(clouds.AWS.variable, "http://127.0.0.1:1")
    monkeypatch.setenv(GRACE, "30s")
    with pytest.raises(ValueError, match=GRACE):
        _platform.environment()
    assert asked == []


@pytest.mark.parametrize("cloud", ["none", "gce", "aws", "azure"])
def test_variables_are_checked_whatever_the_cloud_and_scheduler(monkeypatch, cloud):
    # A value that matters only on Kubernetes still fails off it: the mistake is
    # found where the job is tried, not on the cluster.
    monkeypatch.setenv(_platform.CLOUD_ENV, cloud)
    monkeypatch.setenv(GRACE, "30s")
    with pytest.raises(ValueError, match=GRACE):
        _platform.environment()


# ------------------------------------------------------------ good values, parsed once


@pytest.mark.parametrize(
    ("value", "grace"),
    [(None, None), ("", None), ("  ", None), ("45", 45.0), (" 0 ", 0.0), ("2.5", 2.5)],
)
def test_kubernetes_grace_period_is_parsed_into_the_environment(monkeypatch, value, grace):
    """Unset or blank: not stated (the deadline is Kubernetes' default, 30 s, and no
    kill is stated)."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    if value is not None:
        monkeypatch.setenv(GRACE, value)
    env = _platform.environment()
    assert env.scheduler == "kubernetes"
    assert env.settings["kubernetes"] == grace
    stated = None if grace is None else NOW + grace
    planned = NOW + (30.0 if grace is None else grace)
    assert _platform.signal_deadlines(env, NOW) == (planned, stated)


@pytest.mark.parametrize(
    ("value", "deadline"),
    [
        (str(int(NOW) + 600), NOW + 600),
        (f"{NOW + 0.5}", NOW + 0.5),
        (str(int(NOW) - 1), None),
        (str(int(NOW)), None),
        ("0", None),
        ("", None),
        (None, None),
    ],
)
def test_slurm_end_time_is_parsed_into_the_environment(monkeypatch, value, deadline):
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    if value is not None:
        monkeypatch.setenv(END, value)
    env = _platform.environment()
    assert env.scheduler == "slurm"
    assert _platform.signal_deadlines(env, NOW) == (deadline, None)


def test_signal_deadlines_use_the_parsed_values_and_never_read_the_environment(
    monkeypatch,
):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv(GRACE, "45")
    env = _platform.environment()
    # Changed (even broken) after construction: the notice thread is not affected.
    monkeypatch.setenv(GRACE, "30s")
    monkeypatch.setenv(END, "garbage")
    assert _platform.signal_deadlines(env, NOW) == (NOW + 45, NOW + 45)
    slurm = _platform.Environment(
        device=env.device,
        cloud=None,
        metadata_base=None,
        scheduler="slurm",
        settings={"slurm": NOW + 9},
    )
    assert _platform.signal_deadlines(slurm, NOW) == (NOW + 9, None)


def test_no_signal_deadline_without_a_scheduler(monkeypatch):
    monkeypatch.setenv(END, str(int(NOW) + 600))
    monkeypatch.setenv(GRACE, "45")
    env = _platform.environment()
    assert env.scheduler is None
    assert _platform.signal_deadlines(env, NOW) == (None, None)


@pytest.mark.parametrize(
    ("cloud", "name", "value", "base"),
    [
        ("aws", clouds.AWS.variable, "127.0.0.1:8080", "http://127.0.0.1:8080"),
        ("aws", clouds.AWS.variable, " http://127.0.0.1:8080/ ", "http://127.0.0.1:8080"),
        ("azure", clouds.AZURE.variable, "HTTP://[::1]:80/", "HTTP://[::1]:80"),
        ("azure", clouds.AZURE.variable, "", clouds.AZURE.default_base),
        ("gce", clouds.GCE.variable, "127.0.0.1:9", "http://127.0.0.1:9"),
        (
            "gce",
            clouds.GCE.variable,
            "metadata.google.internal/",
            "http://metadata.google.internal",
        ),
        ("gce", clouds.GCE.variable, "", "http://metadata.google.internal"),
    ],
)
def test_metadata_urls_are_normalised(monkeypatch, cloud, name, value, base):
    monkeypatch.setenv(_platform.CLOUD_ENV, cloud)
    monkeypatch.setenv(name, value)
    assert _platform.environment().metadata_base == base


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1",
        "http://127.0.0.1:1/",
        "HTTP://Metadata.Google.Internal:80",
        "http://metadata_1.internal",
        "http://[::1]:8080",
        "http://[fe80::1]",
        "http://1.2.3.4:65535",
        "https://127.0.0.1",
        "http://x/latest",
        "http://x//",
        "http://x?q",
        "http://x#f",
        "http://u@x",
        "http://",
        "http://:80",
        "http://x:",
        "http://x:0",
        "http://x:65536",
        "http://x:123456",
        "http://x:+80",
        "http://x:\uff18\uff10",
        "http://[::1",
        "http://[::1]x",
        "http://[1.2.3.4]",
        "http://a b",
        "http://é.example",
        "http://" + "a" * 254,
        "http://300.1.1.1",
    ],
)
def test_the_url_check_agrees_with_the_native_client(url):
    problem = shared.base_url_problem(url)
    try:
        # Timeout 0: the URL is parsed, then the probe gives up at once.
        shared.TABLE["aws"]["probe"](url, 0.0)
    except ValueError:
        native_accepts = False
    else:
        native_accepts = True
    assert (problem is None) == native_accepts, problem


# ------------------------------------------------------------ at construction


def _fake_checkpoint() -> testing.FakeCheckpoint:
    return testing.FakeCheckpoint(w=testing.FakeVariable(0))


def _package_threads() -> set:
    return {
        t
        for t in threading.enumerate()
        if t.name.startswith(("WorkerTerminationSignalWatcher", "PeerTerminationWatcher", "tfh-"))
    }


@pytest.mark.parametrize(("name", "value"), [(n, v[0]) for n, v in BAD])
def test_a_handler_is_not_built_with_a_bad_value(monkeypatch, tmp_path, name, value):
    monkeypatch.setenv(name, value)
    before_threads = _package_threads()
    before_sigterm = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ValueError, match=names_variable_and_value(name, value)):
        PreemptionCheckpointHandler(None, _fake_checkpoint(), str(tmp_path))
    assert _package_threads() - before_threads == set()
    assert signal.getsignal(signal.SIGTERM) == before_sigterm


def test_a_handler_with_good_values_is_built(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv(GRACE, "45")
    handler = PreemptionCheckpointHandler(None, _fake_checkpoint(), str(tmp_path))
    try:
        assert handler._environment.settings["kubernetes"] == 45.0
    finally:
        handler.close()


@pytest.mark.parametrize(("name", "value"), [(n, v[0]) for n, v in BAD])
def test_a_watcher_is_not_built_with_a_bad_value(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    before = _package_threads()
    with pytest.raises(ValueError, match=names_variable_and_value(name, value)):
        PreemptionWatcher()
    assert _package_threads() - before == set()
