"""The real-process trials, one function per kind, and :func:`run_trial`.

Each kind starts its processes through the harness, injects its faults at the
planned moments, and checks its invariants into a :class:`TrialResult` (see
``process_trials.py`` for the kinds and their invariants).
"""

from __future__ import annotations

import re
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Optional

from integration.mwms_worker import poll_until, tail

from . import lost_worker, ps_checks, ps_preemption
from .harness import (
    EXIT_CODE,
    EXIT_TIMEOUT,
    PEER_TIMEOUT,
    RUN_TIMEOUT,
    STEPS,
    PsTrialCluster,
    Workers,
    await_moment,
    chief_dir,
    dump_stacks,
    ended_cleanly,
    moment_of,
    non_chief_parent,
    peer_env,
    reference_weights,
    round_windows,
    weights_mismatch,
)
from .netns import Partition, netns_missing
from .plans import KINDS, NUM_WORKERS, Plan, make_plan
from .report import TrialResult

#: Peer bound of the handlers in the partition trial.
PARTITION_PEER_TIMEOUT = 4.0
#: From the cut: the worker left behind has stopped. Seen on this kind of machine:
#: the peer bound + 10 s (TF's deadline for reporting the error to the cut-off task)
#: when it waits for an acknowledgement; TF's 10 s heartbeat timeout when it is
#: blocked in a collective. About 3x that.
PARTITION_BOUND = 45.0
#: From the SIGKILL: the other worker of a crash_during_save trial has stopped.
SURVIVOR_BOUND = 60.0
PS_TIMEOUT = 420.0  # the whole PS trial, 5,000+ closures with kills and restarts
PS_RESTART_TIMEOUT = 90.0  # a restarted worker server serves again


def _restart_and_check(
    result: TrialResult, workdir: Path, ckpt_dir: Path, expected_step: int, name: str
) -> Optional[Workers]:
    """A clean life from ``ckpt_dir``: resumes at ``expected_step``, ends as uninterrupted."""
    reference = reference_weights(workdir)
    workers = Workers(
        workdir, name, ckpt_dir=ckpt_dir, env=peer_env(PEER_TIMEOUT), step_sleep=0.0
    ).start()
    if not ended_cleanly(workers, result, RUN_TIMEOUT, f"{name}: "):
        return workers
    restored = []
    for i in range(NUM_WORKERS):
        starts, done = workers.events(i, "start"), workers.events(i, "done")
        if not starts or not done:
            result.violations.append(f"{name}: worker {i} printed no start/done event")
            continue
        restored.append(starts[0]["restored"])
        if starts[0]["restored"] != expected_step:
            result.violations.append(
                f"{name}: worker {i} restored run {starts[0]['restored']}, "
                f"the last complete checkpoint is of run {expected_step}"
            )
            if starts[0]["restored"] < expected_step:
                result.lost_steps = max(result.lost_steps, expected_step - starts[0]["restored"])
        if done[0]["total_run_calls"] != STEPS:
            result.violations.append(
                f"{name}: worker {i} ended after {done[0]['total_run_calls']} runs, not {STEPS}"
            )
        mismatch = weights_mismatch(done[0]["weights"], reference)
        if mismatch:
            result.violations.append(
                f"{name}: worker {i} resumed from run {starts[0]['restored']} and ended "
                f"with other weights than an uninterrupted run: {mismatch}"
            )
    result.notes[f"{name}_restored"] = restored
    return workers


def _published_steps(workers: Workers) -> dict:
    """The run count each step key was set to (the write that succeeded), by key."""
    steps: dict = {}
    for i in range(NUM_WORKERS):
        for e in workers.events(i, "kv_set"):
            if e.get("ok") and e["key"] in ("RUN_TO_CHECKPOINT", "LAST_RUN_TO_CHECKPOINT"):
                if e["value"] != "STOP_WATCHER":
                    steps[e["key"]] = int(e["value"])
    return steps


