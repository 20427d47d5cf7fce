"""Preemption under ParameterServerStrategy, on a real cluster on 127.0.0.1 (issue 21).

Each test runs a coordinator (``PreemptionCheckpointHandler`` around
``ClusterCoordinator.schedule``, a ``join()`` every 20 runs), 2 workers and 1 PS
(``tfh.serve(server)``), each a process of ``ps_preemption_script.py``. Every
closure adds one to ``counter`` on the PS. Once 30 runs are scheduled, one role
gets SIGTERM; the test then does what a launcher does (restart what exited with
the restart code) and lets training run to its end (120 runs).

What counts as success, for each role's notice:

* the processes that must exit do so with the restart code 42, the others keep
  running; nothing hangs (every wait below is bounded and names what it waited for);
* a checkpoint's run count is exactly its counter (``restored``: runs == counter):
  a closure is counted iff its effect is in the saved variables;
* at the end ``counter == runs == 120``: no closure lost or applied twice.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from .mwms_worker import free_ports
from .ps_cluster import Proc

SCRIPT = Path(__file__).resolve().parent / "ps_preemption_script.py"
STEPS = 120
NOTICE_AFTER = 30
RESTART_CODE = 42
#: Bounds that only turn a hang into a failure (4 TF processes on 2 cores).
START_BOUND = 120.0
EXIT_BOUND = 120.0
FINISH_BOUND = 300.0


class Cluster:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        chief, ps, w0, w1 = free_ports(4)
        self.spec = {
            "chief": [f"127.0.0.1:{chief}"],
            "ps": [f"127.0.0.1:{ps}"],
            "worker": [f"127.0.0.1:{w0}", f"127.0.0.1:{w1}"],
        }
        self.procs: dict[str, Proc] = {}
        self.incarnations: dict[str, int] = {}

    def start(self, name: str, *args: str) -> Proc:
        incarnation = self.incarnations.get(name, -1) + 1
        self.incarnations[name] = incarnation
        cmd = [sys.executable, str(SCRIPT), *args, "--cluster", json.dumps(self.spec)]
        proc = Proc(name, cmd, self.workdir, incarnation)
        self.procs[name] = proc
        return proc

    def serve(self, job: str, task: int) -> Proc:
        return self.start(f"{job}{task}", "serve", "--job", job, "--task", str(task))

    def coordinator(self) -> Proc:
        return self.start(
            "coordinator",
            "coordinator",
            "--ckpt",
            str(self.workdir / "ckpt"),
            "--steps",
            str(STEPS),
        )

    def describe(self) -> str:
        return "\n".join(p.describe() for p in self.procs.values())

    def wait_event(self, name: str, kind: str, bound: float, pred=lambda e: True) -> dict:
        proc = self.procs[name]
        end = time.monotonic() + bound
        while time.monotonic() < end:
            for event in proc.events(kind):
                if pred(event):
                    return event
            if proc.popen.poll() is not None:
                # One more read: the event may have been written just before the exit.
                found = [e for e in proc.events(kind) if pred(e)]
                if found:
                    return found[0]
                pytest.fail(f"{name} exited before its {kind!r} event\n{self.describe()}")
            time.sleep(0.2)
        pytest.fail(f"no {kind!r} event from {name} within {bound:.0f}s\n{self.describe()}")

    def wait_exit(self, name: str, bound: float) -> int:
        try:
            return self.procs[name].popen.wait(timeout=bound)
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired
            pytest.fail(f"{name} did not exit within {bound:.0f}s\n{self.describe()}")

    def alive(self, name: str) -> bool:
        return self.procs[name].popen.poll() is None

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.kill()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    for job, task in (("ps", 0), ("worker", 0), ("worker", 1)):
        c.serve(job, task)
    for name in ("ps0", "worker0", "worker1"):
        c.wait_event(name, "serving", START_BOUND)
    c.coordinator()
    restored = c.wait_event("coordinator", "restored", START_BOUND)
    assert restored["runs"] == restored["counter"] == 0, restored
    yield c
    c.stop()


def _notice_after_runs(c: Cluster, name: str) -> None:
    c.wait_event("coordinator", "progress", FINISH_BOUND, lambda e: e["runs"] >= NOTICE_AFTER)
    c.procs[name].popen.send_signal(signal.SIGTERM)


def _resume_and_finish(c: Cluster) -> dict:
    """Restarts the coordinator, checks the restored checkpoint and runs to the end."""
    c.coordinator()
    restored = c.wait_event("coordinator", "restored", START_BOUND)
    assert restored["runs"] == restored["counter"], (
        f"the checkpoint counts {restored['runs']} runs but holds the effect of "
        f"{restored['counter']}\n{c.describe()}"
    )
    assert restored["runs"] >= NOTICE_AFTER, restored
    done = c.wait_event("coordinator", "done", FINISH_BOUND)
    assert done["runs"] == done["counter"] == STEPS, f"{done}\n{c.describe()}"
    assert c.wait_exit("coordinator", EXIT_BOUND) == 0, c.describe()
    return restored


def _records(c: Cluster):
    from tf_failure_handling import records

    found = records.load(c.workdir / "ckpt" / "preemption_records")
    assert found.skipped == {}, found.skipped
    return {p.label: p for p in found.preemptions}, found.resumes


def _check_coordinator_record(c: Cluster, restored: dict, source: str) -> None:
    """The coordinator's record: its step is the checkpoint's, the save ended
    before the exit, and the restart lost nothing."""
    by_task, resumes = _records(c)
    chief = by_task["chief 0"]
    assert source in chief.source, chief
    assert chief.agreed_step == restored["runs"], (chief, restored)
    assert chief.save_start <= chief.save_end <= chief.exit_time, chief
    assert chief.exit_code == RESTART_CODE, chief
    [resume] = [r for r in resumes if r.job == "chief"]
    assert resume.step == restored["runs"] and resume.lost == 0, resume


def test_coordinator_notice_saves_at_one_step_and_resumes(cluster):
    c = cluster
    _notice_after_runs(c, "coordinator")
    assert c.wait_exit("coordinator", EXIT_BOUND) == RESTART_CODE, c.describe()
    assert all(c.alive(n) for n in ("ps0", "worker0", "worker1")), c.describe()
    restored = _resume_and_finish(c)
    assert all(c.alive(n) for n in ("ps0", "worker0", "worker1")), c.describe()
    _check_coordinator_record(c, restored, "SIGTERM")


def test_ps_notice_serves_until_the_save_then_both_exit(cluster):
    c = cluster
    _notice_after_runs(c, "ps0")
    assert c.wait_exit("coordinator", EXIT_BOUND) == RESTART_CODE, c.describe()
    assert c.wait_exit("ps0", EXIT_BOUND) == RESTART_CODE, c.describe()
    assert c.alive("worker0") and c.alive("worker1"), c.describe()
    # The launcher restarts what exited: the PS first, then the coordinator.
    c.serve("ps", 0)
    c.wait_event("ps0", "serving", START_BOUND)
    restored = _resume_and_finish(c)
    _check_coordinator_record(c, restored, "ps 0: signal SIGTERM")
    ps = _records(c)[0]["ps 0"]
    assert "SIGTERM" in ps.source and ps.exit_code == RESTART_CODE, ps
    assert ps.extra.get("released") == "checkpoint saved", ps
    assert ps.exit_time >= _records(c)[0]["chief 0"].save_end, "released after the save"


def test_worker_notice_drains_that_worker_and_training_goes_on(cluster):
    c = cluster
    _notice_after_runs(c, "worker1")
    assert c.wait_exit("worker1", EXIT_BOUND) == RESTART_CODE, c.describe()
    assert c.alive("coordinator") and c.alive("ps0") and c.alive("worker0"), c.describe()
    c.serve("worker", 1)
    c.wait_event("worker1", "serving", START_BOUND)
    done = c.wait_event("coordinator", "done", FINISH_BOUND)
    assert done["runs"] == done["counter"] == STEPS, (
        f"a closure was lost or applied twice: {done}\n{c.describe()}"
    )
    assert c.wait_exit("coordinator", EXIT_BOUND) == 0, c.describe()
    worker = _records(c)[0]["worker 1"]
    assert "SIGTERM" in worker.source and worker.extra.get("released") == "drained", worker
    assert worker.notice_time <= worker.exit_time, worker
