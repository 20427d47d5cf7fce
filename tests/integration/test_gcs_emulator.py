"""The GCS emulator harness (gcs_emulator.py): TensorFlow's own ``gs://`` filesystem works
against it, a ``tf.train.Checkpoint`` makes the round trip, and it leaves nothing behind.

Every TensorFlow call runs in a fresh Python process inside the harness's network
namespace, where www.googleapis.com and storage.googleapis.com are 127.0.0.1; what it
wrote is then checked through the emulator's JSON API by another client
(``list_objects``/``read_object``), and a checkpoint is restored by a process that did
not write it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .gcs_emulator import (
    CLIENT_BOUND,
    LIFETIME_BOUND,
    GcsEmulatorError,
    gcs_emulator,
    require_gcs_emulator,
    unavailable_reason,
)

#: Bounds one TensorFlow process (import, a few gs:// calls): seconds when idle, but under
#: `make test`'s load one ran over the 180 s this used to be, still writing.
TF_TIMEOUT = 480.0
NETNS_LIST_BOUND = 30.0  # _namespaces()
QUIET_TF = {"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}


@pytest.fixture(scope="module")
def gcs():
    with require_gcs_emulator() as emu:
        yield emu


def run_tf(gcs, script: str, *args: str) -> dict:
    """Runs ``script`` in the namespace; returns the JSON object on its last stdout line."""
    try:
        proc = gcs.run([sys.executable, "-c", script, *args], env=QUIET_TF, timeout=TF_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"TensorFlow subprocess ran over {TF_TIMEOUT} s (waiting for it to exit); "
            f"stderr: {(e.stderr or b'')[-3000:]!r}\nemulator log:\n{gcs.log_tail()}"
        )
    if proc.returncode != 0:
        pytest.fail(
            f"TensorFlow subprocess exited {proc.returncode}\nstderr:\n{proc.stderr[-4000:]}"
            f"\nemulator log:\n{gcs.log_tail()}"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


GFILE_SCRIPT = r"""
import json, sys, time
import tensorflow as tf

g = tf.io.gfile
root = sys.argv[1]
out = {}
g.makedirs(root + "/dir/sub")
out["isdir"] = [g.isdir(root + "/dir"), g.isdir(root + "/dir/sub")]
start = time.perf_counter()
with g.GFile(root + "/dir/a.txt", "w") as f:
    f.write("hello gcs")
out["write_seconds"] = time.perf_counter() - start
with g.GFile(root + "/dir/b.bin", "wb") as f:
    f.write(bytes(range(256)) * 4096)  # 1 MiB
out["exists"] = [g.exists(root + "/dir/a.txt"), g.exists(root + "/dir/missing.txt")]
out["size"] = g.stat(root + "/dir/b.bin").length
out["listdir"] = sorted(g.listdir(root + "/dir"))
out["glob"] = sorted(g.glob(root + "/dir/*.txt"))
with g.GFile(root + "/dir/a.txt") as f:
    out["read"] = f.read()
with g.GFile(root + "/dir/b.bin", "rb") as f:
    f.seek(1000)
    out["read_at_1000"] = list(f.read(4))
g.rename(root + "/dir/a.txt", root + "/dir/renamed.txt")
out["after_rename"] = sorted(g.listdir(root + "/dir"))
with g.GFile(root + "/dir/renamed.txt") as f:
    out["renamed_read"] = f.read()
g.remove(root + "/dir/renamed.txt")
out["after_remove"] = sorted(g.listdir(root + "/dir"))
out["exists_removed"] = g.exists(root + "/dir/renamed.txt")
print(json.dumps(out))
"""


# Backstop above its own bounds in sequence: the module's emulator, one TF run, two
# client calls (+ 60 s).
@pytest.mark.timeout(LIFETIME_BOUND + TF_TIMEOUT + 2 * CLIENT_BOUND + 60)
def test_gfile_operations(gcs):
    root = f"gs://{gcs.bucket}/gfile"
    out = run_tf(gcs, GFILE_SCRIPT, root)
    assert out["isdir"] == [True, True]
    assert out["exists"] == [True, False]
    assert out["size"] == 1024 * 1024
    assert out["listdir"] == ["a.txt", "b.bin", "sub/"]
    assert out["glob"] == [f"{root}/dir/a.txt"]
    assert out["read"] == "hello gcs"
    assert out["read_at_1000"] == [1000 % 256, 1001 % 256, 1002 % 256, 1003 % 256]
    assert out["after_rename"] == ["b.bin", "renamed.txt", "sub/"]
    assert out["renamed_read"] == "hello gcs"
    assert out["after_remove"] == ["b.bin", "sub/"]
    assert out["exists_removed"] is False
    # What TensorFlow left, seen by another client over the JSON API.
    # makedirs left a marker object for each directory, "gfile/" included.
    assert gcs.list_objects("gfile/") == [
        "gfile/",
        "gfile/dir/",
        "gfile/dir/b.bin",
        "gfile/dir/sub/",
    ]
    assert gcs.read_object("gfile/dir/b.bin") == bytes(range(256)) * 4096
    print(
        f"\nGCS emulator: one small object write (GFile write + close) {out['write_seconds']:.3f} s"
    )


SAVE_SCRIPT = r"""
import json, sys
import tensorflow as tf

