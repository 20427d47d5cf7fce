"""The checks of the ``ps_preemption`` trial (``process_trials.py`` states them).

They read what the processes printed (``EVENT`` lines: ``restored``, ``epoch`` and
``done`` carry the run count and the PS ``counter``) and the coordinator's preemption
records (``tf_failure_handling.records``, beside its checkpoints). The counter's excess
over the run count is followed through each coordinator life, from ``restored`` through
every ``epoch`` (a ``join()`` returned: nothing in flight) to ``done`` or to the save
the next life restores; each step of it is a segment, and a segment's growth must be

* 0 when no fault that TensorFlow's at-least-once may answer with a re-execution (a
  server SIGKILLed or paused, or gone on its own) touched it -- a notice, a drain, a
  coordinator's crash lose and duplicate nothing;
* within ``[0, K]`` when it ends at a save, K being the closures the coordinator's
  ``save_start`` record names as in flight at the save's bound (``in_flight_at_bound``;
  0 when absent);
* anything ``>= 0`` otherwise: those are TensorFlow's documented duplicates, counted.

It never shrinks (a shrinking excess is an update lost).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from typing import Optional

from integration.mwms_worker import tail

from .plans import PS_ROLES
from .ps_preemption import (
    PEER_TIMEOUT,
    RESTART_CODE,
    TAINT_AFTER,
    FaultDriver,
    Incarnation,
    Launcher,
)
from .report import TrialResult


@dataclasses.dataclass
class Point:
    """The counter's excess over the run count at one moment of a coordinator life."""

    t: float
    runs: int
    counter: int
    kind: str  # restore, epoch, done, save
    k: int = 0  # save: closures the records name as in flight at the save's bound
    k_source: str = ""
    #: save: its ``save_start`` line, written once the bound was over and every worker
    #: held; a kill or a pause after it re-executes nothing before the save reads the PS.
    cut: Optional[float] = None

    @property
    def last_cause(self) -> float:
        """The latest moment a fault can have changed what this point shows."""
        return self.t if self.cut is None else self.cut

    @property
    def excess(self) -> int:
        return self.counter - self.runs


def _chief_saves(launcher: Launcher) -> list:
    """The coordinator's preemptions with a save, from its records (oldest first)."""
    from tf_failure_handling import records

    folder = launcher.ckpt / records.DEFAULT_SUBDIR
    try:
        found = records.load(folder)
    except FileNotFoundError:
        return []
    return sorted(
        (p for p in found.preemptions if p.job == "chief" and p.save_start is not None),
        key=lambda p: p.save_start,
    )


def _task_releases(launcher: Launcher) -> list:
    from tf_failure_handling import records

    try:
        found = records.load(launcher.ckpt / records.DEFAULT_SUBDIR)
    except FileNotFoundError:
        return []
    return [p for p in found.preemptions if p.job in ("ps", "worker") and p.exit_time]


def _taints(launcher: Launcher, driver: FaultDriver) -> list:
    """Windows in which TensorFlow's at-least-once may re-execute a closure: a server
    SIGKILLed or paused (until TAINT_AFTER after its SIGCONT), or gone on its own."""
    windows = []
    for f in driver.faults:
        if f.fired_at is None or f.role == "coordinator" or f.signal == "SIGTERM":
            continue
        windows.append((f.fired_at, (f.continued_at or f.fired_at) + TAINT_AFTER, f))
    for role in ("ps0", "worker0", "worker1"):
        for inc in launcher.history[role]:
            if inc.exited_at is None or inc.signals or inc.killed_by_launcher:
                continue
            windows.append((inc.exited_at - 1.0, inc.exited_at + TAINT_AFTER, inc.name))
    return windows


def check(launcher: Launcher, driver: FaultDriver, result: TrialResult, steps: int) -> None:
    """Checks the invariants of the kind (``process_trials.py``) into ``result``."""
    t0 = launcher.history["coordinator"][0].started
    saves = _chief_saves(launcher)
    lives = launcher.history["coordinator"]
    result.notes["faults"] = [f.record(t0) for f in driver.faults]
    result.notes["lives"] = [
        {
            "pid": inc.pid,
            "restored": _pair(inc.first("restored")),
            "done": _pair(inc.first("done")),
            "exit": inc.exit_code,
            "signals": [n for _, n in inc.signals],
            "at_s": round(inc.started - t0, 1),
        }
        for inc in lives
    ]
    result.notes["restarts"] = {r: len(launcher.history[r]) - 1 for r in PS_ROLES}
    result.notes["saves"] = [
        {
            "pid": p.pid,
            "step": p.agreed_step,
            "ended": p.save_end is not None,
            "source": p.source,
            "in_flight_at_bound": p.extra.get("in_flight_at_bound"),
            "queued_at_bound": p.extra.get("queued_at_bound"),
        }
        for p in saves
    ]
    _check_restores(lives, saves, result)
    _check_excess(launcher, driver, lives, saves, result)
    _check_coordinator_exits(launcher, driver, saves, result)
    _check_server_exits(launcher, result)
    final = lives[-1].first("done") if launcher.finished else None
    if final is None:
        result.violations.append("training did not reach its end (no done from the last life)")
    else:
        if final["runs"] != steps:
            result.violations.append(f"done after {final['runs']} runs, not {steps}")
        result.notes["final_excess"] = final["counter"] - final["runs"]


