"""From a worker lost without notice to the survivor's exit, and the steps lost: TensorFlow's
handler against ours (issue 62), on a model of ``--model-mb`` MB.

Two MultiWorkerMirroredStrategy worker processes on 127.0.0.1 (the integration tests'
``mwms_worker.py``, with ``--ballast-mb``: the example's model plus that many MB of
float32 variables, saved with it), alternately with TF's handler and ours, ``--repeats``
times each, for each target: once every worker finished step ``--kill-after``, the
target is SIGKILLed (a crash, an OOM kill: no notice). Measured, per run:

* **loss to exit**: from the SIGKILL to the survivor's exit (``Popen.wait`` returning
  in this process): TF's error, the report, and for ours the probe and the save of the
  last whole step;
* **steps lost**: L - the run a restart would resume at. L is the highest step either
  worker reported finished (its ``progress`` events); ours resumes at the run it logged
  as saved ("saved the last whole step, run N"), TF's at 0 (its handler saves nothing
  at a loss, and this job made no other save).

Prints the medians and the ratio of the times.

    python benches/bench_lost_worker_exit.py [--model-mb 200] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import sys
import tempfile
from pathlib import Path

import _report

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

STEPS = 2000
STEP_SLEEP = 0.03
#: Bound on the survivor's exit after the kill (a hang shows as a failure of the bench).
EXIT_BOUND = 240.0
SAVED = re.compile(r"saved the last whole step, run (\d+), at ")


def one_run(impl: str, killed: int, args, root: Path) -> tuple:
    """(seconds from the SIGKILL to the survivor's exit, steps lost)."""
    from integration.conftest import Cluster

    workdir = Path(tempfile.mkdtemp(dir=root))
    cluster = Cluster(
        workdir,
        impl=impl,
        ckpt_dir=workdir / "train" / "ckpt",
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        extra_args=["--progress-every", "1", "--ballast-mb", str(args.model_mb)],
        name=f"{impl}-lost{killed}",
    )
    survivor = 1 - killed
    try:
        cluster.start()
        cluster.wait_for_progress(args.kill_after, timeout=240)
        sent = cluster.send_signal(killed, signal.SIGKILL)
        codes = cluster.wait(EXIT_BOUND, "the survivor to exit after the SIGKILL")
        if codes[survivor] in (0, None):
            raise RuntimeError(f"{impl}: the survivor exited with {codes[survivor]}")
        took = cluster.ended_by[survivor] - sent
        finished = max(cluster.progress(i) for i in range(2))
        log = cluster.stderr_paths[survivor].read_text(errors="replace")
        saved = [int(n) for n in SAVED.findall(log)]
        if impl == "ours" and len(saved) != 1:
            raise RuntimeError(
                f"ours: the survivor logged {saved} saves\n{cluster.describe(survivor)}"
            )
        resumed = saved[0] if saved else 0
        return took, finished - resumed
    finally:
        cluster.kill()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-mb", type=int, default=200)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--kill-after", type=int, default=30, help="steps before the SIGKILL")
    args = p.parse_args(argv)
    os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
    targets = {"the non-chief": 1, "the chief": 0}
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for name, killed in targets.items():
                for impl in ("tf", "ours"):
                    took, lost = one_run(impl, killed, args, Path(tmp))
                    results.setdefault((name, impl), []).append((took, lost))
                    print(f"{impl:4} killed {name}: exit {took:.2f} s after, {lost} steps lost")
    rows = []
    for name in targets:
        tf_runs, our_runs = results[(name, "tf")], results[(name, "ours")]
        tf_exit = _report.median(t for t, _ in tf_runs)
        our_exit = _report.median(t for t, _ in our_runs)
        rows.append(
            (
                f"{name} SIGKILLed at step {args.kill_after}+",
                f"{tf_exit:.2f} s",
                f"{_report.median(n for _, n in tf_runs):.0f}",
                f"{our_exit:.2f} s",
                f"{_report.median(n for _, n in our_runs):.0f}",
                f"{our_exit / tf_exit:.2f}x",
            )
        )
    _report.print_readme_table(
        f"From a lost worker to the survivor's exit, {args.model_mb} MB model",
        (
            "lost",
            f"loss to exit, TF (median of {args.repeats})",
            "steps lost, TF",
            "loss to exit, ours",
            "steps lost, ours",
            "ours / TF (time)",
        ),
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
