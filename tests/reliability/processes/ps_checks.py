"""The checks of the ``ps_preemption`` trial (``process_trials.py`` states them).

They read what the processes printed (``EVENT`` lines) and the coordinator's
preemption records (``tf_failure_handling.records``, beside its checkpoints).

**Identity, not a sum.** Every closure the coordinator schedules through
``handler.run`` carries its id, the run index (``0..steps-1``), and adds 1 to
``applied[id]`` on a PS; ``applied`` is saved in the checkpoint. Each life prints the
per-id counts it restored (``restored``: the checkpoint's) and the last one those at its
end (``done``); ``run`` says when each id was handed to ``handler.run``. The checkpoints
form a chain: a life's contribution is what the next restored checkpoint, written by its
save, holds beyond the one it restored (a life whose save nobody restored -- killed, or
its save not finished -- contributed nothing: the next life restores over it). Per
segment (a life from its restore to its save, or to ``done``), with ``R0`` the restored
run count, ``R1`` the saved one (``steps`` at ``done``) and ``D[i]`` the count's growth:

* ``R0 <= i < R1``: ``D[i]`` should be 1 (``own``); more is a ``repeat``;
* ``i >= R1``: ``D[i]`` should be 0; each application is ``ahead`` of the checkpoint's
  run count, and the next life runs that id again;
* ``i < R0``: ``D[i]`` should be 0; each is ``stale`` (a closure of an earlier life
  applied after this life restored).

An ``own`` application of an id that an earlier segment already applied within its own
range is a ``rerun``: a later checkpoint's run count went below a run an earlier one
counted.

**Verdict.** Every id below the run count of every checkpoint (and of ``done``) was
applied at least once: a count of 0 is a **lost id**. An id applied ``n >= 2`` times
has ``n - 1`` **duplicates**: every application but one (its ``own``, else its
first), each attributed to the segment and kind where it happened, and each must be
explained, else it is a violation:

* by the **save's bound** (``ahead`` only): the segment ends at a save whose
  ``save_start`` record says ``in_flight_at_bound`` K (0 when absent); at most K ahead
  applications of that segment are explained, fewer by the closures scheduled outside
  ``handler.run`` that the bound named in flight (the record's ``in_flight`` function
  names, else ``bound_end``'s); and at most F more, F being the record's
  ``finished_after_first_unfinished`` (runs that finished after one still in flight or
  queued at the bound: the run count is a prefix, so they run again, and the record
  says how many);
* by a **fault that can re-execute a closure**: a PS or worker SIGKILLed or SIGSTOPped,
  or gone on its own, whose window -- from its signal to :data:`TAINT_AFTER` seconds
  after it exited or resumed -- meets the id's window in that life: from its ``run``
  line to the first ``join_end`` after it (or the save's ``save_start``, or the life's
  end); a ``stale`` application's window runs from the id's ``run`` in the life that
  scheduled it to the restore. Each fault explains at most as many applications as
  there are workers (the closures that can be in flight at once).

A notice, a drain, a coordinator's crash or pause explains nothing. With TensorFlow's own
coordinator (a named variant) the unexplained duplicates are measured, not violations: it
cannot hold its workers, so closures in flight at the save may run twice; nothing may be
lost there either.

Closures scheduled **outside** ``handler.run`` (``outside[id]``, the script's
``--outside-every``) are no handler runs: they are reported (scheduled, applied, missing
after a restart, duplicated); only one the last life scheduled and never applied is a
violation (its ``join()`` at the end waits for them). A handler id that runs twice because
an outside closure was unfinished at the save is an unexplained ``ahead`` duplicate.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Optional

from integration.mwms_worker import tail

from .ps_preemption import (
    PEER_TIMEOUT,
    RESTART_CODE,
    TAINT_AFTER,
    FaultDriver,
    Launcher,
    role_kind,
)
from .report import TrialResult

#: The kinds of a duplicate application, by where it happened (module docstring).
OWN, REPEAT, AHEAD, STALE = "own", "repeat", "ahead", "stale"
#: An id run again in a later life's own range though an earlier checkpoint counted it
#: (a saved run count below the restored one).
RERUN = "rerun"
#: The evaluation closure's function name in ps_preemption_script.py (``bound_end``).
OUTSIDE_FUNCTION = "eval_step"


@dataclasses.dataclass
class Life:
    """What the checker reads of one coordinator life (plain data: a unit test builds it)."""

    name: str
    pid: int
    started: float
    ended: Optional[float]  # its exit, None if still running at the end
    restored: Optional[dict]  # the restored event: runs, applied, outside, t
    runs: dict  # id -> time of its run line
    outside: dict  # outside id -> time it was scheduled
    join_ends: list  # times of join_end lines
    done: Optional[dict] = None
    #: bound_end results, with their times: (t, result dict).
    bounds: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Save:
    """A coordinator save from its records: pid, agreed_step, save_start, save_end, extra."""

    pid: int
    agreed_step: int
    save_start: float
    save_end: Optional[float]
    extra: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class FaultWindow:
    """A fault that can re-execute a closure, and how many it may explain."""

    what: str
    start: float
    end: float
    budget: int


@dataclasses.dataclass
class Application:
    """One application of an id beyond its first (a duplicate), and its explanation."""

    id: int
    life: str
    kind: str
    window: tuple
    explained_by: Optional[str] = None


@dataclasses.dataclass
class Identity:
    """The verdict of :func:`check_identity`."""

    lost: list = dataclasses.field(default_factory=list)  # ids
    duplicates: list = dataclasses.field(default_factory=list)  # Application
    violations: list = dataclasses.field(default_factory=list)
    notes: dict = dataclasses.field(default_factory=dict)

    @property
    def explained(self) -> int:
        return sum(d.explained_by is not None for d in self.duplicates)

    @property
    def unexplained(self) -> int:
        return sum(d.explained_by is None for d in self.duplicates)


def _segments(lives: list, saves: list) -> list:
    """The chain: (life, start snapshot, end snapshot, save or None), oldest first."""
    restored = [life for life in lives if life.restored is not None]
    chain = []
    for n, life in enumerate(restored):
        if n + 1 < len(restored):
            nxt = restored[n + 1]
            written = [
                s
                for s in saves
                if s.pid == life.pid
                and s.agreed_step == nxt.restored["runs"]
                and s.save_start <= nxt.started
            ]
            if written:
                chain.append((life, life.restored, nxt.restored, written[-1]))
        elif life.done is not None:
            chain.append((life, life.restored, life.done, None))
    return chain


def _window_end(life: Life, since: float, save: Optional[Save]) -> float:
    """When an id handed to ``handler.run`` at ``since`` was surely finished in ``life``."""
    ends = [t for t in life.join_ends if t >= since]
    if life.done is not None:
        ends.append(life.done["t"])
    if save is not None and save.save_start >= since:
        ends.append(save.save_start)
    if ends:
        return min(ends)
    return life.ended if life.ended is not None else float("inf")


def _outside_in_flight(life: Life, save: Save) -> int:
    """Closures scheduled outside handler.run that the save's bound named in flight: by
    the record's ``in_flight`` (worker -> function), else by the ``bound_end`` line."""
    named = save.extra.get("in_flight")
    if isinstance(named, dict):
        return sum(OUTSIDE_FUNCTION in str(fn) for fn in named.values())
    before = [r for t, r in life.bounds if t <= save.save_start + 1.0]
    if not before or not isinstance(before[-1], dict):
        return 0
    return sum(OUTSIDE_FUNCTION in str(n) for n in before[-1].get("in_flight_names", []))


