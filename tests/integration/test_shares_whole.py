"""``TF_FAILURE_HANDLING_NON_CHIEF_SAVES=shares`` is whole or absent (issue 50 items 3
and 4), with real MultiWorkerMirroredStrategy workers on 127.0.0.1.

A folder the workers do not share is made on one machine by giving the non-chief
another path: a real folder of its own (found at construction), or a symbolic link to
the chief's folder that the test points elsewhere once both handlers are built (a
folder that stops being shared after the construction's probe).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from .conftest import STARTUP_BOUND, require_impl
from .test_mwms_handler import (
    DEFAULT_EXIT_CODE,
    HANG_BOUND,
    NON_CHIEF_SAVES_ENV,
    STEP_SLEEP,
    STEPS,
    check_preemption_exit,
    notify_after_progress,
)

#: The exit code of a non-chief whose share was not merged (save.UNMERGED_EXIT_CODE).
UNMERGED_EXIT_CODE = 75
#: Bound on the workers' exit after their construction failed (a hang bound).
CONSTRUCTION_EXIT_BOUND = STARTUP_BOUND + 90.0
SHARES = {NON_CHIEF_SAVES_ENV: "shares"}
#: The folder of the survivors' marks and claims (survivor_folder.FOLDER), made by the
#: chief of a multi-worker job at its start.
SURVIVORS_FOLDER = "lost-worker"


@pytest.mark.timeout(CONSTRUCTION_EXIT_BOUND + 60)
def test_a_folder_the_non_chief_does_not_share_is_an_error_at_construction(
    cluster_factory, tmp_path
):
    """The non-chief's checkpoint folder is another folder: both workers raise
    FailedPreconditionError while building the handler, before any step (no ``start``
    event) and so before any notice could come, naming the probe file. On main
    (2f3c22f) both trained to the end (exit 0): the folder was found out at the first
    save, the preemption's."""
    require_impl("ours")
    other = tmp_path / "other" / "ckpt"
    cluster = cluster_factory(
        name="unshared",
        impl="ours",
        steps=20,
        step_sleep=STEP_SLEEP,
        env=SHARES,
        worker_args={1: ["--ckpt-dir", str(other)]},
    )
    cluster.start()
    codes = cluster.wait(CONSTRUCTION_EXIT_BOUND, "both workers to fail at construction")
    details = "\n".join(cluster.describe(i) for i in range(2))
    assert all(c not in (0, None) for c in codes), f"exit codes {codes}\n{details}"
    for i in range(2):
        assert not cluster.events(i, "start"), f"worker {i} was built\n{details}"
        stderr = cluster.stderr_paths[i].read_text(errors="replace")
        assert "FailedPreconditionError" in stderr and "cannot see the probe file" in stderr, (
            details
        )
    assert not list(cluster.ckpt_dir.glob("tf_failure_handling_probe_*")), "probe left"


def _next_name(ckpt_dir) -> tuple[str, str]:
    """(the last save's name, the next save's), from the folder's ``checkpoint``."""
    import tensorflow as tf

    last = os.path.basename(tf.train.latest_checkpoint(str(ckpt_dir)))
    return last, f"ckpt-{int(last.split('-')[1]) + 1}"


def _leave_a_stale_part(ckpt_dir, last: str, name: str) -> None:
    """What an interrupted attempt at ``name`` leaves: worker 1's part of TensorFlow's
    temporary layout, ``<name>_temp/part-00001-of-00002``, holding the tensors the core's
    plan gives worker 1 (as the package splits them) with stale values (+1000)."""
    import tensorflow as tf
    from tf_failure_handling._integrations.tf_shares import OBJECT_GRAPH_KEY
    from tf_failure_handling._native import assign_shares

    reader = tf.train.load_checkpoint(str(ckpt_dir / last))
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()
    keys = sorted(shapes)
    sizes = [
        int(tf.TensorShape(shapes[k]).num_elements() or 0) * (tf.as_dtype(dtypes[k]).size or 0)
        for k in keys
    ]
    owner, _ = assign_shares(sizes, [k == OBJECT_GRAPH_KEY for k in keys], 2)
    mine = [k for k, w in zip(keys, owner) if w == 1]
    assert mine, f"the plan gives worker 1 nothing: {keys}"
    tensors = []
    for k in mine:
        value = tf.constant(reader.get_tensor(k))
        tensors.append(value + 1000 if value.dtype.is_floating else value)
    part = ckpt_dir / f"{name}_temp" / "part-00001-of-00002"
    part.parent.mkdir(parents=True, exist_ok=True)
    tf.raw_ops.SaveV2(
        prefix=str(part), tensor_names=mine, shape_and_slices=[""] * len(mine), tensors=tensors
    )


def _exit_records(root) -> list[dict]:
    """Every ``exit`` line of the records under ``root``."""
    found = []
    for path in root.rglob("*"):
        if not path.is_file() or path.suffix not in (".json", ".jsonl", ""):
            continue
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if '"exit"' not in line:
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("stage") == "exit":
                found.append(record)
    return found


