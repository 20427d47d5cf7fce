"""The long mode of the fault-injection trials: many seeds, one table.

    python tests/reliability/run.py [--sim-trials N] [--debug-trials D]
                                    [--process-seeds M] [--ps-preemption-seeds P]
                                    [--seed S]

(``make reliability`` runs it with the defaults.) Simulated trials run on the
in-memory cluster (``simulation.py``); process trials run real TensorFlow
workers and ParameterServerStrategy clusters on 127.0.0.1 (``process_trials.py``):
M seeds of each kind (6 by default), and of the ``ps_preemption`` and ``lost_worker``
kinds :data:`PS_PREEMPTION_SEEDS` and :data:`LOST_WORKER_SEEDS` when ``--process-seeds``
is not given (else M, unless ``--ps-preemption-seeds`` or ``--lost-worker-seeds`` says
otherwise). Their own table (``processes/report.py``:
faults, hangs, violations, lost ids and duplicated closures, explained or not, by kind
and variant) is printed after them and written with the figure.

The DEBUG-logging variant (``--debug-trials``, the row "sim, DEBUG logging")
runs further simulated seeds in a child process whose "tf_failure_handling" and
Rust (``_native``) loggers are at DEBUG, through a handler that writes every
record to a file. pyo3-log turns each Rust log record into a Python logging call,
which needs the GIL; the file I/O releases it in the middle of the call, so a Rust
lock held across a log record deadlocks the child (a thread holding the GIL waits
for the lock while the holder of the lock waits for the GIL). No thread of the
child can run then, so the parent watches its heartbeat and counts a silence of
:data:`STALL_BOUND` as a hang, with the child's thread dump (faulthandler).
The table counts trials by kind, the trials that could not run (``skipped``: a
partition trial without network namespaces; under ``CI=true`` such a trial fails
instead), faults injected by kind, and the numbers that must stay zero: lost
steps, hangs, mismatched saves, lost closures, and wrong outcomes (a simulated
trial that did not end the way that counts as success for its kind: the
preemption saved by every worker, or the fault's named error). Any violating seed
is printed with its plan; the exit code is 1 if there was one, or if no trial ran.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import logging.handlers
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, so that `reliability` imports

#: ``ps_preemption`` trials of the long mode (issue 48: at least 60; TensorFlow's own
#: coordinator is one variant among them, its row apart).
PS_PREEMPTION_SEEDS = 60
#: ``lost_worker`` trials of the long mode (issue 62: at least 20 of our handler; every
#: fifth seed is TensorFlow's handler, its row apart: 25 seeds are 20 of ours).
LOST_WORKER_SEEDS = 25
#: Real-process trials of every other kind in the long mode.
PROCESS_SEEDS = 6
ZERO_COLUMNS = ("lost steps", "hangs", "mismatched saves", "lost closures", "wrong outcomes")
#: The table row of the DEBUG-logging variant (every kind of simulated trial).
DEBUG_ROW = "sim, DEBUG logging: all kinds"
#: Prefix of the child's protocol lines on its stdout (anything else is ignored).
MARK = "@@trial "
#: Seconds between two heartbeats of the DEBUG-logging child. A heartbeat needs the
#: GIL, so it stops when the child deadlocks on it.
HEARTBEAT = 0.5
#: Seconds without a line from the child after which it counts as hung. A bound
#: that only turns a deadlock into a failure: a live child writes a heartbeat
#: twice a second, and nothing in a trial holds the GIL for long.
STALL_BOUND = 60.0
#: Bound on the child's exit once it said it was done, and on its thread dump.
CHILD_EXIT_BOUND = 30.0
#: Seconds one trial may take in the child before its faulthandler watchdog (a C
#: thread, which needs no GIL) dumps every thread and ends it: the child ends even
#: when its parent is gone. Beyond the trial's own bounds (two lives of
#: ``simulation.CLUSTER_TIMEOUT`` and the joins after a hang).
CHILD_TRIAL_BOUND = 900.0
#: The harness's own test: the child stops itself (SIGSTOP) when this seed starts,
#: or, set to ``"exit"``, ends with exit code 3 after saying it is done.
FREEZE_ENV = "TFH_DEBUG_TRIALS_FREEZE_AT_SEED"


class Tally:
    def __init__(self) -> None:
        self.trials: collections.Counter = collections.Counter()
        self.skipped: collections.Counter = collections.Counter()
        self.faults: collections.Counter = collections.Counter()
        self.zero: dict = {k: collections.Counter() for k in ZERO_COLUMNS}
        self.failures: list = []
        self.seconds: collections.Counter = collections.Counter()

    def add(self, kind: str, record: dict) -> None:
        self.trials[kind] += 1
        self.skipped[kind] += int(bool(record.get("skipped")))
        self.seconds[kind] += record.get("seconds", 0.0)
        for fault, count in record.get("faults", {}).items():
            self.faults[fault] += count
        for column in ZERO_COLUMNS:
            self.zero[column][kind] += int(record.get(column, 0))
        if record.get("violations"):
            self.failures.append((kind, record.get("describe", ""), record["violations"]))

    def add_outside_trials(self, kind: str, violation: str, hangs: int = 0) -> None:
        """A violation that belongs to no trial (a child that hung or died after its
        last one): counted in the zero columns and listed, but not as a trial."""
        self.zero["hangs"][kind] += hangs
        self.failures.append((kind, "", [violation]))

    def table(self, seeds: str) -> str:
        kinds = sorted(self.trials)
        header = ["trial kind", "trials", "skipped", *ZERO_COLUMNS, "violations", "wall s"]
        rows = []
        for kind in kinds:
            violations = sum(1 for k, _, _ in self.failures if k == kind)
            rows.append(
                [
                    kind,
                    str(self.trials[kind]),
                    str(self.skipped[kind]),
                    *(str(self.zero[c][kind]) for c in ZERO_COLUMNS),
                    str(violations),
                    f"{self.seconds[kind]:.0f}",
                ]
            )
        rows.append(
            [
                "**all**",
                str(sum(self.trials.values())),
                str(sum(self.skipped.values())),
                *(str(sum(self.zero[c].values())) for c in ZERO_COLUMNS),
                str(len(self.failures)),
                f"{sum(self.seconds.values()):.0f}",
            ]
        )
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        faults = ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())) or "none"
        lines += ["", f"Faults injected: {faults}.", f"Seeds: {seeds}."]
        return "\n".join(lines)


def run_simulated(tally: Tally, start: int, count: int, progress_every: int) -> None:
    from reliability.simulation import make_plan, run_trial

    t0 = time.monotonic()
    for i, seed in enumerate(range(start, start + count)):
        plan = make_plan(seed)
        r = run_trial(plan)
        tally.add(f"sim: {plan.kind}", _trial_record(plan, r))
        if progress_every and (i + 1) % progress_every == 0:
            print(
                f"  simulated trials: {i + 1}/{count} in {time.monotonic() - t0:.0f}s, "
                f"{len(tally.failures)} violating",
                flush=True,
            )


def _trial_record(plan, r) -> dict:
    return {
        "seconds": r.seconds,
        "faults": r.injected,
        "lost steps": r.lost_steps,
        "hangs": int(r.hung),
        "mismatched saves": r.mismatched_saves,
        "wrong outcomes": r.wrong_outcome,
        "violations": r.violations,
        "describe": plan.describe(),
    }


class _NativeCounting(logging.handlers.RotatingFileHandler):
    """Writes every record to a file (I/O that releases the GIL mid-call) and
    counts the records that came from Rust through pyo3-log."""

    native = 0
    records = 0

    def emit(self, record: logging.LogRecord) -> None:
        type(self).records += 1
        if record.name.startswith("_native"):
            type(self).native += 1
        super().emit(record)


def debug_child(start: int, count: int, log_file: str) -> int:
    """The DEBUG-logging child: runs seeds ``start..start+count-1``, one line each.

    Logging is set up before the package is imported, so that pyo3-log finds the
    DEBUG levels when it first looks them up (it caches them).
    """
    import faulthandler

    faulthandler.enable()  # a SIGABRT from the parent dumps every thread
    handler = _NativeCounting(log_file, maxBytes=16 << 20, backupCount=1)
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(message)s"))
    for name in ("tf_failure_handling", "_native"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
        logger.propagate = False
    out_lock = threading.Lock()

    def say(**line) -> None:
        with out_lock:
            sys.stdout.write(MARK + json.dumps(line) + "\n")
            sys.stdout.flush()

    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT):
            say(event="beat")

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()
    from reliability.simulation import make_plan, run_trial

    freeze_at = os.environ.get(FREEZE_ENV)
    for seed in range(start, start + count):
        plan = make_plan(seed)
        say(event="start", seed=seed, kind=plan.kind)
        if freeze_at not in (None, "exit") and int(freeze_at) == seed:
            os.kill(os.getpid(), signal.SIGSTOP)  # the harness's own test: a silent child
        faulthandler.dump_traceback_later(CHILD_TRIAL_BOUND, exit=True)
        result = run_trial(plan)
        faulthandler.cancel_dump_traceback_later()
        say(event="trial", seed=seed, kind=plan.kind, record=_trial_record(plan, result))
    stop.set()
    say(event="done", records=_NativeCounting.records, native=_NativeCounting.native)
    if freeze_at == "exit":
        os._exit(3)  # the harness's own test: a child that dies on its way out
    return 0


def _read_lines(stream, lines: queue.Queue) -> None:
    for raw in stream:
        if raw.startswith(MARK):
            lines.put(json.loads(raw[len(MARK) :]))
    lines.put(None)  # end of output


def _tail(path: str, n: int = 80) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as e:
        return f"(no output: {e})"


def run_debug_logging(
    tally: Tally, start: int, count: int, progress_every: int = 0, max_hangs: int = 3
) -> dict:
    """The DEBUG-logging variant: ``count`` simulated seeds from ``start`` in a child.

    Each trial is added to ``tally`` under :data:`DEBUG_ROW`. A child that falls
    silent for :data:`STALL_BOUND` is killed (SIGABRT: its faulthandler prints
    every thread first), its trial counted as a hang with the dump, and a new child
    goes on with the next seed, until ``max_hangs`` children hung (a deadlock that
    strikes every seed would otherwise cost a minute per seed); the seeds left are
    not run (``"stopped_at"``). Returns ``{"records": ..., "native": ...,
    "stopped_at": seed or None}``: how many log records the children wrote, and how
    many came from Rust (if none did, the variant could not catch a Rust lock held
    while logging).
    """
    from reliability.simulation import make_plan

    totals = {"records": 0, "native": 0, "stopped_at": None}
    hangs = 0
    t0 = time.monotonic()
    done_trials = 0
    with tempfile.TemporaryDirectory(prefix="tfh-debug-trials-") as tmp:
        seed, end = start, start + count
        while seed < end:
            stderr_path = os.path.join(tmp, f"child-{seed}.stderr")
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--debug-child",
                "--seed",
                str(seed),
                "--debug-trials",
                str(end - seed),
                "--log-file",
                os.path.join(tmp, "debug.log"),
            ]
            with open(stderr_path, "w") as err:
                child = subprocess.Popen(
                    cmd, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1
                )
            lines: queue.Queue = queue.Queue()
            reader = threading.Thread(target=_read_lines, args=(child.stdout, lines), daemon=True)
            reader.start()
            current, hung, finished = None, False, False
            while True:
                try:
                    line = lines.get(timeout=STALL_BOUND)
                except queue.Empty:
                    hung = True
                    break
                if line is None:
                    break
                event = line["event"]
                if event == "start":
                    current = line["seed"]
                elif event == "trial":
                    tally.add(DEBUG_ROW, line["record"])
                    seed, current = line["seed"] + 1, None
                    done_trials += 1
                    if progress_every and done_trials % progress_every == 0:
                        print(
                            f"  DEBUG-logging trials: {done_trials}/{count} in "
                            f"{time.monotonic() - t0:.0f}s, {len(tally.failures)} violating",
                            flush=True,
                        )
                elif event == "done":
                    totals["records"] += line["records"]
                    totals["native"] += line["native"]
                    finished = True
            if hung:
                child.send_signal(signal.SIGABRT)  # faulthandler dumps every thread
                child.send_signal(signal.SIGCONT)  # ... also when the child is stopped
            killed = False
            try:
                child.wait(CHILD_EXIT_BOUND)
            except subprocess.TimeoutExpired:
                child.kill()
                killed = True
                child.wait(CHILD_EXIT_BOUND)
            reader.join(CHILD_EXIT_BOUND)
            child.stdout.close()
            if finished and child.returncode == 0:
                continue  # every seed ran (seed == end now)
            if current is None and seed == end:
                # Every trial was reported; the child hung or died on its way out.
                if hung:
                    what = f"no sign of life for {STALL_BOUND:g}s after its last trial"
                elif killed:
                    what = f"still running {CHILD_EXIT_BOUND:g}s after its last trial (killed)"
                else:
                    what = f"exit code {child.returncode} after its last trial"
                tally.add_outside_trials(
                    DEBUG_ROW,
                    f"DEBUG-logging child of seeds up to {end - 1}: {what}; its stderr ends:\n"
                    + _tail(stderr_path),
                    hangs=int(hung or killed),
                )
                break
            # The child hung or died inside the trial of `current` (or before its first).
            failed = seed if current is None else current
            plan = make_plan(failed)
            what = (
                f"no sign of life for {STALL_BOUND:g}s (deadlock: a lock held while Python runs?)"
                if hung
                else f"the child died with exit code {child.returncode}"
            )
            tally.add(
                DEBUG_ROW,
                {
                    "hangs": int(hung),
                    "violations": [
                        f"DEBUG-logging trial of seed {failed}: {what}; its stderr ends:\n"
                        + _tail(stderr_path)
                    ],
                    "describe": plan.describe(),
                },
            )
            seed = failed + 1
            hangs += int(hung)
            if hangs >= max_hangs and seed < end:
                totals["stopped_at"] = seed
                print(f"  DEBUG-logging trials stopped after {hangs} hang(s).", flush=True)
                break
    return totals


def run_processes(tally: Tally, start: int, seeds_per_kind: int, counts: dict) -> list:
    """Runs the real-process trials into ``tally``; their results (for their own table).
    ``counts``: the seeds of a kind other than ``seeds_per_kind``. A trial of a variant
    other than ours (TensorFlow's coordinator or handler) has its own row."""
    from reliability import process_trials

    results = []
    for kind in process_trials.KINDS:
        count = counts.get(kind, seeds_per_kind)
        for seed in range(start, start + count):
            r = process_trials.run_trial(process_trials.make_plan(kind, seed))
            results.append(r)
            label = f"process: {kind}"
            if r.variant not in ("-", "ours"):
                label += f" ({r.variant})"
            tally.add(
                label,
                {
                    "seconds": r.seconds,
                    "faults": r.faults,
                    "lost steps": r.lost_steps,
                    "hangs": r.hangs,
                    "mismatched saves": r.mismatched_saves,
                    "lost closures": r.lost_closures,
                    "skipped": r.skipped,
                    "violations": r.violations,
                    "describe": r.plan.describe(),
                },
            )
            state = "skipped: " + r.skipped if r.skipped else "ok" if r.ok else "VIOLATION"
            print(f"  process trial {kind} seed {seed}: {state} ({r.seconds:.0f}s)", flush=True)
    if results:
        print("\nReal-process trials by kind:\n" + process_trials.format_table(results), flush=True)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sim-trials", type=int, default=10_000)
    p.add_argument(
        "--debug-trials",
        type=int,
        default=1_000,
        help="simulated trials under DEBUG logging, seeds after the --sim-trials ones",
    )
    p.add_argument(
        "--process-seeds",
        type=int,
        default=None,
        help=f"real-process trials per kind (default {PROCESS_SEEDS})",
    )
    p.add_argument(
        "--ps-preemption-seeds",
        type=int,
        default=None,
        help=f"ps_preemption trials (default {PS_PREEMPTION_SEEDS}, or --process-seeds when "
        "that is given)",
    )
    p.add_argument(
        "--lost-worker-seeds",
        type=int,
        default=None,
        help=f"lost_worker trials (default {LOST_WORKER_SEEDS}, or --process-seeds when "
        "that is given)",
    )
    p.add_argument("--seed", type=int, default=0, help="first seed")
    p.add_argument("--debug-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--log-file", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
    os.environ.setdefault("TF_FAILURE_HANDLING_CLOUD", "none")
    if args.debug_child:
        return debug_child(args.seed, args.debug_trials, args.log_file)
    logging.basicConfig(level=logging.ERROR)
    # The fault trials make the handlers log their expected errors by the thousand;
    # each trial's verdict comes from its checks, not from the log.
    logging.getLogger("tf_failure_handling").setLevel(logging.CRITICAL)

    tally = Tally()
    process_results: list = []
    started = time.monotonic()
    debug_start = args.seed + args.sim_trials
    if args.sim_trials:
        print(f"Running {args.sim_trials} simulated trials from seed {args.seed}...", flush=True)
        run_simulated(tally, args.seed, args.sim_trials, max(1, args.sim_trials // 20))
    logged = None
    if args.debug_trials:
        print(
            f"Running {args.debug_trials} simulated trials under DEBUG logging from seed "
            f"{debug_start}...",
            flush=True,
        )
        logged = run_debug_logging(
            tally, debug_start, args.debug_trials, max(1, args.debug_trials // 5)
        )
    given = args.process_seeds
    counts = {
        "ps_preemption": PS_PREEMPTION_SEEDS if given is None else given,
        "lost_worker": LOST_WORKER_SEEDS if given is None else given,
    }
    if args.ps_preemption_seeds is not None:
        counts["ps_preemption"] = args.ps_preemption_seeds
    if args.lost_worker_seeds is not None:
        counts["lost_worker"] = args.lost_worker_seeds
    if args.process_seeds is None:
        args.process_seeds = PROCESS_SEEDS
    others = {k: n for k, n in counts.items() if n != args.process_seeds}
    if args.process_seeds or any(counts.values()):
        print(
            f"Running {args.process_seeds} real-process trials of each kind"
            + "".join(f", {n} of {k}" for k, n in others.items())
            + "...",
            flush=True,
        )
        process_results = run_processes(tally, args.seed, args.process_seeds, counts)
    seeds = (
        f"simulated {args.seed}..{args.seed + args.sim_trials - 1}, "
        f"DEBUG logging {debug_start}..{debug_start + args.debug_trials - 1}, "
        f"real-process {args.seed}..{args.seed + args.process_seeds - 1} of each kind"
        + "".join(f", {k} {args.seed}..{args.seed + n - 1}" for k, n in others.items())
    )
    print()
    print(tally.table(seeds))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "benches"))
    import _report  # benches/_report: under make figures, the table is kept with its provenance

    figure = tally.table(seeds)
    if process_results:
        from reliability.processes.report import format_table

        figure += "\n\nReal-process trials by kind and variant:\n\n" + format_table(process_results)
    _report.write_figure("reliability trials", figure)
    if logged is not None:
        print(
            f"\nDEBUG logging: {logged['records']} records written to a file, "
            f"{logged['native']} of them from Rust (pyo3-log)."
        )
        if not logged["native"]:
            print("  No Rust record reached Python's logging: the variant checked nothing.")
    print(f"\nTotal wall time {time.monotonic() - started:.0f}s.")
    for kind, describe, violations in tally.failures[:20]:
        print(f"\nVIOLATION ({kind}) {describe}")
        for v in violations[:5]:
            print(f"    {v}")
    ran = sum(tally.trials.values()) - sum(tally.skipped.values())
    vacuous = logged is not None and not logged["native"]
    return 1 if tally.failures or not ran or vacuous else 0


if __name__ == "__main__":
    sys.exit(main())