def _check_preemption_life(result: TrialResult, workers: Workers, rounds: int, after: int):
    """Both exited 42 having saved ``rounds`` times at the same steps (>= ``after``).

    Returns the agreed step of the last round, or None.
    """
    codes = workers.wait(EXIT_TIMEOUT)
    result.notes.setdefault("exit_codes", []).append(codes)
    if None in codes:
        result.hangs += 1
        result.violations.append(
            f"{workers.name}: workers {[i for i, c in enumerate(codes) if c is None]} still "
            f"running {EXIT_TIMEOUT:.0f}s after the notice"
        )
        workers.dump_stacks()
        return None
    if codes != [EXIT_CODE] * NUM_WORKERS:
        result.violations.append(f"{workers.name}: exit codes {codes}, expected 42 from both")
    saves = [[e["runs"] for e in workers.events(i, "save")] for i in range(NUM_WORKERS)]
    result.notes.setdefault("saves", []).append(saves)
    published = _published_steps(workers)
    if (
        rounds == 2
        and published.get("LAST_RUN_TO_CHECKPOINT") is not None
        and (published.get("LAST_RUN_TO_CHECKPOINT") == published.get("RUN_TO_CHECKPOINT"))
    ):
        # A deadline with no room for two saves: the final round was agreed at the
        # first round's step, and the first save is the last.
        rounds = 1
        result.notes["one_save"] = published["RUN_TO_CHECKPOINT"]
    for i, steps in enumerate(saves):
        if len(steps) != rounds or len(set(steps)) != len(steps):
            result.mismatched_saves += 1
            result.violations.append(
                f"{workers.name}: worker {i} saved at runs {steps}, expected once in each of "
                f"{rounds} round(s)"
            )
    if any(s != saves[0] for s in saves):
        result.mismatched_saves += 1
        result.violations.append(f"{workers.name}: workers saved at different runs: {saves}")
    if saves[0] and saves[0][0] < after:
        result.violations.append(
            f"{workers.name}: saved at run {saves[0][0]}, before the notice (sent after "
            f"every worker finished run {after})"
        )
    chief = chief_dir(workers.ckpt_dir)
    if not (chief / "checkpoint").is_file():
        result.violations.append(f"{workers.name}: no checkpoint state file in {chief}")
    if codes == [EXIT_CODE] * NUM_WORKERS and non_chief_parent(workers.ckpt_dir).exists():
        result.violations.append(
            f"{workers.name}: {non_chief_parent(workers.ckpt_dir)} left behind at exit"
        )
    return saves[0][-1] if saves[0] else None


def _trial_preemption(plan: Plan, result: TrialResult, workdir: Path) -> list:
    p = plan.params
    reference_weights(workdir)
    ckpt = workdir / "train" / "ckpt"
    trial_args = ["--slow-save", p["slow_save"], "--ack-delay", p["ack_delay"]]
    if p["grace"]:
        trial_args += ["--grace", p["grace"]]
    # A second notice aimed at the acknowledgement round: the acknowledgements wait
    # until it was sent, so it lands there however slow the machine (a delay alone
    # was a race against the harness's own reaction time).
    gate = workdir / "acks_open" if p["second_moment"] == "during_ack" else None
    if gate is not None:
        trial_args += ["--ack-gate", gate]
    workers = Workers(
        workdir, "preempted", ckpt_dir=ckpt, trial_args=trial_args, env=peer_env(PEER_TIMEOUT)
    ).start()
    lives = [workers]
    problem = workers.wait_for_progress(p["step"])
    if problem:
        result.violations.append(f"before the notice: {problem}")
        return lives
    after = min(workers.progress(i) for i in range(NUM_WORKERS))
    time.sleep(p["first_delay"])
    sent = []
    try:
        for n, target in enumerate(p["targets"]):
            if n:
                await_moment(workers, p["second_moment"])
                time.sleep(p["second_delay"])
            sent.append(workers.signal(target, signal.SIGTERM))
            if sent[-1] is not None:
                result.fault("sigterm")
    finally:
        if gate is not None:
            gate.touch()
    rounds = 2 if p["grace"] else 1
    saved = _check_preemption_life(result, workers, rounds, after)
    windows = round_windows(workers)
    if p["grace"] and saved is not None and sent[0] is not None:
        # Observed, not checked: a plan's saves may not fit in its grace period.
        ends = [e["t_end"] for i in range(NUM_WORKERS) for e in workers.events(i, "save")]
        result.notes["grace_deadline_margin_s"] = round(sent[0] + p["grace"] - max(ends), 3)
    if len(sent) > 1:
        # The moment the second notice landed (a worker that had exited got none).
        moment = "after_exit" if sent[1] is None else moment_of(sent[1], windows, p["grace"])
        result.notes["second_notice"] = moment
        result.fault(f"second_notice_{moment}")
    if saved is None:
        return lives
    lives.append(_restart_and_check(result, workdir, ckpt, saved, "restart"))
    return lives