@pytest.mark.timeout(HANG_BOUND + 240)
def test_a_stale_part_and_a_folder_no_longer_shared_fail_the_save(cluster_factory, tmp_path):
    """A good save (ckpt-K) first. Then a leftover ``ckpt-(K+1)_temp/part-00001-of-00002``
    of an interrupted attempt (stale values) in the chief's folder, and the non-chief's
    folder, shared when the handlers are built, no longer the chief's at the notice. The
    save fails: nothing is merged, ``checkpoint`` names ckpt-K, the chief's error says
    which part is not there, and both workers exit with UNMERGED_EXIT_CODE (not 42),
    their records saying why (until issue 60 the chief raised its error: exit 1). On
    main (2f3c22f) the chief merged its fresh part with the stale one: ckpt-(K+1) was
    written and named in ``checkpoint``, and both exited 42."""
    require_impl("ours")
    first = _a_first_checkpoint(cluster_factory)
    chief_dir = first.ckpt_dir
    last, name = _next_name(chief_dir)
    _leave_a_stale_part(chief_dir, last, name)

    # Both workers are given the same relative path, train/ckpt, from other working
    # folders: the non-chief's train is a link to the chief's while the handlers are
    # built, then a copy elsewhere (what a host that does not share the chief's folder
    # sees, under the same path).
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(chief_dir, elsewhere / chief_dir.name)
    shutil.rmtree(elsewhere / chief_dir.name / f"{name}_temp")
    (tmp_path / "n1").mkdir()
    view = tmp_path / "n1" / chief_dir.parent.name
    view.symlink_to(chief_dir.parent, target_is_directory=True)
    relative = chief_dir.relative_to(tmp_path)
    second = cluster_factory(
        name="second",
        impl="ours",
        steps=STEPS * 4,
        step_sleep=STEP_SLEEP,
        env=SHARES,
        ckpt_dir=relative,
        cwds={0: tmp_path, 1: tmp_path / "n1"},
    )
    second.start()
    second.wait_until(
        lambda: all(second.events(i, "start") for i in range(2)),
        STARTUP_BOUND,
        "both handlers to be built",
    )
    view.unlink()
    view.symlink_to(elsewhere, target_is_directory=True)
    notify_after_progress(second, (1,), min_step=second.progress(0) + 10)
    codes = second.wait(what="the workers to exit after the failed save")
    details = "\n".join(second.describe(i) for i in range(2))

    import tensorflow as tf

    assert os.path.basename(tf.train.latest_checkpoint(str(chief_dir))) == last, details
    assert not list(chief_dir.glob(f"{name}.*")), f"merged anyway\n{details}"
    # The chief too (issue 60): not the restart code, and its records say why.
    assert codes == [UNMERGED_EXIT_CODE] * 2, f"exit codes {codes}\n{details}"
    lines = _task_records(chief_dir, 0, second.events(0, "start")[0]["pid"])
    (error,) = [r["error"] for r in lines if r["stage"] == "error"]
    assert error.startswith("save failed: NotFoundError: ") and "every worker sees" in error
    exits = [r for r in _exit_records(tmp_path) if r.get("code") == UNMERGED_EXIT_CODE]
    assert exits and "not merged" in exits[0].get("reason", ""), (exits, details)


def _task_records(ckpt_dir, task: int, pid: int) -> list[dict]:
    """The record lines worker ``task``'s process ``pid`` wrote (the default records
    folder, ``<checkpoint_dir>/preemption_records/worker-<task>.jsonl``)."""
    path = ckpt_dir / "preemption_records" / f"worker-{task}.jsonl"
    if not path.exists():
        return []
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("pid") == pid:
            lines.append(record)
    return lines


def _notify_once_resumed(cluster) -> None:
    """SIGTERM to worker 1 once both workers were built and trained 10 steps on."""
    cluster.wait_until(
        lambda: all(cluster.events(i, "start") for i in range(2)),
        STARTUP_BOUND,
        "both handlers to be built",
    )
    restored = cluster.events(0, "start")[0]["restored"]
    notify_after_progress(cluster, (1,), min_step=restored + 10)