def check_identity(
    lives: list, saves: list, faults: list, steps: int, tf_coordinator: bool = False
) -> Identity:
    """Lost ids and duplicates, each duplicate explained or not (module docstring).

    ``lives``: :class:`Life` (oldest first); ``saves``: :class:`Save`; ``faults``:
    :class:`FaultWindow`.
    """
    out = Identity()
    chain = _segments(lives, saves)
    # Lost: below the run count of any checkpoint (or of done), never applied.
    lost: set = set()
    for snapshot in [life.restored for life in lives if life.restored] + [
        life.done for life in lives if life.done
    ]:
        applied = snapshot.get("applied")
        if applied is None:
            out.violations.append(f"a snapshot without per-id counts: {sorted(snapshot)}")
            return out
        lost |= {i for i in range(min(snapshot["runs"], len(applied))) if applied[i] == 0}
    out.lost = sorted(lost)
    if lost:
        out.violations.append(
            f"{len(lost)} id(s) scheduled through handler.run, counted as run by a "
            f"checkpoint or done, and never applied: {_ids(out.lost)}"
        )
    # Every application, by id, in the chain's segments.
    apps: dict = {}
    segments = []
    for life, start, end, save in chain:
        r0, r1 = start["runs"], end["runs"]
        grown = [b - a for a, b in zip(start["applied"], end["applied"])]
        for i, d in enumerate(grown):
            if d < 0:
                out.violations.append(
                    f"{life.name}: applied[{i}] went from {start['applied'][i]} to "
                    f"{end['applied'][i]} (an application lost from the checkpoint)"
                )
                lost.add(i)
                continue
            kind = OWN if r0 <= i < r1 else AHEAD if i >= r1 else STALE
            for n in range(d):
                apps.setdefault(i, []).append((life, REPEAT if kind == OWN and n else kind, save))
        segments.append({"life": life.name, "from": r0, "to": r1, "save": save is not None})
        ids = sorted(life.runs)
        if ids and ids != list(range(r0, r0 + len(ids))):
            out.violations.append(
                f"{life.name} handed ids {_ids(ids)} to handler.run, not {r0}.. in order"
            )
    out.lost = sorted(lost)
    # The duplicates: every application but one (its own, else its first).
    for i, found in sorted(apps.items()):
        keep = next((n for n, (_, k, _) in enumerate(found) if k == OWN), 0)
        for n, (life, kind, save) in enumerate(found):
            if n == keep:
                continue
            if kind == OWN:
                kind = RERUN
            if kind == STALE:
                earlier = [lf.runs[i] for lf in lives if i in lf.runs and lf.started < life.started]
                since = max(earlier or [life.started])
                until = life.restored["t"] + TAINT_AFTER
            else:
                since = life.runs.get(i, life.started)
                until = _window_end(life, since, save)
            out.duplicates.append(Application(i, life.name, kind, (since, until)))
    # The save's bound explains ahead applications first, up to what its record names:
    # the handler's closures in flight at the bound, then the finished runs after the
    # first unfinished one (they run again, the run count being a prefix).
    by_save: dict = {}
    for life, _, _, save in chain:
        if save is None:
            continue
        k = save.extra.get("in_flight_at_bound")
        outside = _outside_in_flight(life, save)
        after = int(save.extra.get("finished_after_first_unfinished") or 0)
        by_save[life.name] = [max(0, int(k or 0) - outside), k, outside, after]
    for d in out.duplicates:
        entry = by_save.get(d.life)
        if d.kind != AHEAD or not entry:
            continue
        if entry[0] > 0:
            entry[0] -= 1
            d.explained_by = f"in flight at the save's bound (in_flight_at_bound {entry[1]})"
        elif entry[3] > 0:
            entry[3] -= 1
            d.explained_by = "finished after the first unfinished run at the save's bound"
    # Then the faults, each up to its budget, in the order they came.
    left = {n: f.budget for n, f in enumerate(faults)}
    for d in out.duplicates:
        if d.explained_by is not None:
            continue
        for n, f in enumerate(faults):
            if left[n] > 0 and f.start <= d.window[1] and f.end >= d.window[0]:
                left[n] -= 1
                d.explained_by = f.what
                break
    unexplained = [d for d in out.duplicates if d.explained_by is None]
    if unexplained:
        text = (
            f"{len(unexplained)} duplicate application(s) that no kill, pause or save bound "
            f"explains: "
            + "; ".join(
                f"id {d.id} {d.kind} in {d.life}"
                + (
                    f" (its save named {by_save[d.life][1]} in flight, "
                    f"{by_save[d.life][2]} of them outside handler.run)"
                    if d.life in by_save
                    else ""
                )
                for d in unexplained[:10]
            )
        )
        if tf_coordinator:
            out.notes["tf_coordinator_unexplained"] = text
        else:
            out.violations.append(text)
    out.notes["segments"] = segments
    out.notes["duplicates"] = [
        {"id": d.id, "life": d.life, "kind": d.kind, "by": d.explained_by} for d in out.duplicates
    ]
    return out