def _pair(event: Optional[dict]):
    return None if event is None else [event["runs"], event["counter"]]


def _check_restores(lives: list, saves: list, result: TrialResult) -> None:
    """Each life restores the last complete checkpoint, whose counter has every run."""
    for inc in lives:
        restored = inc.first("restored")
        if restored is None:
            continue
        complete = [p for p in saves if p.save_end is not None and p.save_end <= inc.started]
        expected = complete[-1].agreed_step if complete else 0
        # A save whose process died after the files and before its save_end line is
        # complete too, without the record saying so.
        unrecorded = {
            p.agreed_step
            for p in saves
            if p.save_end is None and p.save_start <= inc.started and p.agreed_step > expected
        }
        if restored["runs"] != expected and restored["runs"] not in unrecorded:
            result.violations.append(
                f"{inc.name} restored run {restored['runs']}; the last complete checkpoint "
                f"is of run {expected}"
            )
            if restored["runs"] < expected:
                result.lost_steps = max(result.lost_steps, expected - restored["runs"])
        if restored["counter"] < restored["runs"]:
            result.lost_closures += restored["runs"] - restored["counter"]
            result.violations.append(
                f"{inc.name} restored counter {restored['counter']} < runs {restored['runs']}: "
                f"{restored['runs'] - restored['counter']} closure(s) counted and lost"
            )


def _life_points(inc: Incarnation, following: list, saves: list) -> list:
    restored = inc.first("restored")
    if restored is None:
        return []
    points = [Point(restored["t"], restored["runs"], restored["counter"], "restore")]
    points += [Point(e["t"], e["runs"], e["counter"], "epoch") for e in inc.events("epoch")]
    done = inc.first("done")
    if done is not None:
        points.append(Point(done["t"], done["runs"], done["counter"], "done"))
    mine = [p for p in saves if p.pid == inc.pid and p.save_end is not None]
    if mine and following:
        save = mine[-1]
        restoring = next((n.first("restored") for n in following if n.first("restored")), None)
        if restoring is not None and restoring["runs"] == save.agreed_step:
            k = save.extra.get("in_flight_at_bound")
            points.append(
                Point(
                    save.save_end,
                    restoring["runs"],
                    restoring["counter"],
                    "save",
                    k=int(k or 0),
                    k_source="records" if k is not None else "absent",
                    cut=save.save_start,
                )
            )
    return points


def _check_excess(
    launcher: Launcher, driver: FaultDriver, lives: list, saves: list, result: TrialResult
) -> None:
    """Nothing lost, nothing applied twice except what a save's records name or what
    TensorFlow's at-least-once re-executed after a kill or a pause (counted)."""
    taints = _taints(launcher, driver)
    segments = []
    named = 0
    for n, inc in enumerate(lives):
        points = _life_points(inc, lives[n + 1 :], saves)
        for a, b in itertools.pairwise(points):
            delta = b.excess - a.excess
            why = [w for start, end, w in taints if start <= b.last_cause and end >= a.t]
            label = (
                f"{inc.name}: excess {a.excess} at {a.kind} (run {a.runs}) -> {b.excess} at "
                f"{b.kind} (run {b.runs})"
            )
            segments.append({"life": inc.name, "from": a.kind, "to": b.kind, "delta": delta})
            if delta < 0:
                result.lost_closures += -delta
                result.violations.append(f"{label}: {-delta} closure effect(s) lost")
            elif why:
                result.duplicate_closures += delta
                if delta:
                    segments[-1]["duplicates_after"] = [
                        w if isinstance(w, str) else f"{w.signal} {w.role}" for w in why
                    ]
            elif b.kind == "save":
                segments[-1]["k"] = b.k
                if delta > b.k:
                    result.violations.append(
                        f"{label}: {delta} closure(s) applied beyond the checkpoint's run "
                        f"count, the records name {b.k} in flight at the save's bound "
                        f"(in_flight_at_bound {b.k_source}); harness saw "
                        f"{_bound_seen(inc)}"
                    )
                named += min(delta, b.k)
            elif delta > 0:
                notices = [
                    f"{f.signal} {f.role}"
                    for f in driver.faults
                    if f.fired_at is not None and a.t - 1.0 <= f.fired_at <= b.t
                ]
                result.violations.append(
                    f"{label}: {delta} closure(s) applied twice with no kill or pause in "
                    f"between (faults in this interval: {notices or 'none'})"
                )
    result.notes["excess_segments"] = [s for s in segments if s["delta"] or "k" in s]
    result.notes["named_in_flight_applied"] = named