def _survivors_checkpoint(ckpt: Path) -> Optional[int]:
    """The run count of the survivors' checkpoint (``ckpt-survivor<worker>-<runs>``) the
    state file in ``ckpt`` names, or None when it names another (or none)."""
    found = re.fullmatch(r"ckpt-survivor\d+-(\d+)", lost_worker.named_checkpoint(ckpt) or "")
    return int(found.group(1)) if found else None


def _trial_crash_during_save(plan: Plan, result: TrialResult, workdir: Path) -> list:
    p = plan.params
    reference_weights(workdir)
    ckpt = workdir / "train" / "ckpt"
    env = peer_env(PEER_TIMEOUT)
    lives: list = []
    complete = 0  # run count of the chief's last complete checkpoint
    if p["prior"]:
        prior = Workers(workdir, "prior", ckpt_dir=ckpt, env=env).start()
        lives.append(prior)
        problem = prior.wait_for_progress(p["prior_step"])
        if problem:
            result.violations.append(f"prior life: {problem}")
            return lives
        after = min(prior.progress(i) for i in range(NUM_WORKERS))
        prior.signal(p["prior_target"], signal.SIGTERM)
        result.fault("sigterm")
        saved = _check_preemption_life(result, prior, 1, after)
        if saved is None:
            return lives
        complete = saved

    # The killed worker's save waits at two gates (before its data files, before the
    # state file names them) that the trial opens: the SIGKILL lands in the planned
    # part of the save however slow the machine. The other worker's gates are open.
    target = p["kill_target"]
    gates = workdir / "save-gate-{index}"
    for gate in (1, 2):
        Path(f"{str(gates).format(index=1 - target)}-{gate}").touch()
    crash = Workers(
        workdir,
        "crash",
        ckpt_dir=ckpt,
        env=env,
        trial_args=["--slow-save", p["slow_save"], "--save-gate", gates],
    ).start()
    lives.append(crash)
    problem = crash.wait_for_progress(complete + p["notice_after"])
    if problem:
        result.violations.append(f"crash life: {problem}")
        return lives
    restored = [e["restored"] for i in range(NUM_WORKERS) for e in crash.events(i, "start")]
    if restored != [complete] * NUM_WORKERS:
        result.violations.append(f"crash life restored {restored}, expected {complete}")
    crash.signal(p["notice_target"], signal.SIGTERM)
    result.fault("sigterm")
    found = poll_until(lambda: bool(crash.events(target, "save_begin")), EXIT_TIMEOUT, 0.01)
    if not found:
        result.violations.append(f"worker {target} never began a save after the notice")
        return lives
    begin = crash.events(target, "save_begin")[0]
    if p["kill_delay"] > p["slow_save"] / 2:  # after its data files are written
        Path(f"{str(gates).format(index=target)}-1").touch()
        poll_until(lambda: bool(crash.events(target, "save_written")), EXIT_TIMEOUT, 0.01)
    time.sleep(max(0.0, begin["t"] + p["kill_delay"] - time.time()))
    killed_at = crash.signal(target, signal.SIGKILL)
    result.fault("sigkill")
    crash.wait(10, [target])
    written = [e for e in crash.events(target, "save_written") if e["t"] <= killed_at]
    completed = crash.events(target, "save")
    result.notes["kill_landed"] = (
        "after_save" if completed else "after_data_files" if written else "before_data_files"
    )
    if completed:
        result.violations.append(
            f"the SIGKILL came {killed_at - completed[0]['t_end']:.3f}s after worker "
            f"{target}'s save had finished (the harness missed its window)"
        )

    survivor = 1 - target
    (code,) = crash.wait(SURVIVOR_BOUND, [survivor])
    survivor_saves = [e["runs"] for e in crash.events(survivor, "save")]
    result.notes["survivor"] = {"worker": survivor, "exit_code": code, "saves": survivor_saves}
    if survivor_saves and survivor_saves != [begin["runs"]]:
        result.mismatched_saves += 1
        result.violations.append(
            f"worker {survivor} saved at runs {survivor_saves}; worker {target} was killed "
            f"while saving at run {begin['runs']}"
        )
    if code is None:
        result.hangs += 1
        result.violations.append(
            f"worker {survivor} still running {SURVIVOR_BOUND:.0f}s after worker {target} "
            f"was killed during its save"
        )
        crash.dump_stacks([survivor])
    crash.kill()
    chief_saves = [
        e["runs"] for e in crash.events(0, "save") if Path(e["directory"]) == chief_dir(ckpt)
    ]
    partial = crash.events(target, "save_begin")[0]["runs"]
    if chief_saves:
        complete = chief_saves[-1]
    # The chief killed inside its save: the survivor saves the round's step itself
    # (issue 62), a whole checkpoint of its own name that the state file names.
    survivors = _survivors_checkpoint(ckpt)
    result.notes["survivors_saved"] = survivors
    if survivors is not None:
        if survivors != partial:
            result.violations.append(
                f"the survivors saved run {survivors}, not the round's run {partial}"
            )
        complete = survivors
    result.notes["complete"] = complete
    result.notes["partial"] = partial
    final = _restart_and_check(result, workdir, ckpt, complete, "restart")
    lives.append(final)
    if target == 0 and partial != complete and final is not None:
        restored = result.notes.get("restart_restored", [])
        if partial in restored:
            result.violations.append(
                f"the restart restored the partial checkpoint of run {partial} (the chief "
                f"was killed while saving it)"
            )
    return lives


