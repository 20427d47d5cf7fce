"""The exit guard arms only on a deadline the platform stated (issue 60).

Each case is a real handler in a child process (``test_signals.run_script``: local
mode, ``testing.FakeCheckpoint``, no TensorFlow) that gets its platform's signal, saves,
and raises the restart code's ``SystemExit``. The child records what the guard was armed
for (``exit_guard.arm``'s answer, wrapped) and catches the ``SystemExit`` to say so; it
then ends with ``os._exit`` so that no guard decides anything here.

* Kubernetes without ``TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD``: the 30 s deadline
  is Kubernetes' default, an assumption; nothing is armed. With it: armed.
* SLURM (a fake ``scontrol`` on ``PATH``): SIGUSR1 arms the guard for SLURM's SIGKILL,
  ``KillWait`` after the job's end, not for the job's end; after the handler's
  ``scontrol requeue``, ``KillWait`` after the requeue; with ``KillWait`` unknown,
  nothing.

The deadlines are minutes away and ``KillWait`` is 300 s: the moments compared differ by
hundreds of seconds, and the tolerances (a few seconds) only absorb the time between a
clock read and the next.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap

import pytest

from .test_exit_guard import GUARDS_WAITING
from .test_signals import _details, run_script

#: Seconds from the child's start to the job's end (SLURM) or of the pod's grace period.
FAR = 600.0
#: SLURM's KillWait in the fake cluster.
KILL_WAIT = 300.0
#: What the moments compared may differ by: clock reads apart, never a verdict's margin.
TOLERANCE = 5.0
GRACE_ENV = "TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD"

RECORD_ARMING = (
    GUARDS_WAITING
    + """
from tf_failure_handling._protocol import exit_guard as _exit_guard

ARMED = []
_arm = _exit_guard.arm


def _recording_arm(deadline, now, code):
    delay = _arm(deadline, now, code)
    ARMED.append({"delay": delay, "unix": time.time(), "code": code})
    return delay


_exit_guard.arm = _recording_arm


def saved_and_exited(h):
    try:
        train_until_exit(h)
    except SystemExit as e:
        emit("exit", code=e.code, armed=ARMED, waiting=guards_waiting())
    sys.stdout.flush()
    os._exit(0)
"""
)


def _arming(rc, events, proc) -> dict:
    assert rc == 0, _details(proc)
    assert "exit" in events, _details(proc)
    exit_ = events["exit"]
    assert exit_["code"] == 42, _details(proc)
    assert len(exit_["armed"]) == 1, _details(proc)
    return exit_


@pytest.mark.timeout(90)
@pytest.mark.parametrize("grace", [None, "20"], ids=["grace period unset", "grace period 20 s"])
def test_kubernetes_arms_the_guard_only_with_the_pods_grace_period(tmp_path, grace):
    """Success: without the variable no guard waits after the exit's SystemExit (its
    delay is None); with it, one waits, for the stated 20 s less the guard's lead."""
    setting = "" if grace is None else f"os.environ[{GRACE_ENV!r}] = {grace!r}"
    rc, events, proc = run_script(
        tmp_path,
        RECORD_ARMING
        + f"""
os.environ["KUBERNETES_SERVICE_HOST"] = "10.0.0.1"
os.environ.pop({GRACE_ENV!r}, None)
{setting}
h = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)
for _ in range(3):
    h.run(step)
os.kill(os.getpid(), signal.SIGTERM)
wait_for_attention(h)
saved_and_exited(h)
""",
        timeout=80,
    )
    exit_ = _arming(rc, events, proc)
    delay = exit_["armed"][0]["delay"]
    if grace is None:
        assert delay is None and exit_["waiting"] == 0, _details(proc)
    else:
        assert delay is not None and exit_["waiting"] == 1, _details(proc)
        assert 20.0 - 1.0 - TOLERANCE < delay <= 20.0 - 1.0, delay


#: A stand-in for SLURM's ``scontrol``: the job, the partition, the config (``KillWait``
#: unless ``FAKE_NO_KILLWAIT``), and ``requeue``, whose moment it appends to
#: ``FAKE_REQUEUES``.
FAKE_SCONTROL = """
import json, os, sys, time

args = sys.argv[1:]
if args[:2] == ["show", "job"]:
    end = float(os.environ["SLURM_JOB_END_TIME"])
    end = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end))
    print(f"JobId={args[-1]} JobState=RUNNING Requeue=1 Restarts=0 Partition=low "
          f"PreemptTime=None EndTime={end}")
elif args[:2] == ["show", "partition"]:
    print("PartitionName=low GraceTime=0")
elif args[:2] == ["show", "config"]:
    if os.environ.get("FAKE_NO_KILLWAIT"):
        sys.exit("scontrol: error: cannot reach slurmctld")
    print("KillWait                = %d sec" % int(os.environ["FAKE_KILLWAIT"]))
elif args[:1] == ["requeue"]:
    with open(os.environ["FAKE_REQUEUES"], "a") as f:
        f.write(json.dumps(time.time()) + "\\n")
else:
    sys.exit(f"scontrol: unexpected {args}")
"""


