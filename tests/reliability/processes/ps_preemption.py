"""The ``ps_preemption`` trial: a launcher over a real PS cluster, its faults, its checks.

Four to six processes on 127.0.0.1, each its own TensorFlow process of
``tests/integration/ps_preemption_script.py`` run through ``trial_worker.py
ps-preemption``: the coordinator (the handler around ``coord.schedule``, a ``join()``
every epoch; every closure carries its id and adds 1 to ``applied[id]`` on a PS, see
the script's ``--ids``), one or two PS and two or three workers (``tfh.serve(server)``),
as the plan's ``roles`` say. The plan also picks the coordinator (ours or TensorFlow's),
the grace period, a platform deadline (Kubernetes': every process gets
``KUBERNETES_SERVICE_HOST`` and the pod's grace period, so a SIGTERM carries a
deadline), a ``fetch()`` every Nth run and closures scheduled outside ``handler.run``.

:class:`Launcher` does what a job's launcher does: it restarts whatever exits -- a
server at once (exit code 42 after its notice, or killed), the coordinator once every
server serves again (after exit code 42 it first gives the servers it released a
moment to go; after any other exit, a PS or worker it depended on died, it restarts
it all the same) -- with a bounded number of restarts. :class:`FaultDriver` injects the
plan's faults (``plans.PS_MOMENTS``: inside a ``schedule()`` call, inside ``join()``,
during a worker's drain, during the coordinator's save) through the coordinator's
gates and events (``trial_worker.py``'s module docstring), and holds the coordinator
at a ``schedule()`` while the tasks a fault took down restart or a worker with a
notice drains; :class:`ExitWatch` holds every process to its bound. ``ps_checks.py``
then turns what the processes printed and the coordinator's preemption records into
violations (``process_trials.py`` states the invariants).

Every wait is bounded and says what it waited for; a process that overstays its
bound has its stacks dumped (``trial_worker.STACKS_SIGNAL``) before it is killed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from integration.forkserver import popen
from integration.mwms_worker import (
    LIVE_PROCESSES,
    child_environment,
    free_ports,
    kill_process,
    parse_events,
    tail,
)
from integration.ps_cluster import port_open
from tf_failure_handling.handler import PEER_TIMEOUT_ENV

from .harness import TRIAL_WORKER, dump_stacks
from .plans import PS_ROLES
from .report import TrialResult

RESTART_CODE = 42
#: ``serve()``'s bound on waiting for its release after a notice (no deadline here),
#: and the coordinator's bound on waiting for its closures before a save (unless the
#: plan's ``closure_bound`` sets that one).
PEER_TIMEOUT = 30.0
#: TF's wait for a lost worker to come back (the launcher restarts it well before).
WORKER_RECOVERY_TIMEOUT = 120.0
#: A started process serves (a server) or restored its checkpoint (the coordinator).
START_BOUND = 120.0
#: From a server's SIGTERM to its exit with 42: the coordinator's poll (0.5 s), its
#: wait for the closures and its save (a PS), the release, the process's exit. Beyond
#: PEER_TIMEOUT: a server that overstays it exits unreleased, which is a violation too.
SERVER_EXIT_BOUND = PEER_TIMEOUT + 45.0
#: From the coordinator's own SIGTERM to its exit with 42 (closures, save, exit).
COORDINATOR_EXIT_BOUND = PEER_TIMEOUT + 60.0
#: The coordinator prints at least every 5 runs, and around every join and save;
#: this long without a line (not at a gate, not stopped by the trial) is a hang.
STALL_BOUND = 90.0
#: A planned moment comes within this (else the fault is not fired: ``missed``).
MOMENT_BOUND = 90.0
#: After the coordinator exited 42, the servers with a notice (it released them before
#: its exit) get this long to go before the coordinator is restarted beside them.
RELEASED_EXIT_WAIT = 20.0
#: The whole trial.
TRIAL_BOUND = 360.0
MAX_COORDINATOR_LIVES = 8
MAX_SERVER_RESTARTS = 6
#: Seconds after a SIGKILL, or after the SIGCONT ending a SIGSTOP, during which a
#: closure the fault interrupted may still be re-executed (or the paused one land).
TAINT_AFTER = 3.0
#: Seconds between two looks of the launcher at its processes.
POLL = 0.02

WORKER_RECOVERY_TIMEOUT_ENV = "TF_FAILURE_HANDLING_WORKER_RECOVERY_TIMEOUT"
#: A plan's platform deadline: Kubernetes' detection and the pod's grace period
#: (``_platforms/kubernetes.py``), the SIGTERM's deadline being its arrival plus that.
KUBERNETES_HOST_ENV = "KUBERNETES_SERVICE_HOST"
KUBERNETES_GRACE_ENV = "TF_FAILURE_HANDLING_KUBERNETES_GRACE_PERIOD"


def role_kind(role: str) -> str:
    """``ps`` of ``ps1``, ``worker`` of ``worker2``, ``coordinator``."""
    return role.rstrip("0123456789")


def server_roles(roles) -> list:
    return [r for r in roles if r != "coordinator"]


class Incarnation:
    """One process of one role: its ``EVENT`` lines, its signals, its exit."""

    def __init__(self, role: str, number: int, cmd: list, workdir: Path, env: dict):
        self.role = role
        self.number = number
        suffix = f".{number}" if number else ""
        self.stdout = workdir / f"{role}{suffix}.stdout"
        self.stderr = workdir / f"{role}{suffix}.stderr"
        self.started = time.time()
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.popen = popen(
                cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env, cwd=str(workdir)
            )
        LIVE_PROCESSES.add(self.popen)
        self.signals: list = []  # (time.time(), signal name)
        self.exit_code: Optional[int] = None
        self.exited_at: Optional[float] = None  # when the launcher saw the exit
        self.killed_by_launcher = False
        self.up_at: Optional[float] = None  # when the launcher first saw it serve
        self._events: list = []
        self._read = 0

    @property
    def name(self) -> str:
        return f"{self.role}#{self.number}"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> Optional[int]:
        code = self.popen.poll()
        if code is not None and self.exited_at is None:
            self.exited_at = time.time()
            self.exit_code = code
            LIVE_PROCESSES.discard(self.popen)
        return code

    @property
    def alive(self) -> bool:
        return self.poll() is None

    def events(self, kind: Optional[str] = None) -> list:
        try:
            size = self.stdout.stat().st_size
        except FileNotFoundError:
            return []
        if size != self._read:
            text = self.stdout.read_text(errors="replace")
            self._events = parse_events(text)
            self._read = size
        return self._events if kind is None else [e for e in self._events if e["event"] == kind]

    def first(self, kind: str) -> Optional[dict]:
        found = self.events(kind)
        return found[0] if found else None

    def last_line_at(self) -> float:
        events = self.events()
        return max([self.started] + [e["t"] for e in events[-1:]])

    def send(self, sig: int) -> Optional[float]:
        """Sends ``sig``; the time it was sent, None if the process had exited."""
        if not self.alive:
            return None
        sent = time.time()
        self.popen.send_signal(sig)
        self.signals.append((sent, signal.Signals(sig).name))
        return sent

    def signalled(self, name: str) -> list:
        return [t for t, n in self.signals if n == name]

    def kill(self) -> None:
        if self.alive:
            self.killed_by_launcher = True
        kill_process(self.popen)
        self.poll()

    def describe(self, lines: int = 20) -> str:
        shown = [e for e in self.events() if e["event"] not in ("progress",)][-10:]
        return (
            f"--- {self.name} (pid {self.pid}, exit {self.exit_code}, signals "
            f"{[(round(t - self.started, 2), n) for t, n in self.signals]})\n"
            f"  events: {json.dumps(shown)[:2500]}\n"
            f"  stderr tail ({self.stderr}):\n{tail(self.stderr, lines)}"
        )


class Launcher:
    """The roles' processes, restarted as a launcher would (module docstring)."""

    def __init__(self, workdir: Path, params: dict, result: TrialResult):
        self.workdir = Path(workdir)
        self.params = params
        self.result = result
        self.ckpt = self.workdir / "ckpt"
        self.control = self.workdir / "control"
        self.control.mkdir(parents=True, exist_ok=True)
        self.roles = tuple(params.get("roles") or PS_ROLES)
        self.servers = server_roles(self.roles)
        self.ports = dict(zip(self.roles, free_ports(len(self.roles))))
        address = {r: f"127.0.0.1:{port}" for r, port in self.ports.items()}
        self.spec = {
            "chief": [address["coordinator"]],
            "ps": [address[r] for r in self.servers if role_kind(r) == "ps"],
            "worker": [address[r] for r in self.servers if role_kind(r) == "worker"],
        }
        self.env = {
            **child_environment(),
            PEER_TIMEOUT_ENV: str(PEER_TIMEOUT),
            WORKER_RECOVERY_TIMEOUT_ENV: str(WORKER_RECOVERY_TIMEOUT),
        }
        if params.get("deadline") is not None:
            self.env[KUBERNETES_HOST_ENV] = "127.0.0.1"
            self.env[KUBERNETES_GRACE_ENV] = str(params["deadline"])
        self.history: dict = {role: [] for role in self.roles}
        self.finished = False  # the coordinator printed done and exited 0
        self.aborted: Optional[str] = None
        self._coordinator_exit_seen: Optional[float] = None
        self._unreported_exits: set = set()

    # -- processes -------------------------------------------------------------
    def command(self, role: str) -> list:
        cmd = [sys.executable, str(TRIAL_WORKER), "ps-preemption"]
        p = self.params
        grace = [] if p.get("grace") is None else ["--grace-period", str(p["grace"])]
        if role == "coordinator":
            variant = ["--ids"]
            if p.get("fetch_every"):
                variant += ["--fetch-every", str(p["fetch_every"])]
            if p.get("outside_every"):
                variant += ["--outside-every", str(p["outside_every"])]
            if p.get("coordinator") == "tf":
                variant.append("--tf-coordinator")
            return [
                *cmd,
                "coordinator",
                "--control-dir",
                str(self.control),
                "--cluster",
                json.dumps(self.spec),
                "--ckpt",
                str(self.ckpt),
                "--steps",
                str(p["steps"]),
                "--work",
                str(p["work"]),
                "--epoch",
                str(p["epoch"]),
                *grace,
                *variant,
            ]
        job, task = role_kind(role), role[len(role_kind(role)) :]
        return [
            *cmd,
            "serve",
            "--cluster",
            json.dumps(self.spec),
            "--job",
            job,
            "--task",
            task,
            *grace,
        ]

    def start(self, role: str) -> Incarnation:
        env = self.env
        bound = self.params.get("closure_bound")
        if role == "coordinator" and bound is not None:
            env = {**env, PEER_TIMEOUT_ENV: str(bound)}
        inc = Incarnation(role, len(self.history[role]), self.command(role), self.workdir, env)
        self.history[role].append(inc)
        return inc

    def start_all(self) -> None:
        for role in (*self.servers, "coordinator"):
            self.start(role)

    def current(self, role: str) -> Optional[Incarnation]:
        found = self.history[role]
        return found[-1] if found else None

    def incarnations(self) -> list:
        return [inc for role in self.roles for inc in self.history[role]]

    def up(self, role: str) -> bool:
        """Whether ``role`` runs and serves (a server: its port answers once) or has
        restored its checkpoint (the coordinator)."""
        inc = self.current(role)
        if inc is None or not inc.alive:
            return False
        if inc.up_at is None:
            if role == "coordinator":
                ready = inc.first("restored") is not None
            else:
                ready = inc.first("serving") is not None and port_open(self.ports[role])
            if ready:
                inc.up_at = time.time()
        return inc.up_at is not None

    def whole(self) -> bool:
        return all(self.up(role) for role in self.roles)

    # -- the launcher's turn ---------------------------------------------------
    def step(self) -> None:
        """Restarts what exited (see the module docstring); sets ``finished``."""
        if self.finished or self.aborted:
            return
        now = time.time()
        for role in self.servers:
            inc = self.current(role)
            if inc.alive:
                continue
            restarts = len(self.history[role]) - 1
            if restarts >= MAX_SERVER_RESTARTS:
                self.aborted = f"{role} exited {restarts + 1} times (restart bound reached)"
                return
            self.start(role)
        coordinator = self.current("coordinator")
        if coordinator.alive:
            return
        if coordinator.exit_code == 0:
            if coordinator.first("done") is not None:
                self.finished = True
                return
            self.result.violations.append(f"{coordinator.name} exited 0 without printing done")
        if self._coordinator_exit_seen is None:
            self._coordinator_exit_seen = now
        if coordinator.exit_code == RESTART_CODE:
            leaving = [
                r
                for r in self.servers
                if self.current(r).alive and self.current(r).signalled("SIGTERM")
            ]
            if leaving and now - self._coordinator_exit_seen < RELEASED_EXIT_WAIT:
                return
        if not all(self.up(r) for r in self.servers):
            return
        if len(self.history["coordinator"]) >= MAX_COORDINATOR_LIVES:
            self.aborted = (
                f"the coordinator exited {MAX_COORDINATOR_LIVES} times (restart bound reached)"
            )
            return
        self._coordinator_exit_seen = None
        self.start("coordinator")

    def state(self) -> str:
        """What each role's current process is doing (for a message)."""
        parts = []
        for role in self.roles:
            inc = self.current(role)
            what = "up" if self.up(role) else "starting" if inc.alive else f"exit {inc.exit_code}"
            parts.append(f"{inc.name} {what}")
        coordinator = self.current("coordinator")
        runs = max([e["runs"] for e in coordinator.events("progress")], default=None)
        return ", ".join(parts) + f"; last progress of {coordinator.name}: run {runs}"

    def stop(self) -> None:
        """The job's end: every process still running is killed and reaped."""
        for inc in self.incarnations():
            inc.kill()

    def leftovers(self) -> list:
        """PIDs of processes still running in this trial's directory (none may be)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if Path(cwd) == self.workdir:
                found.append(int(entry.name))
        return found

    def dump_stacks(self, incs=None) -> None:
        for inc in incs if incs is not None else self.incarnations():
            if inc.alive:
                dump_stacks(inc.popen, inc.stderr)

    def describe(self) -> str:
        parts = [f"cluster {self.spec} in {self.workdir}"]
        parts += [inc.describe() for inc in self.incarnations()]
        return "\n".join(parts)


@dataclasses.dataclass
class Fault:
    """One planned fault and what became of it."""

    index: int
    role: str
    signal: str
    moment: str
    at_runs: Optional[int]
    delay: float
    stop_s: float
    #: waiting -> armed (its gate) -> fired; or missed.
    state: str = "waiting"
    since: float = 0.0  # when the current state began (time.time())
    gate_id: Optional[str] = None
    fire_at: Optional[float] = None
    fired_at: Optional[float] = None
    target: Optional[Incarnation] = None
    cont_at: Optional[float] = None
    continued_at: Optional[float] = None
    open_at: Optional[float] = None
    landed: Optional[str] = None
    why_missed: Optional[str] = None
    restarting: bool = False  # waiting for the cluster to be whole again

    def record(self, t0: float) -> dict:
        def rel(t):
            return None if t is None else round(t - t0, 3)

        return {
            "role": self.role,
            "signal": self.signal,
            "aimed": self.moment,
            "landed": self.landed,
            "missed": self.why_missed,
            "fired_s": rel(self.fired_at),
            "target": None if self.target is None else self.target.name,
        }


class FaultDriver:
    """Fires the plan's faults at their moments, one after the other (module docstring)."""

    def __init__(self, launcher: Launcher, faults: list, result: TrialResult):
        self.launcher = launcher
        self.result = result
        self.faults = [Fault(i, **f) for i, f in enumerate(faults)]
        now = time.time()
        for f in self.faults:
            f.since = now
        #: The schedule gate that holds the coordinator while the cluster restarts
        #: (see :meth:`_hold`): its id and since when, or None.
        self.holding: Optional[tuple] = None
        self._holds = 0

    def _write_arm(self, point: str, gate_id: str) -> None:
        arm = self.launcher.control / f"arm-{point}"
        tmp = arm.with_suffix(".tmp")
        tmp.write_text(gate_id)
        tmp.replace(arm)

    def _arm(self, fault: Fault, point: str) -> None:
        fault.gate_id = f"{point}-{fault.index}"
        self._write_arm(point, fault.gate_id)
        fault.state, fault.since = "armed", time.time()

    def _hold(self) -> None:
        """Holds the coordinator at its next ``schedule()`` call while the tasks the
        faults before took down restart: otherwise training, which goes on without
        them, may end before the next fault's moment (the same task preempted again
        after its restart, say). The coordinator is only slower meanwhile: its closures
        in flight finish, its handler and its drains go on."""
        if self.holding is None:
            self._holds += 1
            gate_id = f"hold-{self._holds}"
            self._write_arm("schedule", gate_id)
            self.holding = (gate_id, time.time())

    def _may_hold(self, before: list) -> bool:
        """Whether the coordinator is to be held now: a task that a fault before took
        down is not back yet, and nothing left to do needs the coordinator's own thread
        (a save after its notice or its PS's; a worker's drain runs on a thread of its
        own)."""
        down = [f for f in before if f.fired_at is not None and f.signal != "SIGSTOP"]
        if not down:
            return False
        if any(
            f.signal == "SIGTERM" and not f.role.startswith("worker") and f.target.alive
            for f in down
        ):
            return False
        return not self.launcher.whole() or any(f.target.alive for f in down)

    def _release_hold(self) -> None:
        """Opens the hold (or leaves it open for a coordinator that has not reached it)."""
        if self.holding is None:
            return
        gate_id, since = self.holding
        (self.launcher.control / f"open-{gate_id}").touch()
        self._remove_arm("schedule", gate_id)
        held = self.result.notes.setdefault("held_for_restarts_s", [])
        held.append(round(time.time() - since, 1))
        self.holding = None

    def _disarm(self, fault: Fault) -> None:
        if fault.gate_id is not None:
            self._remove_arm(fault.gate_id.split("-")[0], fault.gate_id)

    def _remove_arm(self, point: str, gate_id: str) -> None:
        """Removes gate ``point``'s arm if it still holds ``gate_id``: the coordinator may
        take it (remove the file) at any moment, which is no error."""
        arm = self.launcher.control / f"arm-{point}"
        try:
            if arm.read_text().strip() == gate_id:
                arm.unlink()
        except FileNotFoundError:
            pass

    def _miss(self, fault: Fault, why: str) -> None:
        self._disarm(fault)
        fault.state, fault.why_missed = "missed", why
        self.result.notes.setdefault("missed_faults", []).append(
            f"fault {fault.index} ({fault.signal} {fault.role} at {fault.moment}): {why}"
        )

    def _gate_event(self, fault: Fault) -> Optional[dict]:
        for inc in self.launcher.history["coordinator"]:
            for e in inc.events("gate"):
                if e["id"] == fault.gate_id:
                    return e
        return None

    def _settled(self, fault: Fault) -> bool:
        """The fault's consequences are over: a paused process resumed; a signalled
        process exited (or the watch gave up on it)."""
        if fault.state == "missed":
            return True
        if fault.state != "fired":
            return False
        if fault.signal == "SIGSTOP":
            return fault.continued_at is not None
        return not fault.target.alive

    def step(self) -> None:
        now = time.time()
        for f in self.faults:
            if f.state == "fired" and f.signal == "SIGSTOP" and f.continued_at is None:
                if now >= f.cont_at:
                    f.continued_at = f.target.send(signal.SIGCONT) or now
            if f.open_at is not None and now >= f.open_at:
                (self.launcher.control / f"open-{f.gate_id}").touch()
                f.open_at = None
        pending = [f for f in self.faults if f.state not in ("fired", "missed")]
        if not pending:
            # Training must not end before a worker with a notice has left: its exit,
            # released by the coordinator, is what the trial checks.
            draining = [
                f
                for f in self.faults
                if f.fired_at is not None
                and f.signal == "SIGTERM"
                and f.role.startswith("worker")
                and f.target.alive
            ]
            if draining and now - draining[0].fired_at < MOMENT_BOUND:
                self._hold()
            else:
                self._release_hold()
            return
        fault = pending[0]
        before = self.faults[: fault.index]
        if self.launcher.finished:
            self._release_hold()
            self._miss(fault, "training ended first")
            return
        if fault.state == "waiting":
            if fault.moment in ("drain", "save"):
                # Armed with the notice before it; left waiting: that notice missed.
                self._miss(fault, "the notice that starts this moment was not sent")
                return
            if self._may_hold(before):
                self._hold()
            if not all(self._settled(f) for f in before):
                fault.since = now
                return
            if not self.launcher.whole():
                if now - fault.since > MOMENT_BOUND:  # restarts overdue: let training go
                    self._release_hold()
                fault.restarting = True
                return
            if fault.restarting:  # the run count is awaited from now
                fault.since, fault.restarting = now, False
            self._release_hold()
            if now - fault.since > MOMENT_BOUND:
                self._miss(fault, f"run {fault.at_runs} not reached within {MOMENT_BOUND:.0f}s")
                return
            coordinator = self.launcher.current("coordinator")
            progress = max([e["runs"] for e in coordinator.events("progress")], default=0)
            restored = coordinator.first("restored")["runs"]
            if max(progress, restored) < fault.at_runs:
                return
            self._arm(fault, "schedule" if fault.moment == "scheduling" else "join")
            # A notice whose drain or save the next fault is aimed at: that gate is
            # armed before the notice is sent.
            later = self.faults[fault.index + 1 :]
            if later and later[0].moment in ("drain", "save") and later[0].state == "waiting":
                self._arm(later[0], later[0].moment)
            return
        if fault.state == "armed":
            gate = self._gate_event(fault)
            if gate is None:
                if now - fault.since > MOMENT_BOUND:
                    self._miss(fault, f"gate {fault.gate_id} not reached in {MOMENT_BOUND:.0f}s")
                return
            if fault.fire_at is None:
                fault.fire_at = gate["t"] + fault.delay
            if now >= fault.fire_at:
                self._fire(fault)
                # The gate opens once the signal has landed; a paused process stays
                # paused past it (the moment goes on around the pause).
                fault.open_at = time.time() + 0.2

    def _fire(self, fault: Fault) -> None:
        target = self.launcher.current(fault.role)
        if target is None or not target.alive:
            self._miss(fault, f"{fault.role} was not running at the moment")
            return
        sent = target.send(getattr(signal, fault.signal))
        if sent is None:
            self._miss(fault, f"{fault.role} exited just before the signal")
            return
        fault.state, fault.fired_at, fault.target = "fired", sent, target
        if fault.signal == "SIGSTOP":
            fault.cont_at = sent + fault.stop_s
        self.result.fault(f"{role_kind(fault.role)}_{fault.signal.lower()}")

    def finish(self) -> None:
        """Faults never fired are missed; where each fired one landed is measured."""
        self._release_hold()
        for f in self.faults:
            if f.state in ("waiting", "armed"):
                self._miss(f, "trial ended first")
            if f.fired_at is not None:
                f.landed = self._landing(f)
                self.result.fault(f"at_{f.landed}")

    def _landing(self, fault: Fault) -> str:
        """The planned moment, if the coordinator was still inside it when the fault
        was sent (its gate had not opened; a join had not returned)."""
        for inc in self.launcher.history["coordinator"]:
            events = inc.events()
            gates = [e for e in events if e["event"] == "gate" and e["id"] == fault.gate_id]
            if not gates:
                continue
            after = [e for e in events if e["t"] >= gates[0]["t"]]
            ends = ("join_end", "join_raised") if fault.moment == "join" else ("gate_open",)
            end = next((e for e in after if e["event"] in ends), None)
            if end is None or fault.fired_at <= end["t"]:
                return fault.moment
            return f"after_{fault.moment}"
        return "unknown"


