"""Real SLURM jobs (``examples/slurm``) that end by a time limit, a preemption or a
user's ``scancel``, with our handler and, as the baseline, TensorFlow's.

Each test states the outcome that counts. Exit codes come from the training's own
``EVENT exit`` line and ``scontrol show job`` (no ``sacct``: there is no accounting
database); saved steps and times from the preemption records. The bounds only turn
a hang into a failure.

Time limits: slurmctld checks them every 30 s and sends ``--signal=SIG@N`` at the first
check that finds at most N + 30 s left. A SIGUSR1 that comes before the handler is built
kills the process (SIGUSR1's default action), and how long TensorFlow and a 2-worker
MultiWorkerMirroredStrategy take to start depends on the machine's load: a two-minute
job submitted at a known phase of the checks (the signal about 93 s after its start)
once ended FAILED on CI, task 0 killed by signal 10 93 s after its start, most likely
before it had built the handler (the job's output was not kept). So the time-limit tests
of our handler give the job :data:`RERUN_LIMIT` minutes and shorten the limit only once
every task's handler has read the job (:func:`warn_once_ready`): the warning then comes
after the handler exists, whatever the load, and the handler's deadline is the job's end
as the warning's own read of the job shows it (the limit moved since the start's read).
The requeued run is not signalled either: once the first run has requeued the job, the
test gives the job :data:`RERUN_LIMIT` again (:func:`extend_requeued`), so what the test
checks (one save, the requeue, the resume at the saved step, the end) does not depend on
how fast the machine is. CI's loaded machine showed four minutes too few for a requeued
two-task run, and a preempted job's five minutes too few as well (its requeued run got
the sbatch file's warning): :data:`RERUN_LIMIT` and :data:`PREEMPTED_JOB_TIME` are ten.
A warning that comes while a finished run exits no longer fails the job either: the
handler ignores SIGUSR1 from the exit on (``tests/unit/test_signal_ownership.py``).
TensorFlow's baseline, which dies of the warning at any time, is submitted at a known
phase of the checks (:func:`submit_aligned`).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from integration.mwms_worker import free_ports

from .conftest import EXAMPLES, SCENARIOS, TRAIN, parse_events, read_records
from .slurm_cluster import CRED_EXPIRE, GRACE_TIME, INSTALL_TIMEOUT, KILL_WAIT, START_TIMEOUT

PYTHON = str(Path(os.environ.get("VIRTUAL_ENV", "")) / "bin" / "python")
if not os.path.exists(PYTHON):
    import sys

    PYTHON = sys.executable

#: A two-minute job signalled when at most 1 + 30 s are left.
LIMIT, LEAD = 120, 1
#: Seconds from the start of the job to the check that signals it (the check comes
#: when at most LEAD + 30 s are left; 3 s of margin).
SIGNAL_AT = LIMIT - LEAD - 30 + 4
#: Seconds from sbatch to the job's start (sched/builtin, sched_interval=2).
START_DELAY = 1.3
#: 0.1 s steps (~10 a second) for the preemption and scancel jobs: enough to be under
#: way when the test acts.
STEPS, STEP_TIME = 380, 0.1
#: The preempted batch-step job gets its SIGTERM only when GraceTime ends: it must still
#: be running then (at most 10 steps a second, ~20 steps done when the test preempts it).
BATCH_PREEMPT_STEPS = STEPS + int(GRACE_TIME / STEP_TIME)
#: The time-limit jobs: the first run cannot finish them before the warning. At 10
#: steps a second at most, it makes fewer than 1,300 steps before it: those until the
#: limit is shortened (the handler's read of the job, at most JOB_READ_BOUND after the
#: first progress line) and the at most WARN_MARGIN + 60 s after that
#: (:func:`warn_once_ready`; TF's baseline: the signal ~93 s after the start). The
#: requeued run does the rest.
LIMIT_STEPS = 1500
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")

# The bounds of the tests' waits, each turning a hang into a failure with a message.
#: :func:`submit_aligned`: slurmctld's first logged time-limit check, then the sleep to
#: the right phase of the 30 s checks.
CHECK_LOGGED_BOUND, ALIGN_BOUND = 45, 45 + 31
#: A job that ends by a time limit or a preemption, from submission to its last run's
#: end: room for three runs, each with SLURM's kill wait and the requeue's wait (the
#: time-limit tests need two: :func:`extend_requeued`).
RUNS_BOUND = 3 * (LIMIT + KILL_WAIT + CRED_EXPIRE + 10)
#: A job's first 20 steps (one task; two tasks start two TensorFlow workers).
PROGRESS_BOUND, PROGRESS_BOUND_2 = 90, 150
#: How long a requeue takes to show (cred_expire + a scheduling pass).
REQUEUE_SHOWS = 8
#: The time limit of a requeued time-limit job (minutes, :func:`extend_requeued`), and
#: the bound on the first run's end (its limit, SLURM's kill wait, the requeue). Ten
#: minutes: the sbatch files' ``--signal=USR1@120`` (or the test's ``@1``) comes at
#: least 7.5 minutes into the run, long after a requeued run on CI's loaded machine ends.
#: With four, CI's requeued two-task run was still in it when the warning came.
RERUN_LIMIT, FIRST_RUN_BOUND = 10, LIMIT + KILL_WAIT + CRED_EXPIRE + 10
#: The time limit of the preempted jobs: their runs end by the preemption or by
#: finishing, never by the sbatch files' time-limit warning (``--signal=USR1@120``,
#: at least 7.5 minutes into a run). With five minutes the warning came 150 s into
#: the requeued run, and on CI's loaded machine the two-task run was not done by then
#: (the job ended FAILED, exit 138: SIGUSR1's default action).
PREEMPTED_JOB_TIME = "--time=10"
#: Bound on ``scontrol update`` being accepted while the requeued job settles.
UPDATE_BOUND = 30
#: :func:`warn_once_ready`: the least time left, beyond the warning's LEAD + 30 s, once
#: the limit is shortened (the update lands before the check that warns).
WARN_MARGIN = 10
#: Bound on a time-limit job's first progress line from its submission (TensorFlow and,
#: with two tasks, MultiWorkerMirroredStrategy starting on a loaded machine).
READY_BOUND = 300


def backstop(*waits: float):
    """pytest-timeout's mark for a test whose waits are ``waits`` in sequence: their
    sum, plus the session fixture's bounds (apt-get install and start, paid by the
    first test; stop, by the last), plus a margin for the commands between them. The
    test's own bounds decide: this only turns a hang between them into a failure
    (the suite's default, 300 s, cut off a time-limit job that its bounds allowed)."""
    return pytest.mark.timeout(INSTALL_TIMEOUT + START_TIMEOUT + sum(waits) + 120)


def submit(slurm, script: str, tmp_path: Path, sbatch_args, train_args: str, **env) -> tuple:
    ckpt, out = tmp_path / "ckpt", tmp_path / "job.out"
    job_env = dict(
        slurm.env,
        PYTHON=PYTHON,
        TRAIN=str(TRAIN),
        CKPT_DIR=str(ckpt),
        TRAIN_ARGS=train_args,
        PYTHONUNBUFFERED="1",
        TF_CPP_MIN_LOG_LEVEL="2",
        TF_FAILURE_HANDLING_CLOUD="none",
        **env,
    )
    jid = slurm.sbatch(
        f"--output={out}", f"--chdir={tmp_path}", *sbatch_args, str(EXAMPLES / script), env=job_env
    )
    return jid, ckpt, out


def submit_aligned(slurm, script, tmp_path, sbatch_args, train_args, **env):
    """Submits so that the job starts SIGNAL_AT s before a time-limit check."""
    checks = []
    end = time.monotonic() + CHECK_LOGGED_BOUND
    while not checks and time.monotonic() < end:
        checks = slurm.time_limit_checks()
        if not checks:
            time.sleep(1)
    assert checks, f"slurmctld logged no time-limit check within {CHECK_LOGGED_BOUND} s"
    last = checks[-1]
    now = time.time()
    target = last + 30
    while target - SIGNAL_AT - START_DELAY < now + 0.5:
        target += 30
    time.sleep(target - SIGNAL_AT - START_DELAY - now)
    return submit(slurm, script, tmp_path, sbatch_args, train_args, **env)


def wait_events(out: Path, pred, timeout: float) -> list:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        events = parse_events(out)
        if any(pred(e) for e in events):
            return events
        time.sleep(0.5)
    tail = out.read_text(errors="replace")[-3000:] if out.exists() else "(no output)"
    raise TimeoutError(f"no such event within {timeout:g} s in {out}:\n{tail}")


#: Bound on the handler's read of the job's limits (three ``scontrol`` calls), from the
#: training's progress on.
JOB_READ_BOUND = 60
#: What the handler logs once its daemon thread has read the job's limits (``slurm.JobInfo``).
JOB_READ = re.compile(r"SLURM job \d+ read: ")


def wait_job_read(out: Path, tasks: int = 1) -> None:
    """Waits until every task's handler has read the job's limits (``KillWait``,
    ``GraceTime``): until then a SIGTERM carries no deadline (docs/getting-started/
    slurm.md), so a test that checks the deadline signals only after this."""
    end = time.monotonic() + JOB_READ_BOUND
    while time.monotonic() < end:
        text = out.read_text(errors="replace") if out.exists() else ""
        if len(JOB_READ.findall(text)) >= tasks:
            return
        time.sleep(0.5)
    raise TimeoutError(
        f"the job's limits were not read by {tasks} task(s) within {JOB_READ_BOUND:g} s"
    )


def by(events, name):
    return [e for e in events if e["event"] == name]


def stage(records, name):
    return [r for r in records if r["stage"] == name]


def report(scenario: str, **row) -> None:
    """Prints the scenario's outcome and keeps it for the table ``make figures``
    writes (``conftest.write_scenarios``)."""
    print(f"\nSCENARIO {scenario}: " + ", ".join(f"{k}={v}" for k, v in row.items()))
    SCENARIOS.append((scenario, row))


def preempt(slurm, tmp_path: Path) -> tuple:
    """Submits a job to the ``high`` partition that needs every CPU of the node;
    returns its id and when it was submitted."""
    high = slurm.sbatch(
        "-p",
        "high",
        f"--cpus-per-task={slurm.cpus}",
        f"--output={tmp_path}/high.out",
        "--wrap",
        "sleep 2",
    )
    return high, time.time()


def submit_two_tasks(slurm, tmp_path: Path, sbatch_args, train_args: str):
    """``multi_node.sbatch`` with 2 tasks (``srun``, MultiWorkerMirroredStrategy
    through TF's SlurmClusterResolver)."""
    return submit(
        slurm,
        "multi_node.sbatch",
        tmp_path,
        ["--ntasks=2", *sbatch_args],
        # SlurmClusterResolver gives task i the port base + i.
        f"{train_args} --port-base {free_ports(2)[0]}",
    )


def check_one_agreed_step_per_run(events, records) -> None:
    """Both tasks of every run that ended by a notice exited 42 at one step, and one
    task wrote the requeue line of each preemption."""
    by_run: dict = {}
    for e in by(events, "exit"):
        by_run.setdefault(e["restart"], []).append(e)
    for run, exits in by_run.items():
        assert sorted(e["task"] for e in exits) == [0, 1], (run, exits)
        assert len({e["step"] for e in exits}) == 1, (run, exits)
        assert {e["code"] for e in exits} == {42}, (run, exits)
    ids = [r.get("preemption") for r in stage(records, "requeue")]
    assert len(ids) == len(set(ids)), records


def set_time_limit(slurm, jid: str, minutes: int, when: str) -> None:
    """``scontrol update JobId=jid TimeLimit=minutes``, again while the controller
    refuses it (a job that is settling), within :data:`UPDATE_BOUND`."""
    end = time.monotonic() + UPDATE_BOUND
    while True:
        done = slurm.run("scontrol", "update", f"JobId={jid}", f"TimeLimit={minutes}", check=False)
        if done.returncode == 0:
            return
        if time.monotonic() >= end:
            said = (done.stderr or done.stdout).strip()
            raise AssertionError(
                f"scontrol update JobId={jid} TimeLimit={minutes} refused for "
                f"{UPDATE_BOUND} s {when}: {said}"
            )
        time.sleep(0.5)


def extend_requeued(slurm, jid: str, out: Path) -> None:
    """Waits for the first run's requeue (``Restarts`` >= 1), then sets the job's time
    limit to :data:`RERUN_LIMIT` minutes, so that the requeued run ends by finishing
    and not by a second signal (see the module docstring). A first run that does not
    requeue fails with the job's runs and output (:func:`explain`) first."""
    try:
        slurm.wait_job(jid, lambda j: j.get("Restarts", "0") != "0", FIRST_RUN_BOUND)
    except TimeoutError as e:
        raise AssertionError(f"{explain(slurm, slurm.job(jid), out)}\n{e}") from None
    set_time_limit(slurm, jid, RERUN_LIMIT, "after the requeue")


def run_seconds(text: str) -> int:
    """``scontrol``'s ``RunTime`` (``[D-]HH:MM:SS``) in seconds."""
    days, _, clock = text.rpartition("-")
    hours, minutes, seconds = (int(x) for x in clock.split(":"))
    return (int(days) if days else 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def warn_once_ready(slurm, jid: str, out: Path, tasks: int) -> None:
    """Once the training is under way and every task's handler has read the job,
    shortens the job's time limit (submitted at :data:`RERUN_LIMIT` minutes) to the
    first whole minute that leaves at least LEAD + 30 + :data:`WARN_MARGIN` s: the
    check that finds at most LEAD + 30 s left, and with it the warning, comes at most
    :data:`WARN_MARGIN` + 60 s later, after the handler exists whatever the load."""
    wait_events(out, lambda e: e["event"] == "progress", READY_BOUND)
    wait_job_read(out, tasks)
    ran = run_seconds(slurm.job(jid)["RunTime"])
    minutes = -(-(ran + LEAD + 30 + WARN_MARGIN) // 60)
    set_time_limit(slurm, jid, minutes, f"at {ran} s into the first run")


def runs_summary(out: Path) -> str:
    """A line per run and task from the ``EVENT`` lines: when it started and at which
    step, its last progress step and time, and how it ended (``done``, ``exit`` with its
    code) or that it printed no end. It comes first in a failure's message: CI shows
    only the start of a long one."""
    rows: dict = {}
    for e in parse_events(out):
        row = rows.setdefault((e.get("restart"), e.get("task")), {})
        kind = e["event"]
        if kind == "start":
            row["start"] = f"started {e['time']:.1f} at step {e.get('step')}"
        elif kind == "progress":
            row["progress"] = f"last progress step {e.get('step')} at {e['time']:.1f}"
        elif kind == "done":
            row["end"] = f"done at step {e.get('step')} at {e['time']:.1f}"
        elif kind == "exit":
            row["end"] = f"exit {e.get('code')} at step {e.get('step')} at {e['time']:.1f}"
    if not rows:
        return "(no EVENT lines)"
    lines = []
    for (restart, task), row in sorted(rows.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
        parts = [row.get("start", "no start line"), row.get("progress", "no progress line")]
        parts.append(row.get("end", "no end line (killed, or still running)"))
        lines.append(f"run {restart} task {task}: " + "; ".join(parts))
    return "\n".join(lines)


def explain(slurm, job: dict, out: Path) -> str:
    """What a failed check prints: the job's state as scontrol shows it, a line per run
    and task (:func:`runs_summary`), slurmctld's lines about the job, and the job's
    output without its progress lines (the last run's first when it is long)."""
    keys = (
        "JobState",
        "Reason",
        "ExitCode",
        "Restarts",
        "RunTime",
        "TimeLimit",
        "StartTime",
        "EndTime",
    )
    shown = ", ".join(f"{k}={job.get(k)}" for k in keys)
    lines = out.read_text(errors="replace").splitlines() if out.exists() else ["(no output)"]
    kept = [
        line
        for line in lines
        if '"progress"' not in line and "oneDNN" not in line and "cuda" not in line.lower()
    ]
    ctld = slurm.logs["slurmctld"]
    jid = job.get("JobId", "?")
    mentions = re.compile(rf"\b(JobId=|job ){re.escape(str(jid))}\b", re.IGNORECASE)
    about = [
        line
        for line in (ctld.read_text(errors="replace").splitlines() if ctld.exists() else [])
        if mentions.search(line)
    ]
    return (
        f"job {jid}: {shown}\n--- runs ---\n{runs_summary(out)}"
        + "\n--- slurmctld about the job ---\n"
        + "\n".join(about[-40:])
        + f"\n--- {out} (no progress lines) ---\n"
        + "\n".join(kept[-80:])
    )


def check_saved_requeued_resumed_finished(slurm, jid, ckpt, out, reason: str, steps=None):
    """The outcome that counts for a time limit or a preemption: the first run saved
    at one step and exited 42, the job went back to the queue (same id,
    Restarts >= 1), the next run resumed at that step, and the last run finished."""
    job = slurm.wait_job(
        jid, lambda j: j.get("JobState") in TERMINAL and j.get("Restarts", "0") != "0", RUNS_BOUND
    )
    events, records = parse_events(out), read_records(ckpt)
    starts, exits, done = by(events, "start"), by(events, "exit"), by(events, "done")
    assert job["JobState"] == "COMPLETED", explain(slurm, job, out)
    assert done and done[-1]["step"] == (steps or STEPS), explain(slurm, job, out)
    assert exits and exits[0]["code"] == 42 and exits[0]["restart"] == 0, events
    saved = exits[0]["step"]
    requeues = stage(records, "requeue")
    assert requeues and requeues[0]["requeued"] is True, (requeues, explain(slurm, job, out))
    assert requeues[0]["reason"].startswith(reason), requeues
    assert requeues[0]["job_id"] == jid
    resumed = [s for s in starts if s["restart"] >= 1]
    assert resumed and resumed[0]["step"] == saved, (saved, starts)
    assert stage(records, "save_start")[0]["step"] == saved
    notice = stage(records, "notice")[0]
    save_end = stage(records, "save_end")[0]
    return {
        "exit_codes": [e["code"] for e in exits] + [0],
        "saved_step": saved,
        "resumed_step": resumed[0]["step"],
        "requeued": True,
        "restarts": job.get("Restarts"),
        "signal_to_checkpoint_s": round(save_end["time"] - notice["time"], 3),
        "source": notice.get("source"),
        "deadline_left_s": (
            None if notice.get("deadline") is None else round(notice["deadline"] - notice["time"])
        ),
        "exit_to_rerun_s": round(resumed[0]["time"] - exits[0]["time"], 1),
    }


@backstop(READY_BOUND, JOB_READ_BOUND, UPDATE_BOUND, FIRST_RUN_BOUND, UPDATE_BOUND, RUNS_BOUND)
def test_time_limit_one_task_saves_requeues_resumes_and_finishes(slurm, tmp_path):
    # one_node.sbatch execs the training: --signal=B:USR1 reaches it.
    jid, ckpt, out = submit(
        slurm,
        "one_node.sbatch",
        tmp_path,
        [f"--time={RERUN_LIMIT}", f"--signal=B:USR1@{LEAD}"],
        f"--steps {LIMIT_STEPS} --step-time {STEP_TIME}",
    )
    warn_once_ready(slurm, jid, out, tasks=1)
    extend_requeued(slurm, jid, out)
    row = check_saved_requeued_resumed_finished(
        slurm, jid, ckpt, out, "time limit", steps=LIMIT_STEPS
    )
    assert row["source"] == "signal SIGUSR1"
    # SLURM 22.05 has no SLURM_JOB_END_TIME: the deadline is scontrol's EndTime.
    assert row["deadline_left_s"] is not None and 0 < row["deadline_left_s"] <= LEAD + 31
    report("time limit, 1 task, ours", **row)


@backstop(ALIGN_BOUND, LIMIT + 120)
def test_time_limit_one_task_tf_handler_baseline(slurm, tmp_path):
    # TensorFlow's handler does not catch SIGUSR1: the process dies of it, unsaved.
    jid, ckpt, out = submit_aligned(
        slurm,
        "one_node.sbatch",
        tmp_path,
        [f"--time={LIMIT // 60}", f"--signal=B:USR1@{LEAD}"],
        f"--steps {LIMIT_STEPS} --step-time {STEP_TIME} --impl tf",
    )
    job = slurm.wait_job(jid, lambda j: j.get("JobState") in TERMINAL, LIMIT + 120)
    events = parse_events(out)
    assert job["ExitCode"] == "0:10", job  # killed by signal 10 (SIGUSR1)
    assert job["Restarts"] == "0" and job["JobState"] == "FAILED"
    assert not by(events, "exit") and not by(events, "done")
    assert not list(ckpt.glob("ckpt-*.index")) if ckpt.exists() else True
    report(
        "time limit, 1 task, TF's handler",
        exit_codes=[job["ExitCode"]],
        saved_step=None,
        resumed_step=None,
        requeued=False,
        last_step=max((e["step"] for e in by(events, "progress")), default=None),
    )


@backstop(PROGRESS_BOUND, JOB_READ_BOUND, KILL_WAIT + 60, REQUEUE_SHOWS)
@pytest.mark.parametrize("how", ["scancel --full --signal=TERM", "scancel"])
def test_scancel_saves_exits_42_and_is_not_requeued(slurm, tmp_path, how):
    jid, ckpt, out = submit(
        slurm,
        "one_node.sbatch",
        tmp_path,
        ["--time=5"],
        f"--steps 100000 --step-time {STEP_TIME}",
    )
    wait_events(out, lambda e: e["event"] == "progress" and e["step"] >= 20, PROGRESS_BOUND)
    wait_job_read(out)
    sent = time.time()
    # --full: the batch step is the training (exec); without it only srun steps get it.
    slurm.run(*how.split(), jid)
    job = slurm.wait_job(jid, lambda j: j.get("JobState") in TERMINAL, KILL_WAIT + 60)
    time.sleep(REQUEUE_SHOWS)  # a requeue would show by then
    job = slurm.job(jid)
    events, records = parse_events(out), read_records(ckpt)
    exits = by(events, "exit")
    assert exits and exits[0]["code"] == 42, events
    assert job["Restarts"] == "0" and job["JobState"] in ("FAILED", "CANCELLED"), job
    requeues = stage(records, "requeue")
    assert requeues and requeues[0]["requeued"] is False, records
    assert len(by(events, "start")) == 1
    save_end = stage(records, "save_end")[0]
    notice = stage(records, "notice")[0]
    assert 0 < notice["deadline"] - notice["time"] <= KILL_WAIT, notice
    report(
        f"{how}, 1 task, ours",
        exit_codes=[42],
        job_state=job["JobState"],
        job_exit=job["ExitCode"],
        saved_step=exits[0]["step"],
        requeued=False,
        signal_to_checkpoint_s=round(save_end["time"] - notice["time"], 3),
        scancel_to_checkpoint_s=round(save_end["time"] - sent, 3),
    )


#: The grace period of the USR1-then-TERM job: far longer than SLURM's kill wait after
#: the TERM, so a handler that ignored the TERM would be killed before its final save.
USR1_GRACE = 300


@backstop(PROGRESS_BOUND, JOB_READ_BOUND, PROGRESS_BOUND, KILL_WAIT + 60)
def test_usr1_then_term_the_final_save_moves_before_the_kill(slurm, tmp_path):
    """``--signal``'s SIGUSR1 (sent by hand) with a grace period of 300 s: the job saves
    once and trains on. Then ``scancel``'s SIGTERM: SLURM kills the job KillWait seconds
    later. Success: the SIGTERM is a tighter notice (recorded as a re-plan with a deadline
    within KillWait), the final round is saved and the training exits 42 before the kill,
    two saves in all. TensorFlow, and this handler before, planned for the first notice
    only and were killed. ``--no-requeue``: this test is about the deadlines."""
    jid, ckpt, out = submit(
        slurm,
        "one_node.sbatch",
        tmp_path,
        ["--time=10", "--no-requeue"],
        f"--steps 100000 --step-time {STEP_TIME} --grace {USR1_GRACE}",
    )
    wait_events(out, lambda e: e["event"] == "progress" and e["step"] >= 20, PROGRESS_BOUND)
    wait_job_read(out)
    slurm.run("scancel", "--full", "--signal=USR1", jid)
    end = time.monotonic() + PROGRESS_BOUND
    while not stage(read_records(ckpt), "save_end") and time.monotonic() < end:
        time.sleep(0.5)
    assert stage(read_records(ckpt), "save_end"), "no first save after SIGUSR1"
    sent = time.time()
    slurm.run("scancel", jid)
    job = slurm.wait_job(jid, lambda j: j.get("JobState") in TERMINAL, KILL_WAIT + 60)
    events, records = parse_events(out), read_records(ckpt)
    exits = by(events, "exit")
    assert exits and exits[0]["code"] == 42, (job, events[-5:])
    notices = stage(records, "notice")
    assert notices[0]["source"] == "signal SIGUSR1", notices
    replans = [n for n in notices if n.get("replan")]
    assert replans and replans[0]["source"] == "signal SIGTERM", notices
    term_deadline = replans[0]["deadline"]
    assert 0 < term_deadline - sent <= KILL_WAIT + 1, (sent, replans)
    saves = stage(records, "save_end")
    assert len(saves) == 2, records
    assert saves[1]["time"] < term_deadline, (saves, term_deadline)
    report(
        "SIGUSR1 (grace 300 s) then scancel, 1 task, ours",
        exit_codes=[42],
        saved_step=exits[0]["step"],
        requeued=False,
        signal_to_checkpoint_s=round(saves[1]["time"] - replans[0]["time"], 3),
        deadline_left_s=round(term_deadline - replans[0]["time"]),
    )


@backstop(PROGRESS_BOUND, JOB_READ_BOUND, RUNS_BOUND)
def test_preemption_one_task_saves_requeues_resumes_and_finishes(slurm, tmp_path):
    # A batch step gets SIGTERM only when GraceTime ends; SLURM requeues a job that
    # is still running then, but ours saves and exits at once: it requeues itself.
    jid, ckpt, out = submit(
        slurm,
        "one_node.sbatch",
        tmp_path,
        [PREEMPTED_JOB_TIME],
        f"--steps {BATCH_PREEMPT_STEPS} --step-time {STEP_TIME}",
    )
    wait_events(out, lambda e: e["event"] == "progress" and e["step"] >= 20, PROGRESS_BOUND)
    wait_job_read(out)
    high, submitted = preempt(slurm, tmp_path)
    row = check_saved_requeued_resumed_finished(
        slurm, jid, ckpt, out, "preemption", steps=BATCH_PREEMPT_STEPS
    )
    assert row["source"] == "signal SIGTERM"
    assert slurm.job(high).get("JobState") == "COMPLETED"
    notice = stage(read_records(ckpt), "notice")[0]
    row["high_submit_to_notice_s"] = round(notice["time"] - submitted, 1)
    assert row["high_submit_to_notice_s"] <= GRACE_TIME + 10
    # Signalled when the grace time is over: KillWait is what is left.
    assert 0 < row["deadline_left_s"] <= KILL_WAIT, row
    report("preemption (batch step), 1 task, ours", **row)


@backstop(PROGRESS_BOUND_2, JOB_READ_BOUND, RUNS_BOUND)
def test_preemption_two_tasks_srun_saves_requeues_resumes_and_finishes(slurm, tmp_path):
    # srun tasks get SIGTERM as soon as the grace time starts: both workers agree on
    # a step, save and exit 42 well within GraceTime; SLURM alone would then mark the
    # job FAILED (it ended before the grace time did). Task 0 requeues it.
    jid, ckpt, out = submit_two_tasks(
        slurm, tmp_path, [PREEMPTED_JOB_TIME], f"--steps {STEPS} --step-time {STEP_TIME}"
    )
    wait_events(out, lambda e: e["event"] == "progress" and e["step"] >= 20, PROGRESS_BOUND_2)
    wait_job_read(out, tasks=2)
    high, submitted = preempt(slurm, tmp_path)
    row = check_saved_requeued_resumed_finished(slurm, jid, ckpt, out, "preemption")
    events, records = parse_events(out), read_records(ckpt)
    check_one_agreed_step_per_run(events, records)
    assert len(stage(records, "requeue")) == 1  # one task requeues
    assert stage(records, "requeue")[0].get("message") != "SLURM already requeued the job"
    assert sorted(e["task"] for e in by(events, "done")) == [0, 1]
    notice = stage(records, "notice")[0]
    row["high_submit_to_notice_s"] = round(notice["time"] - submitted, 1)
    assert row["high_submit_to_notice_s"] < GRACE_TIME  # at once, not at the grace's end
    # The deadline is the grace time's end (PreemptTime + GraceTime), not KillWait.
    assert KILL_WAIT < row["deadline_left_s"] <= GRACE_TIME, row
    assert slurm.job(high).get("JobState") == "COMPLETED"
    report("preemption (srun), 2 tasks MWMS, ours", **row)


# 2-task jobs: ``multi_node.sbatch`` execs ``srun``, which starts one TensorFlow worker
# per task. If a requeued run were signalled again, it would save and requeue again,
# which the checks allow.


@backstop(READY_BOUND, JOB_READ_BOUND, UPDATE_BOUND, FIRST_RUN_BOUND, UPDATE_BOUND, RUNS_BOUND)
def test_time_limit_two_tasks_srun_saves_requeues_resumes_and_finishes(slurm, tmp_path):
    # --signal=USR1@N without B: reaches every srun task (with B:, only the batch
    # shell, which is srun itself here and does not forward SIGUSR1).
    jid, ckpt, out = submit_two_tasks(
        slurm,
        tmp_path,
        [f"--time={RERUN_LIMIT}", f"--signal=USR1@{LEAD}"],
        f"--steps {LIMIT_STEPS} --step-time {STEP_TIME}",
    )
    warn_once_ready(slurm, jid, out, tasks=2)
    extend_requeued(slurm, jid, out)
    row = check_saved_requeued_resumed_finished(
        slurm, jid, ckpt, out, "time limit", steps=LIMIT_STEPS
    )
    events, records = parse_events(out), read_records(ckpt)
    check_one_agreed_step_per_run(events, records)
    assert row["source"] == "signal SIGUSR1"
    assert row["deadline_left_s"] is not None and 0 < row["deadline_left_s"] <= LEAD + 31
    assert sorted(e["task"] for e in by(events, "done")) == [0, 1]
    resumed = [r for r in stage(records, "resumed") if r.get("slurm_restart_count")]
    assert resumed and resumed[0]["slurm_job_id"] == jid, records
    report("time limit (srun), 2 tasks MWMS, ours", **row)


@backstop(PROGRESS_BOUND_2, JOB_READ_BOUND, KILL_WAIT + 60, REQUEUE_SHOWS)
def test_scancel_two_tasks_saves_exits_42_and_is_not_requeued(slurm, tmp_path):
    jid, ckpt, out = submit_two_tasks(
        slurm, tmp_path, ["--time=5"], f"--steps 100000 --step-time {STEP_TIME}"
    )
    wait_events(out, lambda e: e["event"] == "progress" and e["step"] >= 20, PROGRESS_BOUND_2)
    wait_job_read(out, tasks=2)
    slurm.run("scancel", jid)
    job = slurm.wait_job(jid, lambda j: j.get("JobState") in TERMINAL, KILL_WAIT + 60)
    time.sleep(REQUEUE_SHOWS)  # a requeue would show by then
    job = slurm.job(jid)
    events, records = parse_events(out), read_records(ckpt)
    check_one_agreed_step_per_run(events, records)
    exits = by(events, "exit")
    assert len(exits) == 2 and job["Restarts"] == "0", (exits, job)
    assert job["JobState"] in ("FAILED", "CANCELLED"), job
    requeues = stage(records, "requeue")
    assert len(requeues) == 1 and requeues[0]["requeued"] is False, records
    notice = stage(records, "notice")[0]
    assert 0 < notice["deadline"] - notice["time"] <= KILL_WAIT, notice  # KillWait
    save_end = stage(records, "save_end")[0]
    report(
        "scancel (srun), 2 tasks MWMS, ours",
        exit_codes=[42, 42],
        job_state=job["JobState"],
        saved_step=exits[0]["step"],
        requeued=False,
        signal_to_checkpoint_s=round(save_end["time"] - notice["time"], 3),
    )


@backstop(PROGRESS_BOUND_2, GRACE_TIME + 90, REQUEUE_SHOWS, 60)
def test_preemption_two_tasks_tf_handler_baseline(slurm, tmp_path):
    # TensorFlow's handler saves at one step and exits 42 on the first SIGTERM, before
    # GraceTime ends: SLURM marks the job FAILED and never requeues it. (Were it still
    # running when GraceTime ends, SLURM would requeue it and the wait below fails.)
    jid, ckpt, out = submit_two_tasks(
        slurm, tmp_path, [PREEMPTED_JOB_TIME], f"--steps {STEPS} --step-time {STEP_TIME} --impl tf"
    )
    wait_events(out, lambda e: e["event"] == "progress" and e["step"] >= 20, PROGRESS_BOUND_2)
    high, submitted = preempt(slurm, tmp_path)
    job = slurm.wait_job(jid, lambda j: j.get("JobState") in TERMINAL, GRACE_TIME + 90)
    time.sleep(REQUEUE_SHOWS)  # a requeue would show by then
    job = slurm.job(jid)
    events = parse_events(out)
    check_one_agreed_step_per_run(events, [])
    exits = by(events, "exit")
    assert len(exits) == 2, events
    assert job["Restarts"] == "0" and job["JobState"] == "FAILED", job
    assert list(ckpt.glob("ckpt-*.index")), "TF's handler saved no checkpoint"
    assert len(by(events, "start")) == 2  # one run of 2 tasks: gone from the queue
    assert slurm.wait_job(high, lambda j: j.get("JobState") in TERMINAL, 60)["JobState"] == (
        "COMPLETED"
    )
    report(
        "preemption (srun), 2 tasks MWMS, TF's handler",
        exit_codes=[e["code"] for e in exits],
        job_state=job["JobState"],
        saved_step=exits[0]["step"],
        resumed_step=None,
        requeued=False,
        high_submit_to_exit_s=round(max(e["time"] for e in exits) - submitted, 1),
    )
