"""What an input position costs: ours (a few integers, replayed) against TensorFlow's
iterator checkpoint (the iterator's whole state, its shuffle buffer included).

Two inputs of 2,000,000 int64 elements, in batches of 100 (a step takes one batch):

- *buffer*: ``Dataset.range(N).shuffle(200_000, seed=1).batch(100)``, reshuffled each
  iteration: the usual shuffle, whose iterator state holds the buffer;
- *index*: ``Dataset.range(N).map(lambda i: tf.random.experimental.index_shuffle(i,
  seed=[1, 2], max_index=N - 1)).batch(100)``: a global shuffle computed from each
  element's index, with no buffer.

The index input is also given to the handler as a function,
``handler.track_input(build)``, where ``build(iteration, batch)`` is
``Dataset.range(batch * 100, N).map(...)`` with the seed ``[1, 2 + iteration]``
(iteration 0 is the input above): after a restore the handler calls it at the saved
iteration and batch, and nothing is replayed (random access).

Save side (this process): one iterator of each input, made of the input tracked by a
local handler (``handler.track_input``), one ``run()`` per batch. At 1,000, 100,000 and
1,000,000 elements into the epoch the handler saves (``_save_checkpoint``: what a
preemption does at the agreed step) and ``tf.train.Checkpoint(step=..., iterator=it)``
writes TensorFlow's checkpoint of the same iterator. The index input given as ``build``
is saved the same way by another handler, in a pass of its own (TF's bytes of its
iterator are those of the same pipeline in the first pass). Bytes the position adds: for ours,
the handler's checkpoint files (``.index`` and ``.data``) with the tracked input minus
the same handler's checkpoint with none (in parentheses: the length of the saved JSON
string); for TF, the iterator's checkpoint files minus those of
``tf.train.Checkpoint(step=...)`` alone. One worker: each worker saves its own.

Restore side: one subprocess per input and per way of restoring, which builds a fresh
input object for every restore, restores once untimed (warm-up) and then times
restores at each position, in turns, ``--repeats`` times each (fewer when a position's
restores have taken ``--budget`` seconds). Timed from the restore's first call to the
first resumed step's batch in hand: ours, the handler's constructor (it restores the
latest checkpoint), ``track_input``, ``iter``, ``next`` and the ``run()`` of that step;
``track_input(build)`` is timed the same way (``build`` is called inside: once for
the input's length, once at the saved position). TF's, ``iter``,
``Checkpoint.restore`` and ``next``. Every restored batch is checked
against the batch the saving iterator gave next. On the index input two more ways are
timed, with no checkpoint: the skip put below the map
(``Dataset.range(N).skip(k).map(...)``) and the input rebuilt at the position
(``Dataset.range(k, N).map(...)``); and on both inputs a new iterator with no position.
A figure is the median of its restores; "per million elements" is the growth from the
first position to the last. The figure ends with the 1-minute load average at the
bench's start and end (a shared machine's other work slows every row).

    TFH_FIGURES_DIR=docs/figures python benches/bench_input_position.py [--repeats 3] [--budget 15]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _report

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

N = 2_000_000
BUFFER = 200_000
BATCH = 100
INDEX_SEED = [1, 2]
POSITIONS = (1_000, 100_000, 1_000_000)
INPUTS = {
    "buffer": f"`shuffle({BUFFER:,})` buffer",
    "index": "`index_shuffle` map",
}
#: The ways of restoring timed on each input, in the order of the tables' rows.
METHODS = {
    "buffer": ("ours", "tf", "new"),
    "index": ("ours", "builder", "tf", "skip_below", "rebuilt", "new"),
}
METHOD_NAMES = {
    "ours": "ours: `dataset.skip` replay",
    "builder": "ours: `track_input(builder)`, random access",
    "tf": "TF's iterator checkpoint",
    "skip_below": "`range(N).skip(k).map(...)`: skip below the map",
    "rebuilt": "`range(k, N).map(...)`: rebuilt at the position",
    "new": "a new iterator, no position (element 0, whatever the position)",
}
RESULT = "RESULT "


def make(source: str, start: int = 0, skip_below: int = 0):
    """The input: ``buffer`` or ``index`` (the latter from element ``start``, or with
    ``skip_below`` elements skipped before its map)."""
    import tensorflow as tf

    if source == "buffer":
        return tf.data.Dataset.range(N).shuffle(BUFFER, seed=1).batch(BATCH)

    def shuffled(i):
        return tf.random.experimental.index_shuffle(i, seed=INDEX_SEED, max_index=N - 1)

    ds = tf.data.Dataset.range(start, N)
    if skip_below:
        ds = ds.skip(skip_below)
    return ds.map(shuffled).batch(BATCH)


def build(iteration, batch):
    """The index input as ``track_input`` takes a builder: pass ``iteration`` (its
    own permutation; pass 0 is :func:`make`'s ``index``) from its ``batch``-th batch."""
    import tensorflow as tf

    seed = tf.constant([INDEX_SEED[0], INDEX_SEED[1] + iteration], tf.int64)

    def shuffled(i):
        return tf.random.experimental.index_shuffle(i, seed=seed, max_index=N - 1)

    return tf.data.Dataset.range(batch * BATCH, N).map(shuffled).batch(BATCH)


def load() -> str:
    """The 1-minute load average."""
    try:
        with open("/proc/loadavg") as f:
            return f.read().split()[0]
    except OSError:
        return "?"


def checkpoint_bytes(prefix: str) -> int:
    """Bytes of a checkpoint's ``.index`` and ``.data`` files."""
    return sum(os.path.getsize(p) for p in glob.glob(prefix + ".*"))


def noop(batch) -> None:
    return None


# --------------------------------------------------------------------- save side


def save_side(source: str, root: Path, positions: list, builder: bool = False) -> dict:
    """Saves ours and TF's checkpoint of one iterator at each position; returns the
    bytes and the batch that came next. ``builder``: the index input given to
    ``track_input`` as :func:`build`, ours only (in ``root/index/builder-*``)."""
    import tensorflow as tf
    from tf_failure_handling import PreemptionCheckpointHandler
    from tf_failure_handling._protocol import input_position

    here = root / source
    name = "builder" if builder else "ours"
    plain = PreemptionCheckpointHandler(
        None, tf.train.Checkpoint(step=tf.Variable(0)), str(here / "ours-plain")
    )
    plain._save_checkpoint()
    plain.close()
    ours_base = checkpoint_bytes(tf.train.latest_checkpoint(str(here / "ours-plain")))
    step = tf.Variable(0)
    tf_base = checkpoint_bytes(tf.train.Checkpoint(step=step).write(str(here / "tf-plain" / "c")))

    handler = PreemptionCheckpointHandler(
        None, tf.train.Checkpoint(step=tf.Variable(0)), str(here / name)
    )
    dataset = handler.track_input(build if builder else make(source))
    assert handler._input_tracker.why_not is None, handler._input_tracker.why_not
    iterator = iter(dataset)
    targets = {p // BATCH: p for p in positions}
    out: dict = {"positions": {}}
    started = time.perf_counter()
    for runs in range(max(targets) + 1):
        at = targets.get(runs)
        if at is not None:
            t0 = time.perf_counter()
            handler._save_checkpoint()
            ours_save = time.perf_counter() - t0
            kept = here / f"{name}-{at}"
            shutil.copytree(here / name, kept)
            prefix = tf.train.latest_checkpoint(str(kept))
            state = tf.train.load_checkpoint(prefix).get_tensor(input_position.STATE_KEY)
            out["positions"][at] = {
                "ours_bytes": checkpoint_bytes(prefix) - ours_base,
                "ours_state": len(state),
                "ours_state_text": state.decode(),
                "ours_save": ours_save,
            }
            if not builder:
                t0 = time.perf_counter()
                tf_prefix = tf.train.Checkpoint(step=step, iterator=iterator).write(
                    str(here / f"tf-{at}" / "c")
                )
                out["positions"][at].update(
                    tf_bytes=checkpoint_bytes(tf_prefix) - tf_base,
                    tf_save=time.perf_counter() - t0,
                    tf_prefix=tf_prefix,
                )
        batch = next(iterator)
        handler.run(noop, batch)
        if runs == 0:
            out["first"] = batch.numpy().tolist()
        if at is not None:
            out["positions"][at]["next"] = batch.numpy().tolist()
    handler.close()
    out["seconds"] = time.perf_counter() - started
    return out


# ------------------------------------------------------------------ restore side


def restore_once(source: str, method: str, root: Path, at: int, tf_prefix: str) -> tuple:
    """One restore at ``at`` elements: (seconds to the first step's batch, the batch)."""
    import tensorflow as tf

    if method in ("ours", "builder"):
        from tf_failure_handling import PreemptionCheckpointHandler

        dataset = build if method == "builder" else make(source)
        ckpt = tf.train.Checkpoint(step=tf.Variable(0))
        t0 = time.perf_counter()
        handler = PreemptionCheckpointHandler(None, ckpt, str(root / source / f"{method}-{at}"))
        dataset = handler.track_input(dataset)
        batch = next(iter(dataset))
        handler.run(noop, batch)
        seconds = time.perf_counter() - t0
        handler.close()
        return seconds, batch.numpy().tolist()
    if method == "tf":
        dataset = make(source)
        step = tf.Variable(0)
        t0 = time.perf_counter()
        iterator = iter(dataset)
        tf.train.Checkpoint(step=step, iterator=iterator).restore(tf_prefix)
        batch = next(iterator)
        return time.perf_counter() - t0, batch.numpy().tolist()
    t0 = time.perf_counter()
    if method == "skip_below":
        dataset = make(source, skip_below=at)
    elif method == "rebuilt":
        dataset = make(source, start=at)
    else:  # new: no position
        dataset = make(source)
    batch = next(iter(dataset))
    return time.perf_counter() - t0, batch.numpy().tolist()


def restore_side(args) -> int:
    """The subprocess: every restore of one input by one method, as JSON on stdout."""
    root = Path(args.root)
    saved = json.loads((root / "saved.json").read_text())[args.source]
    positions = [0] if args.method == "new" else args.positions
    nexts = saved["builder"] if args.method == "builder" else saved
    expected = {
        p: saved["first"] if p == 0 else nexts["positions"][str(p)]["next"] for p in positions
    }
    prefixes = {p: saved["positions"].get(str(p), {}).get("tf_prefix") for p in positions}
    # warm-up: one untimed restore at the first position
    restore_once(args.source, args.method, root, positions[0], prefixes[positions[0]])
    times: dict = {p: [] for p in positions}
    for _ in range(args.repeats):
        for p in positions:
            if times[p] and sum(times[p]) >= args.budget:
                continue
            seconds, batch = restore_once(args.source, args.method, root, p, prefixes[p])
            if batch != expected[p]:
                print(
                    f"{args.source} {args.method} at {p}: restored batch starts "
                    f"{batch[:5]}, expected {expected[p][:5]}",
                    file=sys.stderr,
                )
                return 1
            times[p].append(seconds)
    print(RESULT + json.dumps(times), flush=True)
    return 0


def run_restores(source: str, method: str, root: Path, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--restore",
        source,
        method,
        "--root",
        str(root),
        "--repeats",
        str(args.repeats),
        "--budget",
        str(args.budget),
        "--positions",
        *map(str, args.positions),
    ]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"restore subprocess {source} {method} failed (exit {proc.returncode})")
    times = {int(k): v for k, v in json.loads(lines[-1][len(RESULT) :]).items()}
    shown = "; ".join(
        f"{p:,}: " + ", ".join(_report.duration(s) for s in v) for p, v in times.items()
    )
    print(f"  restore {source:6} {method:10} ({took:.0f} s with its start) {shown}", flush=True)
    return times


# ------------------------------------------------------------------------ tables


def size(n: int) -> str:
    """``38.0 MiB``, ``2,581 B``."""
    if n >= 1 << 20:
        return f"{n / (1 << 20):.1f} MiB"
    if n >= 100 << 10:
        return f"{n / (1 << 10):.0f} KiB"
    return f"{n:,} B"


def significant(x: float, digits: int = 2) -> str:
    """``141,459`` -> ``140,000``: a ratio of bytes, to two significant digits."""
    return f"{float(f'{x:.{digits}g}'):,.0f}"


def part(ours: float, theirs: float) -> str:
    """ours/TF for bytes: ``1/1,234`` when ours is the smaller."""
    if ours <= 0 or theirs <= 0:
        return "-"
    if ours < theirs:
        return f"1/{significant(theirs / ours)}"
    return _report.ratio(ours / theirs)


def time_ratio(ours: float, theirs: float) -> str:
    r = ours / theirs
    if r < 0.1:
        return f"{r:.3f}{_report.TIMES}"
    return _report.ratio(r)


def growth(times: dict) -> str:
    """Seconds per million elements, from the first position to the last."""
    ps = sorted(times)
    if len(ps) < 2:
        return ""
    lo, hi = ps[0], ps[-1]
    slope = (_report.median(times[hi]) - _report.median(times[lo])) / (hi - lo) * 1e6
    return _report.duration(slope)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--budget", type=float, default=15.0, help="seconds after which a position's restores stop"
    )
    p.add_argument("--positions", type=int, nargs="+", default=list(POSITIONS))
    p.add_argument("--restore", nargs=2, metavar=("INPUT", "METHOD"), help=argparse.SUPPRESS)
    p.add_argument("--root", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if any(pos % BATCH or pos <= 0 for pos in args.positions):
        p.error(f"positions must be positive multiples of the batch ({BATCH})")
    args.positions = sorted(set(args.positions))
    if args.restore:
        args.source, args.method = args.restore
        return restore_side(args)

    started = time.perf_counter()
    load_at_start = load()
    print(f"  1-minute load average at the start: {load_at_start}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="tfh-bench-input-"))
    try:
        saved = {}
        for source in METHODS:
            saved[source] = save_side(source, root, args.positions)
            for at, s in saved[source]["positions"].items():
                print(
                    f"  saved  {source:6} at {at:>9,}: ours +{s['ours_bytes']:,} B "
                    f"(state {s['ours_state']} B: {s['ours_state_text']}) in "
                    f"{_report.duration(s['ours_save'])}; TF +{s['tf_bytes']:,} B in "
                    f"{_report.duration(s['tf_save'])}",
                    flush=True,
                )
            print(f"  save side {source}: {saved[source]['seconds']:.0f} s", flush=True)
            if "builder" in METHODS[source]:
                built = saved[source]["builder"] = save_side(
                    source, root, args.positions, builder=True
                )
                for at, s in built["positions"].items():
                    # the same first pass: TF's checkpoint of the other iterator fits it
                    same = s["next"] == saved[source]["positions"][at]["next"]
                    if not same or built["first"] != saved[source]["first"]:
                        raise SystemExit(f"build(0, 0) is not the {source} input at {at}")
                    print(
                        f"  saved  {source:6} at {at:>9,} by track_input(build): ours "
                        f"+{s['ours_bytes']:,} B (state {s['ours_state']} B: "
                        f"{s['ours_state_text']}) in {_report.duration(s['ours_save'])}",
                        flush=True,
                    )
                print(f"  save side {source} builder: {built['seconds']:.0f} s", flush=True)
        (root / "saved.json").write_text(json.dumps(saved))
        times = {
            (source, method): run_restores(source, method, root, args)
            for source, methods in METHODS.items()
            for method in methods
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def med(source: str, method: str, at: int) -> float:
        return _report.median(times[(source, method)][at])

    main_rows = []
    for source, methods in METHODS.items():
        for method in ("ours", "builder"):
            if method not in methods:
                continue
            name = INPUTS[source]
            if "builder" in methods:
                name += ", `track_input(builder)`" if method == "builder" else ", replayed"
            ours_saved = saved[source]["builder"] if method == "builder" else saved[source]
            for at in args.positions:
                s = ours_saved["positions"][at]
                tf_bytes = saved[source]["positions"][at]["tf_bytes"]
                ours, theirs = med(source, method, at), med(source, "tf", at)
                main_rows.append(
                    [
                        f"{name}, {at:,} elements",
                        f"{size(s['ours_bytes'])} (state {s['ours_state']} B)",
                        size(tf_bytes),
                        part(s["ours_bytes"], tf_bytes),
                        _report.duration(ours),
                        _report.duration(theirs),
                        time_ratio(ours, theirs),
                    ]
                )
    header = [
        "input, position into the epoch",
        "bytes the position adds per worker: ours",
        "TF's iterator",
        "ours/TF",
        "restore to the first step: ours",
        "TF's iterator",
        "ours/TF",
    ]
    way_rows = []
    for source, methods in METHODS.items():
        for method in methods:
            t = times[(source, method)]
            if method == "new":
                first = _report.duration(_report.median(t[0]))
                cells = [first] + [""] * (len(args.positions) - 1)
                rate = ""
            else:
                cells = [_report.duration(_report.median(t[at])) for at in args.positions]
                rate = growth(t)
            way_rows.append([METHOD_NAMES[method], INPUTS[source], *cells, rate])
    way_header = [
        "to the first batch",
        "input",
        *[f"at {at:,}" for at in args.positions],
        "growth per million elements",
    ]

    def save_median(v: dict, key: str) -> str:
        return _report.duration(_report.median(s[key] for s in v["positions"].values()))

    saves = "; ".join(
        f"{INPUTS[source]}: ours "
        + save_median(v, "ours_save")
        + (
            f" (by `track_input(builder)`: {save_median(v['builder'], 'ours_save')})"
            if "builder" in v
            else ""
        )
        + ", TF's "
        + save_median(v, "tf_save")
        for source, v in saved.items()
    )
    text = "\n\n".join(
        [
            _report.markdown(header, main_rows),
            "Each way to the first batch after a restart, by position (elements into the "
            f"epoch; median of {args.repeats} restores, fewer where a position's restores "
            f"had taken {args.budget:g} s):",
            _report.markdown(way_header, way_rows),
            "The save at the agreed step (a whole checkpoint: a step variable and the "
            f"position; median of the positions' saves): {saves}.",
            f"1-minute load average at the bench's start and end: {load_at_start}, "
            f"{load()} (other work on the machine slows every row).",
        ]
    )
    print()
    print("README, Input position:")
    print()
    print(text)
    print()
    print(f"Whole bench: {time.perf_counter() - started:.0f} s.", flush=True)
    _report.write_figure("Input position", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