def check_outside(lives: list, saves: list, violations: list) -> dict:
    """The closures scheduled outside handler.run: reported; only one the last life
    scheduled and never applied is a violation (module docstring)."""
    chain = _segments(lives, saves)
    report = {"scheduled": 0, "applied": 0, "missing_after_restart": 0, "duplicated": 0}
    for life, start, end, _ in chain:
        before, after = start.get("outside") or [], end.get("outside") or []
        for i in life.outside:
            report["scheduled"] += 1
            grown = after[i] - before[i] if i < len(after) and i < len(before) else 0
            if grown >= 1:
                report["applied"] += 1
                report["duplicated"] += grown - 1
            elif life.done is not None and end is life.done:
                violations.append(
                    f"{life.name}: the closure scheduled outside handler.run at run {i} "
                    f"was never applied, though join() at the end waited for it"
                )
            else:
                report["missing_after_restart"] += 1
    return report


def _ids(ids: list) -> str:
    shown = ", ".join(str(i) for i in ids[:20])
    return f"[{shown}{', ...' if len(ids) > 20 else ''}] ({len(ids)})"


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


def fault_windows(launcher: Launcher, driver: FaultDriver) -> list:
    """The faults that can re-execute a closure (module docstring): a PS or worker
    SIGKILLed or paused, until TAINT_AFTER after it resumed (or was signalled), or gone on
    its own; each may explain as many applications as there are workers."""
    workers = sum(role_kind(r) == "worker" for r in launcher.servers)
    windows = []
    for f in driver.faults:
        if f.fired_at is None or f.role == "coordinator" or f.signal == "SIGTERM":
            continue
        end = (f.continued_at or f.fired_at) + TAINT_AFTER
        windows.append(FaultWindow(f"{f.signal} {f.role}", f.fired_at, end, workers))
    for role in launcher.servers:
        for inc in launcher.history[role]:
            if inc.exited_at is None or inc.signals or inc.killed_by_launcher:
                continue
            windows.append(
                FaultWindow(
                    f"{inc.name} gone on its own",
                    inc.exited_at - 1.0,
                    inc.exited_at + TAINT_AFTER,
                    workers,
                )
            )
    return sorted(windows, key=lambda w: w.start)