def _trial_partition(plan: Plan, result: TrialResult, workdir: Path) -> list:
    p = plan.params
    if netns_missing(result, "the partition trial cannot run"):
        return []
    isolated = p["isolated"]
    with Partition() as net:
        hosts = [net.host_address, net.host_address]
        hosts[isolated] = net.ns_address
        netns = [None, None]
        netns[isolated] = net.namespace
        env = {**peer_env(PARTITION_PEER_TIMEOUT), **net.env()}
        workers = Workers(
            workdir,
            "partitioned",
            ckpt_dir=workdir / "train" / "ckpt",
            hosts=hosts,
            netns=netns,
            env=env,
            trial_args=["--ack-delay", p["ack_delay"]],
        ).start()
        try:
            _partition_and_watch(p, result, workers, net)
        finally:
            workers.kill()  # before the namespace goes
        result.notes["isolated_exit_code"] = workers.returncode(isolated)
        return [workers]


def _partition_and_watch(p: dict, result: TrialResult, workers: Workers, net: Partition) -> None:
    isolated, survivor = p["isolated"], 1 - p["isolated"]
    problem = workers.wait_for_progress(p["step"])
    if problem:
        result.violations.append(f"before the partition: {problem}")
        return
    if p["cut_offset"] < 0:
        cut_at = net.cut()
        time.sleep(-p["cut_offset"])
        notice_at = workers.signal(p["notice_target"], signal.SIGTERM)
    else:
        notice_at = workers.signal(p["notice_target"], signal.SIGTERM)
        time.sleep(p["cut_offset"])
        cut_at = net.cut()
    result.fault("sigterm")
    result.fault("partition")
    (code,) = workers.wait(PARTITION_BOUND, [survivor])
    stopped_after = time.time() - cut_at
    result.notes["survivor"] = {
        "worker": survivor,
        "exit_code": code,
        "stopped_after_cut_s": None if code is None else round(stopped_after, 2),
        "cut_minus_notice_s": round(cut_at - notice_at, 3),
    }
    if code is None:
        result.hangs += 1
        result.violations.append(
            f"worker {survivor} still running {PARTITION_BOUND:.0f}s after worker "
            f"{isolated} ({net.ns_address}) was cut off"
        )
        workers.dump_stacks([survivor])
    elif code == EXIT_CODE:
        result.notes["survivor"]["how"] = "saved and exited (agreement done before the cut)"
    else:
        message = _stop_reason(workers, survivor)
        result.notes["survivor"]["reason"] = message[:600]
        result.notes["survivor"]["how"] = (
            "acknowledgement timeout"
            if "did not acknowledge" in message
            else "TF heartbeat"
            if "heartbeat" in message.lower()
            else "other error"
        )
        if not _names_worker(message, isolated, net.ns_address):
            result.violations.append(
                f"worker {survivor} stopped (exit {code}) with an error that does not name "
                f"the cut-off worker {isolated} ({net.ns_address}): {message[:1500]}"
            )