def _slurm_child(tmp_path, monkeypatch, *, requeue: bool, kill_wait: bool):
    """The child under a fake SLURM job whose end is FAR away; SIGUSR1 (the time
    limit's warning) once the handler has read the job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "scontrol"
    fake.write_text(f"#!{sys.executable}\n" + FAKE_SCONTROL)
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    requeues = tmp_path / "requeues"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_KILLWAIT", str(int(KILL_WAIT)))
    monkeypatch.setenv("FAKE_REQUEUES", str(requeues))
    if not kill_wait:
        monkeypatch.setenv("FAKE_NO_KILLWAIT", "1")
    for name in ("SLURM_PROCID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TF_FAILURE_HANDLING_SLURM_REQUEUE", "1" if requeue else "0")
    rc, events, proc = run_script(
        tmp_path,
        RECORD_ARMING
        + textwrap.dedent(
            f"""
            from tf_failure_handling._platforms import slurm as _slurm

            END = time.time() + {FAR}
            os.environ["SLURM_JOB_ID"] = "77"
            os.environ["SLURM_JOB_END_TIME"] = str(END)
            h = PreemptionCheckpointHandler(None, ckpt, CKPT_DIR)
            for _ in range(3):
                h.run(step)
            read_by = time.monotonic() + 60
            while _slurm.job_limits() is None:
                assert time.monotonic() < read_by, "the handler never read the job"
                time.sleep(0.01)
            emit("job", end=END, kill_wait=_slurm.job_limits().kill_wait)
            os.kill(os.getpid(), signal.SIGUSR1)
            wait_for_attention(h)
            saved_and_exited(h)
            """
        ),
        timeout=80,
    )
    moments = [json.loads(line) for line in requeues.read_text().splitlines()] if requeue else []
    return _arming(rc, events, proc), events["job"], moments, proc


def _kill_moment(exit_) -> float:
    """The Unix time the guard was armed for: its delay from the moment it was armed,
    plus its lead."""
    from tf_failure_handling import _native

    armed = exit_["armed"][0]
    assert armed["delay"] is not None, exit_
    return armed["unix"] + armed["delay"] + _native.EXIT_GUARD_LEAD


@pytest.mark.timeout(90)
def test_slurm_arms_the_guard_killwait_after_the_jobs_end(tmp_path, monkeypatch):
    """Success: SIGUSR1, no requeue: the guard is armed for the job's end plus KillWait
    (SLURM's SIGKILL), not for the job's end (SLURM's SIGTERM)."""
    exit_, job, _, proc = _slurm_child(tmp_path, monkeypatch, requeue=False, kill_wait=True)
    assert job["kill_wait"] == KILL_WAIT, _details(proc)
    kill = _kill_moment(exit_)
    assert abs(kill - (job["end"] + KILL_WAIT)) < TOLERANCE, (kill - job["end"], _details(proc))


@pytest.mark.timeout(90)
def test_slurm_arms_the_guard_killwait_after_its_requeue(tmp_path, monkeypatch):
    """Success: SIGUSR1, and the handler's ``scontrol requeue`` after the save (which
    ends the job's steps then): the guard is armed for KillWait after the requeue, not
    for the job's end or KillWait after it."""
    exit_, job, requeues, proc = _slurm_child(tmp_path, monkeypatch, requeue=True, kill_wait=True)
    assert len(requeues) == 1, _details(proc)
    kill = _kill_moment(exit_)
    # The requeue's start is the soonest SLURM can act: at most the fake's own start
    # before the moment it wrote.
    assert requeues[0] + KILL_WAIT - 30.0 < kill < requeues[0] + KILL_WAIT + TOLERANCE, (
        kill - requeues[0],
        _details(proc),
    )
    assert kill < job["end"] - 100.0, _details(proc)


@pytest.mark.timeout(90)
def test_slurm_without_killwait_arms_nothing(tmp_path, monkeypatch):
    """Success: ``KillWait`` could not be read: nothing says when SIGKILL comes, and no
    guard is armed (SLURM's own default of 30 s may not be the cluster's), requeued or
    not."""
    exit_, job, requeues, proc = _slurm_child(tmp_path, monkeypatch, requeue=True, kill_wait=False)
    assert job["kill_wait"] is None and len(requeues) == 1, _details(proc)
    assert exit_["armed"][0]["delay"] is None and exit_["waiting"] == 0, _details(proc)