def run(launcher: Launcher, driver: FaultDriver, result: TrialResult) -> None:
    """The trial's loop: launcher and faults in turn until training ended (bounded)."""
    started = time.monotonic()
    launcher.start_all()
    watch = ExitWatch(launcher, result)
    slow = []  # the loop's turns that took long: the faults' timing is only as good
    try:
        while not launcher.finished and not launcher.aborted:
            turn = time.monotonic()
            launcher.step()
            driver.step()
            watch.step(driver)
            if time.monotonic() - started > TRIAL_BOUND:
                result.hangs += 1
                result.violations.append(
                    f"training did not end within the trial's bound of {TRIAL_BOUND:.0f}s: "
                    f"{launcher.state()}; faults {[f.state for f in driver.faults]}"
                )
                launcher.dump_stacks()
                break
            if watch.stalled:
                break
            took = time.monotonic() - turn
            if took > 0.25:
                slow.append(round(took, 2))
            time.sleep(POLL)
    finally:
        if slow:
            result.notes["slow_harness_turns_s"] = sorted(slow)[-5:]
        driver.step()
        driver.finish()
        if launcher.aborted:
            result.violations.append(f"the launcher gave up: {launcher.aborted}")
        watch.finish()
        launcher.stop()


class ExitWatch:
    """Bounded waits on the processes: a notice leads to an exit with 42 within its
    bound; the coordinator never falls silent; a process that overstays is dumped."""

    def __init__(self, launcher: Launcher, result: TrialResult):
        self.launcher = launcher
        self.result = result
        self.overdue: set = set()
        self.stalled = False

    def step(self, driver: FaultDriver) -> None:
        now = time.time()
        for inc in self.launcher.incarnations():
            if not inc.alive or inc.name in self.overdue:
                continue
            if inc.up_at is None and not inc.signals and now - inc.started > START_BOUND:
                what = "restore its checkpoint" if inc.role == "coordinator" else "serve"
                self._overdue(inc, f"did not {what} within {START_BOUND:.0f}s of its start")
                continue
            terms = inc.signalled("SIGTERM")
            if not terms:
                continue
            bound = COORDINATOR_EXIT_BOUND if inc.role == "coordinator" else SERVER_EXIT_BOUND
            if now - terms[0] > bound + self._paused(inc, terms[0], driver):
                self._overdue(
                    inc,
                    f"still running {bound:.0f}s after its SIGTERM (a notice leads to an "
                    f"exit with {RESTART_CODE} within that bound)",
                )
        coordinator = self.launcher.current("coordinator")
        if coordinator.alive and coordinator.up_at is not None and not self.stalled:
            quiet = now - coordinator.last_line_at()
            at_gate = driver.holding is not None or any(
                f.state == "armed" and f.fire_at is not None for f in driver.faults
            )
            paused = any(
                f.signal == "SIGSTOP" and f.fired_at is not None and f.continued_at is None
                for f in driver.faults
            )
            if quiet > STALL_BOUND and not at_gate and not paused:
                self.stalled = True
                self.result.hangs += 1
                self.result.violations.append(
                    f"{coordinator.name} printed nothing for {STALL_BOUND:.0f}s "
                    f"(last: {coordinator.events()[-1:]}); every process's stacks dumped"
                )
                self.launcher.dump_stacks()

    def _overdue(self, inc: Incarnation, what: str) -> None:
        """A bound ran out: the stacks are dumped, then the process is killed (the
        launcher restarts it)."""
        self.overdue.add(inc.name)
        self.result.hangs += 1
        self.result.violations.append(f"{inc.name} {what}; stacks in {inc.stderr}")
        self.launcher.dump_stacks([inc])
        inc.kill()

    @staticmethod
    def _paused(inc: Incarnation, since: float, driver: FaultDriver) -> float:
        """Seconds the trial itself kept ``inc`` stopped after ``since``."""
        return sum(
            f.stop_s
            for f in driver.faults
            if f.target is inc and f.signal == "SIGSTOP" and (f.fired_at or 0) >= since - 60
        )

    def finish(self) -> None:
        """Nothing may be left: after the launcher's stop, no process of the trial runs."""
        self.launcher.stop()
        left = self.launcher.leftovers()
        if left:
            self.result.violations.append(f"processes left behind in the trial's folder: {left}")
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