def _stop_reason(workers: Workers, index: int) -> str:
    errors = workers.events(index, "error")
    text = " | ".join(f"{e['type']}: {e['message']}" for e in errors)
    return text or tail(workers.stderr[index], 15)


def _names_worker(message: str, index: int, address: str) -> bool:
    if f"/task:{index}" in message or address in message:
        return True
    match = re.search(r"worker\(s\) ([\d, ]+) did not acknowledge", message)
    return bool(match) and str(index) in [w.strip() for w in match.group(1).split(",")]


def _trial_ps_worker_kills(plan: Plan, result: TrialResult, workdir: Path, impl: str) -> list:
    p = plan.params
    cluster = PsTrialCluster(workdir, impl=impl, name="ps")
    started = time.monotonic()
    cluster.start_trial(
        "--closures",
        p["closures"],
        "--seed",
        plan.seed,
        "--wave-min",
        p["wave_min"],
        "--wave-max",
        p["wave_max"],
        "--max-seconds",
        PS_TIMEOUT - 60,
    )
    try:
        for kill in p["kills"]:
            remaining = PS_TIMEOUT - (time.monotonic() - started)
            cluster.wait_event(
                lambda e, at=kill["at_done"]: e["event"] == "progress" and e["done"] >= at,
                remaining,
                f"{kill['at_done']} closures done",
            )
            time.sleep(kill["delay"])
            for w in kill["workers"]:
                cluster.kill_server("worker", w)
                result.fault("worker_sigkill")
            time.sleep(kill["downtime"])
            for w in kill["workers"]:
                cluster.start_server("worker", w)
            for w in kill["workers"]:
                cluster.wait_serving("worker", w, PS_RESTART_TIMEOUT)
        (cluster.workdir / "faults_done").touch()
        remaining = PS_TIMEOUT - (time.monotonic() - started)
        cluster.wait_done(max(remaining, 30.0))
    except AssertionError as e:
        if "timed out" in str(e):
            result.hangs += 1
            if cluster.coordinator is not None:
                dump_stacks(cluster.coordinator.popen, cluster.coordinator.stderr_path)
        result.violations.append(str(e).split("\n", 1)[0])
        result.logs = cluster.describe()
        cluster.kill()
        return []
    finally:
        result.notes["ps_progress_events"] = len(cluster.events("progress"))
    cluster.kill()
    summaries = cluster.events("summary")
    gave_up = cluster.events("gave_up")
    if gave_up:
        result.violations.append(f"the coordinator gave up: {gave_up}")
    if len(summaries) != 1:
        result.violations.append(f"expected one summary, got {len(summaries)}")
        result.logs = cluster.describe()
        return []
    s = summaries[0]
    result.notes["ps"] = {
        k: s[k]
        for k in (
            "scheduled",
            "waves",
            "count_by_worker",
            "duplicated_closures",
            "contrib_sum",
            "total",
            "exactly_once",
            "seconds",
            "faults_seen_at",
        )
    }
    result.lost_closures = s["unresolved"] + s["wrong_count"] + s["never_ran_count"]
    result.duplicate_closures = s["duplicates"]
    if s["scheduled"] < p["closures"]:
        result.violations.append(f"only {s['scheduled']} closures scheduled")
    if s["unresolved"]:
        result.violations.append(
            f"{s['unresolved']} RemoteValues did not resolve: {s['unresolved_sample']}"
        )
    if s["wrong_count"]:
        result.violations.append(
            f"{s['wrong_count']} RemoteValues hold another closure's result: {s['wrong_results']}"
        )
    if s["never_ran_count"]:
        result.violations.append(
            f"{s['never_ran_count']} closures never updated the PS (contrib[i] == 0): "
            f"{s['never_ran']}"
        )
    if s["uneven"]:
        result.violations.append(f"contrib[i] not a multiple of i + 1 at {s['uneven']}")
    if s["contrib_beyond_scheduled"]:
        result.violations.append(
            f"{s['contrib_beyond_scheduled']} contributed beyond the scheduled closures"
        )
    if s["total"] < s["exactly_once"]:
        result.violations.append(
            f"PS total {s['total']} < {s['exactly_once']}, the sum of one execution of every "
            f"closure: an update was lost"
        )
    if result.violations:
        result.logs = cluster.describe()
    return []


