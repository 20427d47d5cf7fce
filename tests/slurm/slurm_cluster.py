"""A real one-node SLURM for the tests: installed with apt-get when missing, configured
in a temporary folder, its daemons (munged, slurmctld, slurmd) started as root and
stopped whatever happens.

Debian 12 ships SLURM 22.05 (``slurm-wlm``) and MUNGE 0.5.15 (``munge``). The node is
this machine (``hostname -s``, every CPU), with no cgroups (``proctrack/linuxproc``,
``task/none``) and no accounting database (no ``sacct``: jobs are read with
``scontrol show job``). Two partitions share the node: ``low`` (the default,
``PriorityTier=1``, ``PreemptMode=REQUEUE``, ``GraceTime`` :data:`GRACE_TIME`) and
``high`` (``PriorityTier=10``), so that a ``high`` job needing every CPU preempts a
``low`` one. ``cred_expire`` is short (:data:`CRED_EXPIRE`): it is also how long a
requeued job waits before it may run again (120 s by default).

Every daemon uses its own socket, ports, state and spool folders (nothing under
/etc, /run or /var is touched apart from the packages themselves), so a system SLURM
or MUNGE on the same machine is left alone.

``python tests/slurm/slurm_cluster.py`` starts one and keeps it up until Ctrl-C
(prints ``export SLURM_CONF=...`` for a shell).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from integration.mwms_worker import free_ports

PACKAGES = ("slurm-wlm", "munge")
DAEMONS = ("munged", "slurmctld", "slurmd")
#: Seconds a preempted low job keeps running (the partition's GraceTime). Both
#: handlers (ours and TensorFlow's) save and exit inside it on an idle machine in a few
#: seconds; under ``make test``'s load TensorFlow's once took over 20 s (the value this
#: had), and SLURM then requeued the job the baseline test expects to end FAILED.
GRACE_TIME = 60
#: Seconds between SIGTERM and SIGKILL when a job is cancelled or ends its grace.
KILL_WAIT = 10
#: Credential lifetime: how long a requeued job waits before it may start again.
CRED_EXPIRE = 5
#: Bounds: installing the packages, the daemons becoming ready.
INSTALL_TIMEOUT = 300.0
START_TIMEOUT = 60.0


class Unavailable(Exception):
    """SLURM cannot be installed or started here; the message is one line."""


def _run(cmd: list, timeout: float, env: Optional[dict] = None, check: bool = True) -> str:
    try:
        out = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired as e:
        raise Unavailable(f"{' '.join(cmd)} did not finish within {timeout:g} s") from e
    if check and out.returncode != 0:
        msg = (out.stderr or out.stdout).strip().splitlines()
        raise Unavailable(
            f"{' '.join(cmd)} exited {out.returncode}: {msg[-1] if msg else 'no output'}"
        )
    return out.stdout


def missing_programs() -> list:
    return [
        p
        for p in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
        if not shutil.which(p, path=_path())
    ]


def _path() -> str:
    return os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin"


def ensure_installed(timeout: float = INSTALL_TIMEOUT) -> str:
    """Installs ``slurm-wlm`` and ``munge`` with apt-get when a program is missing.

    Returns how it went (one line). Raises :class:`Unavailable` (one line) when they
    are missing and cannot be installed: not root, no apt-get, no network.
    """
    missing = missing_programs()
    if not missing:
        return "SLURM and MUNGE already installed"
    if os.geteuid() != 0:
        raise Unavailable(
            f"SLURM is not installed ({', '.join(missing)} missing) and this is not root: "
            f"run `sudo apt-get install -y {' '.join(PACKAGES)}` first"
        )
    if shutil.which("apt-get") is None:
        raise Unavailable(
            f"SLURM is not installed ({', '.join(missing)} missing) and there is no apt-get"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    start = time.monotonic()
    _run(["apt-get", "update", "-qq"], timeout, env)
    left = max(30.0, timeout - (time.monotonic() - start))
    _run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES], left, env)
    if missing_programs():
        raise Unavailable(
            f"apt-get installed {PACKAGES} but {missing_programs()} are still missing"
        )
    return f"installed {' '.join(PACKAGES)} with apt-get in {time.monotonic() - start:.0f} s"


def versions() -> dict:
    """Installed package versions (dpkg), e.g. ``{"slurm-wlm": "22.05.8-4+deb12u3"}``."""
    found = {}
    for pkg in ("slurm-wlm", "slurmctld", "slurmd", "slurm-client", "munge"):
        try:
            out = subprocess.run(
                ["dpkg-query", "-W", "-f", "${Version}", pkg],
                capture_output=True,
                text=True,
                timeout=10,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout:
            found[pkg] = out.stdout.strip()
    return found


def parse_job(text: str) -> dict:
    """``scontrol show job -o`` output (one line) as a dict of its ``Key=Value`` fields."""
    fields = {}
    # Values may contain spaces only in a few fields (Command, WorkDir, Comment...);
    # split on " Key=" boundaries.
    for m in re.finditer(r"(?:^|\s)([A-Za-z:/]+)=(.*?)(?=\s[A-Za-z:/]+=|$)", text.strip()):
        fields[m.group(1)] = m.group(2)
    return fields


class SlurmCluster:
    """One node's SLURM in ``root`` (a folder this object owns)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.host = socket.gethostname().split(".")[0]
        self.cpus = os.cpu_count() or 1
        self.conf = self.root / "etc" / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.procs: dict = {}
        self.logs = {
            "munged": self.root / "log" / "munged.log",
            "slurmctld": self.root / "log" / "slurmctld.log",
            "slurmd": self.root / "log" / "slurmd.log",
        }
        self.started_at: Optional[float] = None

    # ------------------------------------------------------------ setup

    @property
    def env(self) -> dict:
        """The environment a client (sbatch, scontrol, a job) needs."""
        env = dict(os.environ)
        env["SLURM_CONF"] = str(self.conf)
        env["PATH"] = _path()
        return env

    def write_config(self) -> None:
        for d in ("etc", "munge", "log", "state", "spool", "run", "jobs"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(key, 0o400)
        ctld_port, slurmd_port = free_ports(2)
        r = self.root
        on = f"Nodes={self.host} MaxTime=INFINITE State=UP"
        partitions = (
            f"PartitionName=low {on} Default=YES PriorityTier=1 PreemptMode=REQUEUE "
            f"GraceTime={GRACE_TIME}\n"
            f"PartitionName=high {on} PriorityTier=10 PreemptMode=OFF"
        )
        self.conf.write_text(
            f"""# Written by tests/slurm/slurm_cluster.py: one node, no cgroups, no accounting.
ClusterName=tfh
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire={CRED_EXPIRE}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={self.logs["slurmctld"]}
SlurmdLogFile={self.logs["slurmd"]}
SlurmctldDebug=debug2
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
KillWait={KILL_WAIT}
MinJobAge=600
InactiveLimit=0
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
{partitions}
"""
        )

    def start(self, timeout: float = START_TIMEOUT) -> None:
        """Starts munged, slurmctld and slurmd in the foreground (children of this
        process) and waits, bounded, until the node is idle. Raises
        :class:`Unavailable` with the daemons' logs on failure."""
        self.write_config()
        r = self.root
        commands = {
            "munged": [
                "munged",
                "--foreground",
                "--force",
                f"--socket={self.munge_socket}",
                f"--key-file={r}/munge/munge.key",
                f"--pid-file={r}/run/munged.pid",
                f"--log-file={self.logs['munged']}",
                f"--seed-file={r}/munge/munged.seed",
            ],
            "slurmctld": ["slurmctld", "-D", "-i", "-f", str(self.conf)],
            "slurmd": ["slurmd", "-D", "-f", str(self.conf), "-N", self.host],
        }
        end = time.monotonic() + timeout
        for name in DAEMONS:
            out = open(r / "log" / f"{name}.out", "wb")
            try:
                self.procs[name] = subprocess.Popen(
                    commands[name],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env,
                    start_new_session=True,
                )
            except OSError as e:
                raise Unavailable(f"cannot start {name}: {e}") from e
            finally:
                out.close()
            if name == "munged":
                self._wait(lambda: self.munge_socket.exists(), end, "munged's socket")
            elif name == "slurmctld":
                self._wait(self._controller_answers, end, "slurmctld answering")
        self._wait(self._node_idle, end, "the node idle in sinfo")
        self.started_at = time.time()

    def _wait(self, ready, end: float, what: str) -> None:
        while time.monotonic() < end:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise Unavailable(f"{name} exited with {p.returncode} while waiting for {what}")
            if ready():
                return
            time.sleep(0.2)
        raise Unavailable(f"timed out waiting for {what}")

    def _controller_answers(self) -> bool:
        out = subprocess.run(
            ["scontrol", "ping"], capture_output=True, text=True, env=self.env, timeout=10
        )
        return out.returncode == 0 and "UP" in out.stdout

    def _node_idle(self) -> bool:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=10,
        )
        return out.returncode == 0 and "idle" in out.stdout.split()

    def time_limit_checks(self) -> list:
        """When slurmctld checked the time limits (Unix seconds, from its debug2 log).

        It checks every 30 s (``PERIODIC_TIMEOUT``), and sends ``--signal=SIG@N`` at
        the first check that finds at most N + 30 s left.
        """
        found = []
        text = self.logs["slurmctld"].read_text(errors="replace")
        for m in re.finditer(
            r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d+)\] debug2: Testing job time limits",
            text,
            re.MULTILINE,
        ):
            stamp = time.mktime(time.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S"))
            found.append(stamp + float("0." + m.group(2)))
        return found

    def log_tail(self, lines: int = 30) -> str:
        parts = []
        for name in DAEMONS:
            for path in (self.logs[name], self.root / "log" / f"{name}.out"):
                if path.exists():
                    text = path.read_text(errors="replace").splitlines()[-lines:]
                    if text:
                        parts.append(f"--- {path} ---\n" + "\n".join(text))
        return "\n".join(parts)

    def cancel_all(self, timeout: float = 45.0) -> None:
        """Cancels every job of this cluster and waits (bounded) until none is left, so
        that no job step outlives slurmd."""
        if not self.procs:
            return
        try:
            self.run("scancel", "--full", "--user", "root", check=False)
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                out = self.run("squeue", "-h", "-o", "%i", check=False)
                if out.returncode != 0 or not out.stdout.strip():
                    return
                time.sleep(1)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def stop(self) -> None:
        """Stops every daemon this object started (SIGTERM, then SIGKILL after 10 s)."""
        for name in reversed(DAEMONS):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for name in reversed(DAEMONS):
            p = self.procs.get(name)
            if p is None:
                continue
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(5)
        self.procs.clear()

    # ------------------------------------------------------------ clients

    def run(
        self, *cmd: str, timeout: float = 30.0, check: bool = True
    ) -> subprocess.CompletedProcess:
        out = subprocess.run(
            list(cmd), capture_output=True, text=True, env=self.env, timeout=timeout
        )
        if check and out.returncode != 0:
            said = out.stderr.strip() or out.stdout.strip()
            raise RuntimeError(f"{' '.join(cmd)} exited {out.returncode}: {said}")
        return out

    def sbatch(self, *args: str, env: Optional[dict] = None) -> str:
        """Submits a job; returns its id."""
        out = subprocess.run(
            ["sbatch", "--parsable", *args],
            capture_output=True,
            text=True,
            env=env or self.env,
            timeout=30,
        )
        if out.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict:
        """``scontrol show job -o JOB`` as a dict ({} once SLURM forgot the job)."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        if out.returncode != 0:
            return {}
        return parse_job(out.stdout)

    def wait_job(self, job_id: str, pred, timeout: float, poll: float = 1.0) -> dict:
        """Polls the job until ``pred(fields)``; raises TimeoutError with its last state."""
        end = time.monotonic() + timeout
        fields: dict = {}
        while time.monotonic() < end:
            fields = self.job(job_id)
            if pred(fields):
                return fields
            time.sleep(poll)
        raise TimeoutError(
            f"job {job_id}: condition not met within {timeout:g} s; last state "
            f"{fields.get('JobState')} reason {fields.get('Reason')} restarts "
            f"{fields.get('Restarts')}\n{self.log_tail(15)}"
        )


def _main() -> int:
    print(ensure_installed(), versions())
    root = Path(tempfile.mkdtemp(prefix="tfh-slurm-"))
    cluster = SlurmCluster(root)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        cluster.start()
        print(f"export SLURM_CONF={cluster.conf}   # up; Ctrl-C stops it", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    except Unavailable as e:
        print(f"SLURM unavailable: {e}\n{cluster.log_tail()}", file=sys.stderr)
        return 1
    finally:
        cluster.cancel_all()
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