@pytest.mark.timeout(HANG_BOUND + 240)
def test_a_chief_killed_before_the_state_file_names_the_merge_leaves_no_restart_code(
    cluster_factory,
):
    """A good save (ckpt-K) first. Then the chief ends (``os._exit``, from user-level
    code: ``shares_faults``) in TensorFlow's ``_record_state``, after the merge wrote
    ckpt-(K+1)'s files and before the ``checkpoint`` state file names it. Success: the
    non-chief exits with UNMERGED_EXIT_CODE, not the restart code, its records' ``exit``
    line says why and it wrote no ``save_end``; ``checkpoint`` still names ckpt-K, which
    a restart resumes from. On main (97acf12) the chief reported the merge before the
    state file: the non-chief wrote ``save_end`` and exited 42 for a checkpoint the
    restart never sees."""
    require_impl("ours")
    from .shares_faults import EXIT_AT_RECORD_STATE

    first = _a_first_checkpoint(cluster_factory)
    last, name = _next_name(first.ckpt_dir)

    second, codes, details = _run_with_fault(
        cluster_factory,
        "second",
        "exit-at-record-state",
        "the workers to exit after the chief's end",
    )

    import tensorflow as tf

    assert codes == [EXIT_AT_RECORD_STATE, UNMERGED_EXIT_CODE], f"exit codes {codes}\n{details}"
    latest = tf.train.latest_checkpoint(str(second.ckpt_dir))
    assert latest is not None and os.path.basename(latest) == last, (latest, details)
    pid = second.events(1, "start")[0]["pid"]
    lines = _task_records(second.ckpt_dir, 1, pid)
    stages = [r["stage"] for r in lines]
    assert "save_end" not in stages, (lines, details)
    exits = [r for r in lines if r["stage"] == "exit"]
    assert [r["code"] for r in exits] == [UNMERGED_EXIT_CODE], (lines, details)
    assert "not merged" in exits[0].get("reason", "") and name in exits[0]["reason"], exits

    # The restart resumes from ckpt-K, the checkpoint the state file names.
    third = cluster_factory(
        name="third", impl="ours", steps=STEPS * 4, step_sleep=STEP_SLEEP, env=SHARES
    )
    third.start()
    third.wait_until(
        lambda: all(third.events(i, "start") for i in range(2)),
        STARTUP_BOUND,
        "both restarted handlers to be built",
    )
    reader = tf.train.load_checkpoint(latest)
    runs = int(reader.get_tensor("checkpointed_runs/.ATTRIBUTES/VARIABLE_VALUE"))
    assert [third.events(i, "start")[0]["restored"] for i in range(2)] == [runs, runs]
    third.kill()


def _a_first_checkpoint(cluster_factory):
    """A ``shares`` run of two workers, preempted after its first progress: both exit 42
    with ckpt-K saved. Returns the ended cluster."""
    first = cluster_factory(
        name="first", impl="ours", steps=STEPS, step_sleep=STEP_SLEEP, env=SHARES
    )
    first.start()
    notify_after_progress(first, (1,))
    check_preemption_exit(first, DEFAULT_EXIT_CODE)
    return first


def _run_with_fault(cluster_factory, name: str, fault: str, what: str) -> tuple:
    """A ``shares`` run of two workers whose chief carries ``fault`` (``shares_faults``),
    notified once resumed, to both workers' exits: ``(cluster, exit codes, what the
    workers printed)``; the fault must have fired."""
    cluster = cluster_factory(
        name=name,
        impl="ours",
        steps=STEPS * 4,
        step_sleep=STEP_SLEEP,
        env=SHARES,
        worker_args={0: ["--fault", fault]},
    )
    cluster.start()
    _notify_once_resumed(cluster)
    codes = cluster.wait(what=what)
    details = "\n".join(cluster.describe(i) for i in range(2))
    assert cluster.events(0, "fault"), f"the fault did not fire\n{details}"
    return cluster, codes, details


@pytest.mark.timeout(HANG_BOUND + 120)
def test_a_failed_merge_removes_its_parts_and_both_workers_record_why(cluster_factory):
    """The non-chief's part is cut short (its index halved, from user-level code in the
    chief: ``shares_faults``) after the chief checked it and before the merge:
    ``MergeV2Checkpoints`` fails with ``DataLossError``. Success: nothing of the save is
    left (no ``<name>_temp_<token>/`` parts folder, no ``<name>.index``), no checkpoint is
    named, and each worker exits with UNMERGED_EXIT_CODE, its records holding the
    merge's error and an ``exit`` line with the reason. On main (97acf12) the parts
    folder stayed, the chief raised and exited 1 with no ``exit`` line."""
    require_impl("ours")
    cluster, codes, details = _run_with_fault(
        cluster_factory,
        "truncated",
        "truncate-part-at-merge",
        "the workers to exit after the failed merge",
    )

    import tensorflow as tf

    assert codes == [UNMERGED_EXIT_CODE] * 2, f"exit codes {codes}\n{details}"
    # The records, and the survivors' mark of the job (made at the start), are not the save.
    ours = ("preemption_records", SURVIVORS_FOLDER)
    left = sorted(p.name for p in cluster.ckpt_dir.iterdir() if p.name not in ours)
    assert left == [], f"the failed save left {left}\n{details}"
    assert tf.train.latest_checkpoint(str(cluster.ckpt_dir)) is None
    for task in range(2):
        pid = cluster.events(task, "start")[0]["pid"]
        lines = _task_records(cluster.ckpt_dir, task, pid)
        exits = [r for r in lines if r["stage"] == "exit"]
        assert [r["code"] for r in exits] == [UNMERGED_EXIT_CODE], (task, lines, details)
        assert "not an sstable" in exits[0].get("reason", ""), (task, exits)
        assert "save_end" not in [r["stage"] for r in lines], (task, lines)
    lines = _task_records(cluster.ckpt_dir, 0, cluster.events(0, "start")[0]["pid"])
    errors = [r["error"] for r in lines if r["stage"] == "error"]
    assert len(errors) == 1 and "DataLossError: " in errors[0], errors
    assert "not an sstable" in errors[0], errors
