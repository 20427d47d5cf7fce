"""The ``lost_worker`` trial (issue 62): a worker lost without notice, and what survives.

2 or 3 MWMS workers (``trial_worker.py mwms``) train a deterministic model whose step
also adds one amount to ``pair_a`` and then, in a second all-reduce, to ``pair_b``
(``mwms_worker.py --paired-gap``): a save that keeps one step's first collective and not
its second breaks ``pair_a == pair_b``. Once every worker finished the plan's step, the
target (the chief or a non-chief) is SIGKILLed, SIGSTOPped (resumed with SIGCONT once
the others ended) or cut off (it runs in a network namespace whose veth link goes
down); for the ``agreement`` and ``save`` moments a SIGTERM to a random worker starts a
preemption first, and the fault lands once that preemption's step is published (its
acknowledgements slowed) or once a worker's save began (its saves slowed).

L is the highest step any worker of that life reported finished (``progress``, printed
after each ``run()`` returns: by the harness's own log). Then a clean life with as many
workers restores and trains to the end. Invariants, for our handler:

* no hang: every worker of the faulty life ends within :data:`LOST_BOUND` of the fault
  (a paused one within that of its SIGCONT); the restarted life within :data:`RESTART_BOUND`;
* the restart resumes at L - 1 or later, every worker at the same run;
* no torn checkpoint: the restored ``pair_a == pair_b``;
* the restart ends with exactly an uninterrupted run's weights (the batches are a
  function of the global step: an element trained twice or never would show), after
  :data:`LOST_STEPS` runs.

TensorFlow's handler (every :data:`plans.LOST_TF_EVERY`-th seed) is a variant in its own
row: it saves nothing at a loss, so it resumes at 0 or at its preemption save; its lost
steps (L - the restored run) are measured, not violations, and so are its hangs; its
restart must still end with an uninterrupted run's weights.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Optional

from .harness import (
    Workers,
    await_moment,
    ended_cleanly,
    peer_env,
    reference_weights,
    weights_mismatch,
)
from .netns import Partition, netns_missing
from .plans import Plan
from .report import TrialResult

#: Peer bound of our handlers in these trials (a preemption's acknowledgements; the
#: loss itself is TensorFlow's error, or its heartbeat timeout, about 10 s).
LOST_PEER_TIMEOUT = 10.0
#: From the fault (a paused worker: from its SIGCONT) to that worker's, or every
#: other worker's, end: TF's 10 s heartbeat timeout, the probe, the save, the exit, on
#: 2 busy cores. A hang bound only.
LOST_BOUND = 120.0
#: Run calls of every life: the fault comes by step 31, and each step makes three
#: collectives (the model's and the pair's two).
LOST_STEPS = 60
#: A whole restarted life, startup included (a hang bound: 2 or 3 TF processes
#: starting on 2 cores busy with other tests take most of a minute).
RESTART_BOUND = 300.0
#: Moments of a preemption's protocol that a fault is aimed at (harness.await_moment).
_AWAITED = {"agreement": "during_ack", "save": "during_save"}


def trial(plan: Plan, result: TrialResult, workdir: Path, gcs=None) -> list:
    """Runs ``plan``; with ``gcs`` (``integration.gcs_emulator.GcsEmulator``), every life
    runs inside the emulator's network namespace and checkpoints to ``gs://`` through
    TensorFlow's own GCS file system (a SIGKILL or SIGSTOP: a cut needs a namespace of
    its own)."""
    p = plan.params
    if gcs is not None and p["fault"] == "cut":
        raise ValueError("a cut trial runs in a namespace of its own, not the emulator's")
    if p["fault"] == "cut" and netns_missing(result, "the cut cannot be made"):
        return []
    worker_args = ("--paired-gap", p["paired_gap"])
    reference = reference_weights(
        workdir, LOST_STEPS, p["num_workers"], worker_args, timeout=RESTART_BOUND
    )
    storage = _Storage(workdir, gcs)
    result.notes["ckpt_dir"] = str(storage.ckpt_dir)
    if p["fault"] == "cut":
        with Partition() as net:
            life = _life(p, workdir, worker_args, net, storage)
            try:
                finished = _faulty_life(p, result, life, net)
            finally:
                life.kill()  # before the namespace goes
    else:
        life = _life(p, workdir, worker_args, None, storage)
        try:
            finished = _faulty_life(p, result, life, None)
        finally:
            life.kill()
    if finished is None:
        return [life]
    if gcs is None:
        # What the restart restores: the checkpoint the state file names after the loss.
        result.notes["named"] = named_checkpoint(Path(storage.ckpt_dir))
    return [life, _restart(p, result, workdir, worker_args, reference, finished, storage)]


def named_checkpoint(ckpt: Path) -> Optional[str]:
    """The checkpoint the state file in local folder ``ckpt`` names (None: none)."""
    state = ckpt / "checkpoint"
    text = state.read_text() if state.exists() else ""
    named = re.search(r'^model_checkpoint_path: "(.*)"$', text, re.M)
    return named.group(1) if named else None


class _Storage:
    """Where a trial's lives checkpoint: ``workdir/train/ckpt``, or a ``gs://`` folder
    of the emulator's bucket (the lives then run in its namespace, with its variables)."""

    def __init__(self, workdir: Path, gcs) -> None:
        self.gcs = gcs
        if gcs is None:
            self.ckpt_dir = workdir / "train" / "ckpt"
        else:
            self.ckpt_dir = f"gs://{gcs.bucket}/{workdir.name}/ckpt"

    def env(self) -> dict:
        return {} if self.gcs is None else dict(self.gcs.env)

    def netns(self, n: int):
        return None if self.gcs is None else [self.gcs.namespace] * n


