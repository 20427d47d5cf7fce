"""What the preemption records cost on the way from a notice to the exit.

A local-mode handler (``tf_failure_handling.testing.FakeCheckpoint``: the save
itself is a small file write, so the records' share is as large as it gets),
alternately with records on (the default folder beside the checkpoints) and off
(``TerminationConfig(records_dir=False)``), ``--repeats`` preemptions each: the
notice is delivered, the next ``run()`` saves and calls ``exit_fn``. Times the
notice -> ``exit_fn`` path and, inside it, notice -> save start (the records'
notice and agreement lines are written before the save). Each step sleeps 1 ms
with the GIL released, as a step of real training does inside TensorFlow.

    python benches/bench_records.py [--repeats 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))


def one(root: Path, records_on: bool, index: int) -> tuple:
    from tf_failure_handling import PreemptionCheckpointHandler, TerminationConfig, testing

    marks: dict = {}

    class Checkpoint(testing.FakeCheckpoint):
        pass

    w = testing.FakeVariable(0)
    ckpt = Checkpoint(w=w)
    config = TerminationConfig(
        exit_fn=lambda: marks.setdefault("exit", time.perf_counter()),
        save_fn=None,
        records_dir=None if records_on else False,
    )
    handler = PreemptionCheckpointHandler(None, ckpt, str(root / f"ckpt-{index}"), config)
    original = handler._save_checkpoint

    def timed_save(*args, **kwargs):
        marks.setdefault("save", time.perf_counter())
        return original(*args, **kwargs)

    handler._save_checkpoint = timed_save

    def step() -> None:
        time.sleep(0.001)
        w.assign_add(1)

    try:
        for _ in range(20):
            handler.run(lambda: w.assign_add(1))
        start = time.perf_counter()
        handler._notify_termination()
        while "exit" not in marks:
            handler.run(step)
        return marks["save"] - start, marks["exit"] - start
    finally:
        handler.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=300)
    args = p.parse_args()
    times: dict = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(args.repeats):
            for on in (True, False) if i % 2 == 0 else (False, True):
                times[on].append(one(root, on, 2 * i + on))
    rows = []
    for what, k in (("notice -> save starts", 0), ("notice -> exit_fn", 1)):
        on = statistics.median(t[k] for t in times[True])
        off = statistics.median(t[k] for t in times[False])
        rows.append((what, _report.duration(off), _report.duration(on), _report.duration(on - off)))
    _report.print_readme_table(
        f"preemption records on and off ({args.repeats} preemptions each, medians)",
        ("path", "records off", "records on", "added (difference of the medians)"),
        rows,
    )


if __name__ == "__main__":
    main()
