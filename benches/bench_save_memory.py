"""What one preemption save costs each worker in host memory, beside what it writes:
TensorFlow's handler and ours in each ``TF_FAILURE_HANDLING_NON_CHIEF_SAVES`` mode.

Under MultiWorkerMirroredStrategy every worker takes part in a save (a ``SyncOnRead``
variable's read is a collective). TensorFlow's non-chief writes a full copy to
``workertemp_<task_id>`` beside the checkpoint; ours in ``memory`` mode reads every
tensor and writes no copy (``_integrations/tf_reads_only.py``), in ``storage`` mode
writes TensorFlow's copy, in ``shares`` mode writes its share of the one checkpoint.

Each run is a real 2-worker cluster on 127.0.0.1 (the integration tests' ``Cluster`` and
``mwms_worker.py``, each worker a fresh ``python`` process: no fork server), the model
``examples/mwms_custom_loop.py``'s plus ``--model-mb`` MiB of float32 variables made
under ``strategy.scope()`` (``mwms_worker.py --ballast-mb``), the checkpoint in a local
folder. Once both workers have trained 10 steps, worker 1 gets SIGTERM; both save once
and exit 42.

**Peak RSS growth**, per worker: the worker resets its peak resident set to what is
resident right after the handler's construction (``5`` to ``/proc/self/clear_refs``;
``VmRSS`` then is the start), and reads ``VmHWM`` (the kernel's own peak since that
reset, no sampling) when ``SystemExit`` leaves its training loop, after the save and the
removal of a non-chief's copy; growth = ``VmHWM`` - start. The same during the save
alone: ``mwms_worker.py --peak-per-save`` reads the peak so far at the save's start,
resets it, and reads it again at the save's end (the span's peak is then the largest
of the three readings). **Bytes written**: both workers' ``wchar`` (``/proc/self/io``:
bytes passed to ``write()`` and its kin, page cache or not) over the same span: the
checkpoint, any copy on the storage, the small ``checkpoint`` files and the preemption
records; ``ram://`` is no write. After each run
the chief's checkpoint is checked: a ``ckpt-N.index`` and data files of at least the
model's bytes. **Save**: each worker's ``CheckpointManager.save``, start to end
(``time.time()``, the ``save`` event), on this machine's local disk.

    python benches/bench_save_memory.py [--model-mb 200,1024] [--repeats 1]
        [--variants tf,memory,storage,shares] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import _report

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"
sys.path.insert(0, str(TESTS))

NON_CHIEF_SAVES_ENV = "TF_FAILURE_HANDLING_NON_CHIEF_SAVES"
#: Each variant: (``mwms_worker.py --impl``, ``TF_FAILURE_HANDLING_NON_CHIEF_SAVES``).
VARIANTS = {
    "tf": ("tf", None),
    "memory": ("ours", "memory"),
    "storage": ("ours", "storage"),
    "shares": ("ours", "shares"),
}
NAMES = {
    "tf": "TensorFlow",
    "memory": "tf-failure-handling, memory (default)",
    "storage": "tf-failure-handling, storage",
    "shares": "tf-failure-handling, shares",
}
STEPS = 100_000  # never reached: the run ends with the preemption
STEP_SLEEP = 0.03
NOTICE_AFTER = 10
#: Bounds on a cluster's start (TF imports, 1 GiB of variables made and broadcast) and
#: on SIGTERM -> both workers gone.
STARTUP_BOUND = 420.0
EXIT_BOUND = 300.0
QUICK = {"model_mb": "16", "repeats": 1}
DEFAULTS = {"model_mb": "200,1024", "repeats": 1}


@dataclass
class Result:
    #: Peak RSS growth from the handler's construction to the exit, bytes: chief,
    #: non-chief.
    peak: tuple
    #: Peak RSS growth during the save, bytes: chief, non-chief.
    save_peak: tuple
    #: Bytes written by both workers.
    written: int
    #: The chief's checkpoint's data files, bytes.
    checkpoint: int
    #: Seconds each worker's save took (``CheckpointManager.save``): chief, non-chief.
    save_s: tuple


def one_run(variant: str, model_mb: int, root: Path, run_id: str) -> Result:
    from integration.conftest import Cluster

    impl, saves = VARIANTS[variant]
    ckpt_dir = root / run_id / "train" / "ckpt"
    cluster = Cluster(
        root / run_id,
        impl=impl,
        ckpt_dir=ckpt_dir,
        num_workers=2,
        steps=STEPS,
        step_sleep=STEP_SLEEP,
        extra_args=["--ballast-mb", str(model_mb), "--peak-per-save"],
        env={NON_CHIEF_SAVES_ENV: saves} if saves else {},
        name=run_id,
    )
    try:
        cluster.start()
        cluster.wait_for_progress(NOTICE_AFTER, timeout=STARTUP_BOUND)
        cluster.send_signal(1)
        codes = cluster.wait(EXIT_BOUND, "both workers to save and exit after SIGTERM")
        details = "\n".join(cluster.describe(i) for i in range(2))
        if codes != [42, 42]:
            raise RuntimeError(f"{run_id}: exit codes {codes}\n{details}")
        peaks, save_peaks, written, save_s = [], [], 0, []
        for i in range(2):
            [save] = cluster.events(i, "save")
            save_s.append(save["t_end"] - save["t_start"])
            [start], [end] = cluster.events(i, "start"), cluster.events(i, "exit")
            if start.get("rss") is None or end.get("peak_rss") is None:
                raise RuntimeError(f"{run_id}: no /proc/self/status here\n{details}")
            # The peak was reset at the save's start: the whole span's is the largest of
            # the three parts.
            peak = max(save["peak_before"], save["peak_rss"], end["peak_rss"])
            peaks.append(peak - start["rss"])
            save_peaks.append(save["peak_rss"] - save["rss"])
            written += end["wchar"] - start["wchar"]
        data = sum(p.stat().st_size for p in ckpt_dir.glob("ckpt-*.data-*"))
        if not list(ckpt_dir.glob("ckpt-*.index")) or data < model_mb * 2**20:
            listing = sorted(str(p.relative_to(root)) for p in (root / run_id).rglob("*"))
            raise RuntimeError(f"{run_id}: no whole checkpoint: {listing}\n{details}")
        return Result(tuple(peaks), tuple(save_peaks), written, data, tuple(save_s))
    finally:
        cluster.kill()


def mib(nbytes: float) -> str:
    if abs(nbytes) >= 10 * 2**20:
        return f"{nbytes / 2**20:,.0f} MiB"
    return f"{nbytes / 2**20:.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-mb", help=f"MiB of variables (default {DEFAULTS['model_mb']})")
    parser.add_argument("--repeats", type=int, help=f"default {DEFAULTS['repeats']}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="default: all")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK} unless given")
    args = parser.parse_args()
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    sizes = [int(m) for m in args.model_mb.split(",")]
    variants = args.variants.split(",")
    if any(v not in VARIANTS for v in variants):
        parser.error(f"--variants: of {', '.join(VARIANTS)}")
    # Fresh processes: a fork of a server that imported TensorFlow shares its pages.
    os.environ["TFH_TEST_FORKSERVER"] = "0"
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="tffh-bench-save-memory-") as tmp:
        for model_mb in sizes:
            for rep in range(args.repeats):
                for variant in variants:
                    run_id = f"{variant}-{model_mb}-{rep}"
                    start = time.monotonic()
                    r = one_run(variant, model_mb, Path(tmp), run_id)
                    results.setdefault((model_mb, variant), []).append(r)
                    print(
                        f"  {model_mb} MiB {variant:8} peak RSS growth chief {mib(r.peak[0])},"
                        f" non-chief {mib(r.peak[1])} (in the save: {mib(r.save_peak[0])},"
                        f" {mib(r.save_peak[1])}); written {mib(r.written)}; checkpoint"
                        f" {mib(r.checkpoint)}; save {r.save_s[0]:.2f} s, {r.save_s[1]:.2f} s"
                        f" (run {time.monotonic() - start:.0f} s)",
                        flush=True,
                    )
    print_table(results, sizes, variants, args.repeats)
    return 0


def print_table(results: dict, sizes: list, variants: list, repeats: int) -> None:
    header = (
        "model",
        "handler",
        "chief: peak RSS growth",
        "non-chief: peak RSS growth",
        "in the save: chief, non-chief",
        "written by both workers",
        "save: chief, non-chief",
    )

    def cell(nbytes: float, model: int) -> str:
        return f"{mib(nbytes)} ({nbytes / model:.2f}{_report.TIMES} the model)"

    rows = []
    for model_mb in sizes:
        model = model_mb * 2**20
        for variant in variants:
            runs = results[(model_mb, variant)]
            chief = statistics.median(r.peak[0] for r in runs)
            other = statistics.median(r.peak[1] for r in runs)
            written = statistics.median(r.written for r in runs)
            in_save = [statistics.median(r.save_peak[i] for r in runs) for i in range(2)]
            save_s = [statistics.median(r.save_s[i] for r in runs) for i in range(2)]
            rows.append(
                (
                    mib(model),
                    NAMES[variant],
                    cell(chief, model),
                    cell(other, model),
                    f"{mib(in_save[0])}, {mib(in_save[1])}",
                    cell(written, model),
                    f"{save_s[0]:.2f} s, {save_s[1]:.2f} s",
                )
            )
    _report.print_readme_table(
        f"host memory and bytes of one preemption save, 2 workers (medians of {repeats})",
        header,
        rows,
    )
    print(_report.provenance())
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    sys.exit(main())