def _trial_ps_preemption(plan: Plan, result: TrialResult, workdir: Path) -> list:
    """A PS cluster under its launcher; the plan's faults; the checks (``ps_checks``)."""
    p = plan.params
    launcher = ps_preemption.Launcher(workdir, p, result)
    driver = ps_preemption.FaultDriver(launcher, p["faults"], result)
    try:
        ps_preemption.run(launcher, driver, result)
    finally:
        launcher.stop()
    ps_checks.check(launcher, driver, result, p["steps"])
    if result.violations:
        result.logs = launcher.describe()
    return []


def run_trial(
    plan: Plan,
    root: Optional[Path] = None,
    *,
    impl: str = "ours",
    keep: bool = False,
    gcs=None,
) -> TrialResult:
    """Runs one planned trial in a fresh directory (kept if it failed or ``keep``).

    The MWMS kinds use tf_failure_handling's handler; ``impl`` picks the PS
    coordinator (``"tf"`` runs the same trial against TensorFlow's, for comparison).
    ``gcs``: a ``lost_worker`` trial checkpoints to that emulator's bucket
    (:func:`lost_worker.trial`).
    """
    result = TrialResult(plan.kind, plan.seed, plan)
    root = Path(root) if root is not None else Path(tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"{plan.kind}-{plan.seed}-", dir=root))
    started = time.monotonic()
    lives: list = []
    try:
        if plan.kind == "ps_worker_kills":
            lives = _trial_ps_worker_kills(plan, result, workdir, impl)
        elif plan.kind == "ps_preemption":
            lives = _trial_ps_preemption(plan, result, workdir)
        elif plan.kind == "preemption":
            lives = _trial_preemption(plan, result, workdir)
        elif plan.kind == "crash_during_save":
            lives = _trial_crash_during_save(plan, result, workdir)
        elif plan.kind == "lost_worker":
            lives = lost_worker.trial(plan, result, workdir, gcs)
        else:
            lives = _trial_partition(plan, result, workdir)
    finally:
        result.seconds = time.monotonic() - started
        if result.violations and not result.logs:
            result.logs = "\n".join(w.describe_all() for w in lives if w is not None)
        for workers in lives:
            if workers is not None:
                workers.kill()
        if not keep and result.ok:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            result.notes["workdir"] = str(workdir)
    return result


def run_process_trials(
    kinds=KINDS, seeds=range(1), *, root: Optional[Path] = None, impl: str = "ours"
) -> list:
    """Runs ``make_plan(kind, seed)`` for every kind and seed; one TrialResult each."""
    results = []
    for kind in kinds:
        for seed in seeds:
            results.append(run_trial(make_plan(kind, seed), root, impl=impl))
    return results