def _bound_seen(inc: Incarnation) -> list:
    return [e.get("result") for e in inc.events("bound_end")]


def _check_coordinator_exits(
    launcher: Launcher, driver: FaultDriver, saves: list, result: TrialResult
) -> None:
    """The coordinator ends with 0 after done, 42 after a notice (its own or its PS's),
    or fails when a server it depended on went (noted; the launcher restarts it)."""
    for inc in launcher.history["coordinator"]:
        code = inc.exit_code
        if code is None or code == 0 or inc.signalled("SIGKILL") or inc.killed_by_launcher:
            continue
        if code == RESTART_CODE:
            if not inc.signalled("SIGTERM") and not [p for p in saves if p.pid == inc.pid]:
                result.violations.append(f"{inc.name} exited {code} with no notice")
            continue
        causes = _servers_gone(launcher, driver, inc)
        result.notes.setdefault("coordinator_failures", []).append(
            {"life": inc.name, "exit": code, "servers_gone": causes}
        )
        if not causes:
            after = " after its notice" if inc.signalled("SIGTERM") else ""
            result.violations.append(
                f"{inc.name} failed (exit {code}){after} while no server it depends on "
                f"went: {tail(inc.stderr, 3)[-400:]}"
            )


def _servers_gone(launcher: Launcher, driver: FaultDriver, life: Incarnation) -> list:
    """What happened to the servers during ``life`` that may take a coordinator down:
    a server SIGKILLed or paused; the PS gone; any server gone before ``life`` was up
    (connecting to the cluster). A worker that leaves after its drain is not one: the
    coordinator let it go."""
    end = life.exited_at or time.time()
    restored = life.first("restored")
    up = restored["t"] if restored else end
    found = [
        f"{f.signal} {f.role}"
        for f in driver.faults
        if f.role != "coordinator"
        and f.signal != "SIGTERM"
        and f.fired_at is not None
        and life.started - 1.0 <= f.fired_at <= end
    ]
    for role in ("ps0", "worker0", "worker1"):
        for inc in launcher.history[role]:
            if inc.exited_at is None or not life.started <= inc.exited_at <= end + 1.0:
                continue
            if role == "ps0" or inc.exited_at <= up:
                found.append(f"{inc.name} exited {inc.exit_code}")
    return found


def _check_server_exits(launcher: Launcher, result: TrialResult) -> None:
    """A notice leads to the task's exit with 42, released by the coordinator; a
    server never ends on its own."""
    releases = _task_releases(launcher)
    lives = launcher.history["coordinator"]
    exits = []
    for role in ("ps0", "worker0", "worker1"):
        job, task = role[:-1], int(role[-1])
        for inc in launcher.history[role]:
            terms = inc.signalled("SIGTERM")
            kills = inc.signalled("SIGKILL")
            if not terms:
                if inc.exited_at is not None and not kills and not inc.killed_by_launcher:
                    result.violations.append(
                        f"{inc.name} exited {inc.exit_code} with no signal: "
                        f"{tail(inc.stderr, 3)[-400:]}"
                    )
                continue
            if kills or inc.exited_at is None:
                continue
            if inc.killed_by_launcher:
                if launcher.finished and inc.name not in {v.split()[0] for v in result.violations}:
                    result.notes.setdefault("notices_outlived_training", []).append(inc.name)
                continue
            took = round(inc.exited_at - terms[0], 2)
            exits.append({"task": inc.name, "code": inc.exit_code, "after_s": took})
            if inc.exit_code != RESTART_CODE:
                result.violations.append(
                    f"{inc.name} exited {inc.exit_code} after its notice, not {RESTART_CODE}"
                )
                continue
            # The task's own word when its script prints it (``exiting``: released or
            # not), else the coordinator's records of its releases.
            said = [e.get("released") for e in inc.events("exiting")]
            released = (
                any(said)
                if said
                else bool(inc.events("released"))
                or any(
                    p.job == job
                    and int(p.task) == task
                    and p.extra.get("released")
                    and terms[0] - 1.0 <= p.exit_time <= inc.exited_at + 1.0
                    for p in releases
                )
            )
            exits[-1]["released"] = released
            # Owed only if a coordinator was up long enough during the wait to act.
            owed = any(
                c.first("restored") is not None
                and c.first("restored")["t"] <= inc.exited_at - 5.0
                and (c.exited_at or time.time()) >= terms[0] + 5.0
                for c in lives
            )
            if not released and owed:
                result.violations.append(
                    f"{inc.name} exited {RESTART_CODE} {took}s after its SIGTERM without a "
                    f"release by the coordinator: its notice was not acted on (serve()'s own "
                    f"bound of {PEER_TIMEOUT:.0f}s ran out)"
                )
    result.notes["server_exits"] = exits
