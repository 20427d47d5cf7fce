"""Preemption demo: 2 MultiWorkerMirroredStrategy workers on 127.0.0.1.

The training is ``examples/mwms_custom_loop.py``, run by ``examples/launch_local.py``
(one process per worker, restarted as a cluster launcher would):

1. An uninterrupted reference run.
2. The demo run: SIGTERM to one worker mid-run; every worker saves a checkpoint at
   the same agreed step and exits with the restart code (42); the launcher starts
   the workers again, they restore that step and finish.
3. The resumed run's final weights are compared with the reference run's, and the
   preemption records are shown (``python -m tf_failure_handling report``).

Run with the project's virtualenv::

    .venv/bin/python demo/run_demo.py [--steps 80] [--workers 2]

Exit status 0 only if the resumed run ends with the reference run's weights.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
EXAMPLE = EXAMPLES / "mwms_custom_loop.py"
sys.path.insert(0, str(EXAMPLES))

import launch_local  # noqa: E402 - examples/launch_local.py, found through the path above

sys.path.insert(0, str(ROOT / "benches"))
import _report  # noqa: E402 - benches/_report.py: under make figures, the report is a figure

#: The figure file ``make figures`` writes the report into (docs/records.md includes it).
REPORT_TITLE = "demo preemption report"

SAVED = re.compile(r"^preempted: checkpoint saved at step (\d+), exiting with code (\d+)$")
STARTED = re.compile(r"^starting at step (\d+)$")
FINISHED = re.compile(r"^finished at step (\d+); weights (.*)$")


def say(message: str = "") -> None:
    print(message, flush=True)


def environment() -> dict:
    """This machine only: no cluster of the caller's, TF's GCE probe refused at once."""
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    env.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
    env.setdefault("TF_FAILURE_HANDLING_CLOUD", "none")
    return env


def narrator(show_progress: bool):
    """Shows what the launcher shows, with one loss line per step (worker 0's) instead of
    one per worker and without the final weights (compared at the end)."""

    def echo(line: str) -> None:
        if " loss " in line and not (show_progress and line.startswith("[worker:0] ")):
            return
        say("  " + line.split("; weights ")[0])

    return echo


def run(label: str, ckpt_dir: Path, args, logs: Path, preempt: str | None = None):
    command = [
        str(EXAMPLE),
        "--ckpt-dir",
        str(ckpt_dir),
        "--steps",
        str(args.steps),
        "--step-time",
        str(args.step_time),
    ]
    return launch_local.launch(
        command,
        workers=args.workers,
        preempt=preempt,
        restarts=1,
        timeout=args.timeout,
        env=environment(),
        logs=logs / label,
        echo=narrator(show_progress=preempt is not None),
    )


def matches(result, pattern, task: str, attempt: int) -> list:
    return [
        found.groups()
        for t, a, line in result.lines
        if t == task and a == attempt and (found := pattern.match(line))
    ]


def final_weights(result, task: str) -> dict | None:
    finished = [groups for a in range(3) for groups in matches(result, FINISHED, task, a)]
    return json.loads(finished[-1][1]) if finished else None


def max_difference(a: dict, b: dict) -> float:
    import numpy as np

    return max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k])))) for k in b)


def show_records(records_dir: Path, output: Path) -> str | None:
    """Copies the run's preemption records to ``output``, prints the report and draws
    the timeline (``python -m tf_failure_handling report``); the report, or None if that
    fails."""
    kept = output / "preemption_records"
    if kept.exists():
        shutil.rmtree(kept)
    output.mkdir(parents=True, exist_ok=True)
    shutil.copytree(records_dir, kept)
    picture = output / "timeline.png"
    command = [sys.executable, "-m", "tf_failure_handling", "report", str(kept)]
    say(f"\nThe preemption records ({' '.join(command[1:])}):")
    done = subprocess.run([*command, "--plot", str(picture)], capture_output=True, text=True)
    say(done.stdout.rstrip())
    if done.returncode != 0:
        say(f"  report failed ({done.returncode}): {done.stderr.strip()}")
        return None
    say(f"Timeline picture: {picture}")
    return done.stdout.rstrip()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="PreemptionCheckpointHandler demo (MWMS).")
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--step-time", type=float, default=0.03)
    p.add_argument(
        "--signal-worker", type=int, default=None, help="worker to SIGTERM (default: the last one)"
    )
    p.add_argument(
        "--signal-after",
        type=int,
        default=None,
        help="send SIGTERM once a worker reports this step (default: about steps // 3)",
    )
    p.add_argument(
        "--output",
        default=str(ROOT / "demo-output"),
        help="where the preemption records and the timeline picture are kept",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="bound for each run")
    p.add_argument(
        "--keep", action="store_true", help="keep the temporary folder (logs, checkpoints)"
    )
    args = p.parse_args(argv)
    n = args.workers
    signal_worker = n - 1 if args.signal_worker is None else args.signal_worker
    signal_after = args.signal_after or max(10, (args.steps // 3) // 10 * 10)
    if not 0 <= signal_worker < n or signal_after >= args.steps:
        p.error("--signal-worker must name a worker; --signal-after must be < --steps")

    say(
        f"Demo: {n} MultiWorkerMirroredStrategy workers on 127.0.0.1 run "
        f"{EXAMPLE.relative_to(ROOT)} for {args.steps} steps, with "
        "tf_failure_handling.PreemptionCheckpointHandler"
    )
    workdir = Path(tempfile.mkdtemp(prefix="tfh-demo-"))
    ckpt_dir = workdir / "train" / "ckpt"
    workers = [f"worker:{i}" for i in range(n)]
    started = time.monotonic()

    say("\n[1/3] Uninterrupted reference run ...")
    reference = run("reference", workdir / "reference" / "ckpt", args, workdir)
    if not reference.finished:
        say(f"The reference run failed; logs in {workdir}")
        return 1

    say(f"\n[2/3] Demo run: SIGTERM to worker {signal_worker} at step {signal_after}; restart ...")
    demo = run("demo", ckpt_dir, args, workdir, preempt=f"worker:{signal_worker}@{signal_after}")
    saved = {w: matches(demo, SAVED, w, 0) for w in workers}
    resumed = {w: matches(demo, STARTED, w, 1) for w in workers}
    say(f"  exits: {', '.join(f'{t} attempt {a}: {c}' for t, a, c in demo.exits)}")
    if not demo.finished or not all(saved.values()) or not all(resumed.values()):
        say(f"The demo run did not save, restart and finish; logs in {workdir}")
        return 1
    steps = {int(s[0][0]) for s in saved.values()}
    starts = {int(r[0][0]) for r in resumed.values()}
    say(f"  the workers saved at step {sorted(steps)} and resumed at step {sorted(starts)}")

    say("\n[3/3] The resumed run against the reference run ...")
    expected = final_weights(reference, "worker:0")
    got = [final_weights(demo, w) for w in workers]
    diff = max(max_difference(g, expected) for g in got)
    same = len(steps) == 1 and steps == starts and diff <= 1e-6
    report = show_records(ckpt_dir / "preemption_records", Path(args.output))
    recorded = report is not None
    took = time.monotonic() - started
    say(f"\nDone in {took:.1f}s.")
    if same and recorded:
        # Under make figures (benches/figures.py): docs/figures/demo-preemption-report.md,
        # the report as this run printed it and how long the run took, with the
        # command, commit, date and machine (docs/records.md and demo/README.md).
        _report.write_figure(
            REPORT_TITLE,
            f"```text\n{report}\n```\n\nThe whole demo (reference run, demo run, report) "
            f"took {took:.0f} s.",
        )
    if same and recorded and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        say(f"Logs and checkpoints kept in {workdir}")
    verdict = "EQUAL" if same else "DIFFER from"
    say(
        f"RESULT: the resumed run's final weights {verdict} the uninterrupted run's "
        f"(max |diff| = {diff:.3g})."
    )
    return 0 if same and recorded else 1


if __name__ == "__main__":
    sys.exit(main())
