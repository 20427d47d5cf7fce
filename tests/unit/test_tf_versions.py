"""The TensorFlow releases tested (``_integrations/tf_versions.py``) and the internals relied
on (``tf_internals.py``).

Against the installed TensorFlow: every internal the package relies on has the
fingerprint recorded for its release. The compatibility matrix runs this on every
release it covers, so a release that changes one fails here, naming it.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from tf_failure_handling._integrations import tf_versions

from . import tf_internals as tv

PACKAGE = Path(tf_versions.__file__).resolve().parents[1]
COORDINATOR = PACKAGE / "coordinator.py"
#: The coordinator's closures: the function cache, the RemoteValue, the worker loop.
CLOSURES = [
    PACKAGE / "_coordinator" / name
    for name in ("function_cache.py", "remote_values.py", "resource_values.py", "worker_loop.py")
]


def test_every_release_entry_covers_every_internal():
    for release, fingerprints in tv.RELEASES.items():
        assert set(fingerprints) == set(tv.RELIED_ON), release
        assert all(re.fullmatch(r"[0-9a-f]{12}", f) for f in fingerprints.values()), release
    assert tf_versions.TESTED[0] in tv.RELEASES, "the oldest tested release must have its own entry"


@pytest.mark.parametrize(
    ("version", "tested"),
    [
        ("2.15.1", False),
        ("2.16.0", True),
        ("2.16.2", True),
        ("2.19.1", True),
        ("2.21.0", True),
        ("2.22.0rc0", False),
        ("3.0.0", False),
    ],
)
def test_is_tested(version, tested):
    assert tf_versions.is_tested(version) is tested


def test_expected_is_the_nearest_recorded_release_at_or_before(monkeypatch):
    monkeypatch.setattr(tv, "RELEASES", {"2.16": {"a": "1"}, "2.19": {"a": "2"}})
    assert tv.expected("2.16.2") == {"a": "1"}
    assert tv.expected("2.18.0") == {"a": "1"}
    assert tv.expected("2.19.0") == {"a": "2"}
    assert tv.expected("2.21.0") == {"a": "2"}
    with pytest.raises(ValueError, match=r"older than 2\.16"):
        tv.expected("2.15.0")
    assert tv.release("2.21.0rc1") == "2.21"


def test_coordinator_uses_only_recorded_internals():
    """Every ``_tf_cc.<name>`` that coordinator.py or the closures' modules of _coordinator/
    touch is in RELIED_ON."""
    sources = [COORDINATOR, *CLOSURES]
    used = set(re.findall(r"_tf_cc\.(\w+)", "".join(p.read_text() for p in sources)))
    recorded = {
        key.partition(":")[2].split(".")[0]
        for key in tv.RELIED_ON
        if key.startswith("tensorflow.python.distribute.coordinator.cluster_coordinator:")
    }
    assert used and used <= recorded, f"not in tf_internals.RELIED_ON: {sorted(used - recorded)}"


def test_fingerprint_ignores_docstrings_and_comments(monkeypatch, tmp_path):
    import sys

    a = tmp_path / "fp_a.py"
    b = tmp_path / "fp_b.py"
    c = tmp_path / "fp_c.py"
    a.write_text('def f(x):\n    """Doc."""\n    return x + 1\n')
    b.write_text("def f(x):  # a comment\n    return (x +\n            1)\n")
    c.write_text("def f(x):\n    return x + 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    prints = {name: tv.fingerprint(f"{name}:f") for name in ("fp_a", "fp_b", "fp_c")}
    for name in ("fp_a", "fp_b", "fp_c"):
        sys.modules.pop(name, None)
    assert prints["fp_a"] == prints["fp_b"] != prints["fp_c"]


def test_warns_once_outside_the_tested_range(monkeypatch, caplog):
    monkeypatch.setattr(tf_versions, "_warned", [])
    with caplog.at_level(logging.WARNING, logger="tf_failure_handling"):
        tf_versions.warn_if_untested("2.21.0")
        assert not caplog.records
        tf_versions.warn_if_untested("2.22.0")
        tf_versions.warn_if_untested("2.23.0")
    assert len(caplog.records) == 1
    assert "2.22.0 is outside" in caplog.records[0].getMessage()


def test_installed_tensorflow_matches_its_release():
    tf = pytest.importorskip("tensorflow", reason="fingerprints the installed TensorFlow")
    version = tf.__version__
    assert tf_versions.is_tested(version), f"TensorFlow {version} is outside {tf_versions.TESTED}"
    found = tv.installed()
    wanted = tv.expected(version)
    changed = {k: (wanted[k], found[k]) for k in wanted if found[k] != wanted[k]}
    assert not changed, (
        f"TensorFlow {version} differs from the recorded release in what tf_failure_handling "
        "relies on (internal: recorded, found); record the release in tf_internals.RELEASES "
        "and adapt what depends on it:\n"
        + "\n".join(f"  {k}: {v[0]} -> {v[1]}" for k, v in changed.items())
    )
