"""From a termination notice to the workers' exit: TensorFlow's handler and ours.

Two MultiWorkerMirroredStrategy worker processes on 127.0.0.1 (the integration
tests' ``mwms_worker.py``, ~40 ms steps), alternately with TF's handler and
ours, ``--repeats`` times each:

* SIGTERM to worker 1 → both workers' saves done (seconds after the signal);
* a ``termination_watcher_fn`` notice on worker 1 only → the time between the
  two workers' exits (TF's un-notified worker sleeps out its 1 s poll).

Prints medians and the ratios.

    python benches/bench_notice.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _report

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

STEPS = 400
STEP_SLEEP = 0.03
NOTICE_AFTER = 10


def one_run(impl: str, scenario: str, root: Path) -> float:
    from integration.conftest import Cluster

    workdir = Path(tempfile.mkdtemp(dir=root))
    extra = []
    if scenario == "watcher":
        extra = ["--watcher-file", str(workdir / "notice-{index}")]
    cluster = Cluster(
        workdir,
        impl=impl,
        ckpt_dir=workdir / "train" / "ckpt",
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        extra_args=extra,
        name=f"{impl}-{scenario}",
    )
    try:
        cluster.start()
        cluster.wait_for_progress(NOTICE_AFTER, timeout=120)
        if scenario == "sigterm":
            sent = cluster.send_signal(1)
        else:
            (workdir / "notice-1").touch()
            sent = time.time()
        codes = cluster.wait(120, "both workers to exit")
        if codes != [42, 42]:
            raise RuntimeError(f"{impl} {scenario}: exit codes {codes}")
        if scenario == "sigterm":
            ends = [cluster.events(i, "save")[-1]["t_end"] for i in range(2)]
            return max(ends) - sent
        exits = [cluster.events(i, "exit")[0]["t"] for i in range(2)]
        return abs(exits[0] - exits[1])
    finally:
        cluster.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=("sigterm", "watcher"), default=None)
    args = parser.parse_args()
    os.environ.setdefault("GCE_METADATA_IP", "127.0.0.1:9")
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for scenario in [args.only] if args.only else ["sigterm", "watcher"]:
            for _ in range(args.repeats):
                for impl in ("tf", "ours"):
                    value = one_run(impl, scenario, Path(tmp))
                    results.setdefault((scenario, impl), []).append(value)
                    print(f"  {scenario:8} {impl:5} {value:.3f}s", flush=True)
    labels = {
        "sigterm": "SIGTERM to one worker \u2192 both saves done",
        "watcher": "`termination_watcher_fn` notice on one worker \u2192 the other worker exits,"
        " after the first",
    }
    rows = []
    for scenario, label in labels.items():
        if (scenario, "tf") not in results:
            continue
        tf_s = statistics.median(results[(scenario, "tf")])
        ours_s = statistics.median(results[(scenario, "ours")])
        ratio = _report.ratio(tf_s / ours_s) if ours_s >= 0.001 else f"> 100{_report.TIMES}"
        rows.append((label, f"{tf_s:.3f} s", f"{ours_s:.3f} s", ratio))
    _report.print_readme_table(
        f"from a notice to the exit (medians of {args.repeats})",
        ("", "TensorFlow", "tf-failure-handling", "ratio"),
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