root = sys.argv[1]
weights = tf.Variable([[1.5, -2.0], [3.25, 4.0]])
step = tf.Variable(41, dtype=tf.int64)
ckpt = tf.train.Checkpoint(weights=weights, step=step)
written = ckpt.write(root + "/written/ckpt")
manager = tf.train.CheckpointManager(ckpt, root + "/managed", max_to_keep=1)
first = manager.save()
step.assign(42)
weights.assign_add(tf.ones([2, 2]))
second = manager.save()
print(json.dumps({"written": written, "first": first, "second": second}))
"""

RESTORE_SCRIPT = r"""
import json, sys
import tensorflow as tf

root, written = sys.argv[1], sys.argv[2]
out = {}
for name, path in (("written", written), ("latest", tf.train.latest_checkpoint(root + "/managed"))):
    weights = tf.Variable(tf.zeros([2, 2]))
    step = tf.Variable(0, dtype=tf.int64)
    status = tf.train.Checkpoint(weights=weights, step=step).restore(path)
    if name == "latest":
        status.assert_consumed()
    else:
        # write() stores no save_counter, which a restoring Checkpoint makes.
        status.assert_nontrivial_match()
    out[name] = {"path": path, "weights": weights.numpy().tolist(), "step": int(step.numpy())}
print(json.dumps(out))
"""


# Backstop above its own bounds in sequence: the module's emulator, two TF runs, two
# client calls (+ 60 s).
@pytest.mark.timeout(LIFETIME_BOUND + 2 * TF_TIMEOUT + 2 * CLIENT_BOUND + 60)
def test_checkpoint_round_trip(gcs):
    root = f"gs://{gcs.bucket}/ckpt"
    saved = run_tf(gcs, SAVE_SCRIPT, root)
    assert saved["written"] == f"{root}/written/ckpt"
    assert saved["first"] == f"{root}/managed/ckpt-1"
    assert saved["second"] == f"{root}/managed/ckpt-2"

    objects = gcs.list_objects("ckpt/")
    assert "ckpt/written/ckpt.index" in objects
    assert "ckpt/managed/checkpoint" in objects
    assert "ckpt/managed/ckpt-2.index" in objects
    # max_to_keep=1: the manager deleted ckpt-1 from the bucket.
    assert not [o for o in objects if o.startswith("ckpt/managed/ckpt-1.")]
    state = gcs.read_object("ckpt/managed/checkpoint").decode()
    assert 'model_checkpoint_path: "ckpt-2"' in state

    restored = run_tf(gcs, RESTORE_SCRIPT, root, saved["written"])
    assert restored["written"] == {
        "path": saved["written"],
        "weights": [[1.5, -2.0], [3.25, 4.0]],
        "step": 41,
    }
    assert restored["latest"] == {
        "path": saved["second"],
        "weights": [[2.5, -1.0], [4.25, 5.0]],
        "step": 42,
    }


def _namespaces() -> str:
    return subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=NETNS_LIST_BOUND
    ).stdout


# Backstop above its own bounds in sequence: an emulator's life, 2 namespace listings,
# a client call, a 30 s run, the 10 s wait (+ 60 s).
@pytest.mark.timeout(LIFETIME_BOUND + 2 * NETNS_LIST_BOUND + CLIENT_BOUND + 30 + 10 + 60)
def test_teardown_removes_everything_even_on_failure():
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"GCS emulator unavailable: {reason}")
    hosts_before = Path("/etc/hosts").read_bytes()
    seen = {}
    with pytest.raises(RuntimeError, match="the test failed"):
        with gcs_emulator(bucket="teardown-bucket") as emu:
            seen["namespace"] = emu.namespace
            seen["workdir"] = emu.workdir
            assert emu.namespace in _namespaces()
            assert Path("/etc/netns", emu.namespace, "hosts").is_file()
            assert emu.bucket == "teardown-bucket"
            assert emu.list_objects() == []
            # The names resolve to the emulator inside the namespace only.
            inside = emu.run(["getent", "hosts", "storage.googleapis.com"], timeout=30)
            assert inside.stdout.split()[0] == "127.0.0.1", inside
            assert b"googleapis" not in Path("/etc/hosts").read_bytes()
            leftover = emu.popen(["sleep", "600"])
            raise RuntimeError("the test failed")
    assert seen["namespace"] not in _namespaces()
    assert not Path("/etc/netns", seen["namespace"]).exists()
    assert not seen["workdir"].exists()
    assert leftover.wait(timeout=10) == -9  # killed with the namespace
    assert Path("/etc/hosts").read_bytes() == hosts_before


# Backstop above its own bounds in sequence: an emulator's life, 2 namespace listings
# (+ 60 s).
@pytest.mark.timeout(LIFETIME_BOUND + 2 * NETNS_LIST_BOUND + 60)
def test_emulator_that_does_not_start_is_an_error(monkeypatch):
    """A failed start is reported with what was waited for, and cleaned up (never a skip)."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"GCS emulator unavailable: {reason}")
    from . import gcs_emulator as module

    monkeypatch.setattr(module, "READY_LINE", "A-LINE-THE-SERVER-NEVER-PRINTS")
    monkeypatch.setattr(module, "_SETUP_TIMEOUT", 1.0)
    namespaces, netns_etc = _namespaces(), sorted(os.listdir("/etc/netns"))
    with pytest.raises(GcsEmulatorError, match=r"within 1\.0 s"):
        with gcs_emulator():
            pass
    assert _namespaces() == namespaces
    assert sorted(os.listdir("/etc/netns")) == netns_etc
