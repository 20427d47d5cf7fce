"""What the preemption records cost on the way from a notice to the exit.

A local-mode handler (``tf_failure_handling.testing.FakeCheckpoint``: the save
itself is a small file write, so the records' share is as large as it gets), in
turn with records off (``TerminationConfig(records_dir=False)``), on a local folder
(the default, beside the checkpoints: each line appended and fsynced) and on an
object store (``ram://``, TensorFlow's in-memory file system, through
``tf.io.gfile``: one object per line, written by a background thread),
``--repeats`` preemptions each: the notice is delivered, the next ``run()`` saves
and calls ``exit_fn``. Times the notice -> ``exit_fn`` path (it includes the wait
for the object store to take every line) and, inside it, notice -> save start (the
notice and agreement lines come before the save; on the local folder the first
also creates the folder and the file). Each step sleeps 1 ms with the GIL released,
as a step of real training does inside TensorFlow. ``ram://`` shows what our code
adds on the object-store path; a real bucket's object write is not in it (the
store's latency is paid on the writer thread, and once more before ``exit_fn``).

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


MODES = ("off", "local", "ram")


def one(root: Path, mode: str, index: int) -> tuple:
    from tf_failure_handling import PreemptionCheckpointHandler, TerminationConfig, testing

    marks: dict = {}

    class Checkpoint(testing.FakeCheckpoint):
        pass

    w = testing.FakeVariable(0)
    ckpt = Checkpoint(w=w)
    config = TerminationConfig(
        exit_fn=lambda: marks.setdefault("exit", time.perf_counter()),
        save_fn=None,
        records_dir={"off": False, "local": None, "ram": f"ram://bench/{index}/records"}[mode],
    )
    handler = PreemptionCheckpointHandler(None, ckpt, str(root / f"ckpt-{index}"), config)
    original = handler._checkpoints.save

    def timed_save(*args, **kwargs):
        marks.setdefault("save", time.perf_counter())
        return original(*args, **kwargs)

    handler._checkpoints.save = timed_save

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
    import tensorflow  # noqa: F401 - ram:// is TensorFlow's; imported before any timing

    times: dict = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i in range(args.repeats):
            order = MODES[i % 3 :] + MODES[: i % 3]
            for n, mode in enumerate(order):
                times[mode].append(one(root, mode, 3 * i + n))
    rows = []
    for what, k in (("notice -> save starts", 0), ("notice -> exit_fn", 1)):
        off, local, ram = (statistics.median(t[k] for t in times[m]) for m in MODES)
        rows.append(
            (
                what,
                _report.duration(off),
                _report.duration(local),
                _report.duration(local - off),
                _report.duration(ram),
                _report.duration(ram - off),
            )
        )
    _report.print_readme_table(
        f"what the preemption records cost (off, on a local folder, on ram://; {args.repeats} "
        "preemptions each, medians; added: the difference of the medians)",
        (
            "path",
            "records off",
            "local folder",
            "added",
            "object store (ram://)",
            "added",
        ),
        rows,
    )


if __name__ == "__main__":
    main()