def lives_of(launcher: Launcher) -> list:
    """The coordinator's lives as :func:`check_identity` reads them."""
    found = []
    for inc in launcher.history["coordinator"]:
        found.append(
            Life(
                name=inc.name,
                pid=inc.pid,
                started=inc.started,
                ended=inc.exited_at,
                restored=inc.first("restored"),
                runs={e["id"]: e["t"] for e in inc.events("run")},
                outside={e["id"]: e["t"] for e in inc.events("outside")},
                join_ends=[e["t"] for e in inc.events("join_end")],
                done=inc.first("done"),
                bounds=[(e["t"], e.get("result")) for e in inc.events("bound_end")],
            )
        )
    return found


def check(launcher: Launcher, driver: FaultDriver, result: TrialResult, steps: int) -> None:
    """Checks the invariants of the kind (``process_trials.py``) into ``result``."""
    t0 = launcher.history["coordinator"][0].started
    saves = _chief_saves(launcher)
    lives = launcher.history["coordinator"]
    tf_coordinator = launcher.params.get("coordinator") == "tf"
    result.notes["faults"] = [f.record(t0) for f in driver.faults]
    result.notes["lives"] = [
        {
            "pid": inc.pid,
            "restored": _runs_of(inc.first("restored")),
            "done": _runs_of(inc.first("done")),
            "exit": inc.exit_code,
            "signals": [n for _, n in inc.signals],
            "at_s": round(inc.started - t0, 1),
            "fetches": len(inc.events("fetch_end")),
        }
        for inc in lives
    ]
    result.notes["restarts"] = {r: len(launcher.history[r]) - 1 for r in launcher.roles}
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
    plain_saves = [
        Save(p.pid, p.agreed_step, p.save_start, p.save_end, dict(p.extra)) for p in saves
    ]
    plain_lives = lives_of(launcher)
    identity = check_identity(
        plain_lives, plain_saves, fault_windows(launcher, driver), steps, tf_coordinator
    )
    result.violations += identity.violations
    result.lost_closures += len(identity.lost)
    result.lost_ids = len(identity.lost)
    result.duplicate_closures += len(identity.duplicates)
    result.duplicates_explained = identity.explained
    result.duplicates_unexplained = identity.unexplained
    result.notes["identity"] = identity.notes
    if launcher.params.get("outside_every"):
        result.notes["outside"] = check_outside(plain_lives, plain_saves, result.violations)
    _check_coordinator_exits(launcher, driver, saves, result)
    _check_server_exits(launcher, result)
    final = lives[-1].first("done") if launcher.finished else None
    if final is None:
        result.violations.append("training did not reach its end (no done from the last life)")
    elif final["runs"] != steps:
        result.violations.append(f"done after {final['runs']} runs, not {steps}")


def _runs_of(event: Optional[dict]):
    return None if event is None else event["runs"]


def _check_restores(lives: list, saves: list, result: TrialResult) -> None:
    """Each life restores the last complete checkpoint."""
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


def _servers_gone(launcher: Launcher, driver: FaultDriver, life) -> list:
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
    for role in launcher.servers:
        for inc in launcher.history[role]:
            if inc.exited_at is None or not life.started <= inc.exited_at <= end + 1.0:
                continue
            if role_kind(role) == "ps" or inc.exited_at <= up:
                found.append(f"{inc.name} exited {inc.exit_code}")
    return found


def _check_server_exits(launcher: Launcher, result: TrialResult) -> None:
    """A notice leads to the task's exit with 42, released by the coordinator; a
    server never ends on its own."""
    releases = _task_releases(launcher)
    lives = launcher.history["coordinator"]
    exits = []
    for role in launcher.servers:
        job, task = role_kind(role), int(role[len(role_kind(role)) :])
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