def _life(
    p: dict, workdir: Path, worker_args: tuple, net: Optional[Partition], storage: _Storage
) -> Workers:
    n = p["num_workers"]
    trial_args = ["--ack-delay", p["ack_delay"], "--slow-save", p["slow_save"]]
    env = {**storage.env(), **peer_env(LOST_PEER_TIMEOUT)}
    hosts, netns = None, storage.netns(n)
    if net is not None:
        hosts = [net.host_address] * n
        hosts[p["target"]] = net.ns_address
        netns = [None] * n
        netns[p["target"]] = net.namespace
        env.update(net.env())
    return Workers(
        workdir,
        "lost",
        ckpt_dir=storage.ckpt_dir,
        impl=p["impl"],
        steps=LOST_STEPS,
        hosts=hosts,
        netns=netns,
        env=env,
        trial_args=trial_args,
        worker_args=worker_args,
        num_workers=n,
    ).start()


def _faulty_life(
    p: dict, result: TrialResult, life: Workers, net: Optional[Partition]
) -> Optional[int]:
    """Injects the plan's fault and waits, bounded, for the life to end: L, or None
    when the trial cannot go on (a violation says why)."""
    target, n = p["target"], p["num_workers"]
    problem = life.wait_for_progress(p["step"])
    if problem:
        result.violations.append(f"before the fault: {problem}")
        return None
    if p["moment"] != "training":
        life.signal(p["notice_target"], signal.SIGTERM)
        result.fault("sigterm")
        if not await_moment(life, _AWAITED[p["moment"]]):
            result.notes["moment_missed"] = p["moment"]
    time.sleep(p["delay"])
    if p["fault"] == "cut":
        assert net is not None
        at = net.cut()
        result.fault("cut")
    else:
        at = life.signal(target, getattr(signal, p["fault"]))
        if at is None:  # it had ended already (a preemption that finished first)
            result.notes["target_ended_first"] = life.returncode(target)
            at = time.time()
        else:
            result.fault(p["fault"].lower())
    others = [i for i in range(n) if i != target]
    waited = others if p["fault"] == "SIGSTOP" else list(range(n))
    codes = dict(zip(waited, life.wait(LOST_BOUND, waited)))
    if p["fault"] == "SIGSTOP":
        life.signal(target, signal.SIGCONT)
        codes[target] = life.wait(LOST_BOUND, [target])[0]
    result.notes["exit_codes"] = [codes[i] for i in range(n)]
    result.notes["ended_after_fault_s"] = round(time.time() - at, 1)
    hung = [i for i in range(n) if codes[i] is None]
    if hung:
        life.dump_stacks(hung)
        result.hangs += 1
        if p["impl"] == "ours":
            result.violations.append(
                f"workers {hung} still running {LOST_BOUND:.0f}s after worker {target}'s "
                f"{p['fault']} (a paused one: after its SIGCONT)"
            )
        life.kill()
    finished = max(life.progress(i) for i in range(n))
    result.notes["L"] = finished
    return finished


def _restart(
    p: dict,
    result: TrialResult,
    workdir: Path,
    worker_args: tuple,
    reference: dict,
    finished: int,
    storage: _Storage,
) -> Workers:
    """A clean life: resumes at L - 1 or later (ours), unbroken, ends as uninterrupted."""
    n = p["num_workers"]
    life = Workers(
        workdir,
        "restart",
        ckpt_dir=storage.ckpt_dir,
        impl=p["impl"],
        netns=storage.netns(n),
        env={**storage.env(), **peer_env(LOST_PEER_TIMEOUT)},
        steps=LOST_STEPS,
        step_sleep=0.0,
        worker_args=worker_args,
        num_workers=n,
    ).start()
    if not ended_cleanly(life, result, RESTART_BOUND, ""):
        return life
    starts = [life.events(i, "start") for i in range(n)]
    done = [life.events(i, "done") for i in range(n)]
    if not all(starts) or not all(done):
        result.violations.append("a restarted worker printed no start or done event")
        return life
    restored = [s[0]["restored"] for s in starts]
    result.notes["restored"] = restored
    resumed = min(restored)
    result.lost_steps = max(0, finished - resumed)
    if len(set(restored)) > 1:
        result.violations.append(f"the restarted workers restored different runs: {restored}")
    if p["impl"] == "ours" and resumed < finished - 1:
        result.violations.append(
            f"the restart resumed at run {resumed}; a worker had finished run {finished} "
            f"before the loss (L - 1 = {finished - 1})"
        )
    for i in range(n):
        pair = starts[i][0]["pair"]
        if pair[0] != pair[1]:
            result.mismatched_saves += 1
            result.violations.append(
                f"a torn checkpoint: worker {i} restored pair_a {pair[0]} and pair_b "
                f"{pair[1]} (one step's two collectives, one of them kept)"
            )
        if done[i][0]["total_run_calls"] != LOST_STEPS:
            result.violations.append(
                f"worker {i} ended after {done[i][0]['total_run_calls']} runs, not {LOST_STEPS}"
            )
        mismatch = weights_mismatch(done[i][0]["weights"], reference)
        if mismatch:
            result.violations.append(
                f"worker {i} resumed at run {restored[i]} and ended with other weights "
                f"than an uninterrupted run: {mismatch}"
            )
    return life
