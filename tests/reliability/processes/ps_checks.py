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
first), each attributed to the segment and kind where it happened. Each must be
excused, by id and on the harness's own clock, else it is a violation. The harness
(``trial_worker.py``) writes its own events: ``closure_begin`` / ``closure_end`` around
every closure a coordinator worker thread processes (the run id, the worker, its
time), ``bound_begin`` / ``bound_end`` around the handler's wait for the closures and
``save_begin`` / ``save_end`` around ``CheckpointManager.save``. Nothing the package
measured is taken for a time. What excuses one application of id ``i``:

* **the save's record, confirmed by the harness** (``ahead`` only, once per save that
  names ``i``): the segment ends at a save whose ``save_start`` record names ``i``
  in ``in_flight_runs`` (in flight at the bound), and the harness saw ``i`` in flight
  on a worker at some moment of its own bound window (begun before its ``bound_end``,
  not finished before its ``bound_begin``); or the record names ``i`` in
  ``finished_after_first_unfinished``, the harness saw ``i`` finish before its
  ``save_end``, and saw the saved run count's own run (the first unfinished) not
  finished before its ``bound_begin``;
* **a fault, for what it can cause** (any kind, once per fault and id): a worker
  SIGKILLed, SIGSTOPped or gone on its own excuses the closure that worker had in
  flight while the fault lasted (from the signal to the SIGCONT; a kill or an exit: at
  that moment), by the harness's events; a PS's, the closures in flight on any
  worker then.

So with our coordinator an id is applied at most ``1 + S + F`` times: ``S`` the saves
whose records name it, ``F`` the faults that hit it in flight. A notice, a drain, a
coordinator's crash or pause excuses nothing.

**Torn closures.** The closure makes two writes (``applied[i]`` then
``applied_b[i]``): every checkpoint holds both or neither for every id, unless the
save that wrote it names the id in ``in_flight_runs`` (its writes may straddle the
save's reads) or a fault hit it in flight (a worker killed between the two writes);
``done`` likewise.

With TensorFlow's own coordinator (a named variant, which keeps no run ids) the
unexcused duplicates and torn ids are measured, not violations: it cannot hold its
workers, so closures in flight at the save may run twice; nothing may be lost there
either.

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


@dataclasses.dataclass
class Attempt:
    """One closure a coordinator worker thread processed, by the harness's events."""

    run: Optional[int]  # the handler's run id (None: scheduled outside handler.run)
    worker: Optional[int]
    begin: float
    end: Optional[float]  # None: never finished in this life (the process ended first)
    ok: bool = True

    def in_flight_during(self, start: float, end: float) -> bool:
        """Whether the closure was in flight at some moment of ``[start, end]``."""
        return self.begin <= end and (self.end is None or self.end >= start)


@dataclasses.dataclass
class Life:
    """What the checker reads of one coordinator life (plain data: a unit test builds it)."""

    name: str
    pid: int
    started: float
    ended: Optional[float]  # its exit, None if still running at the end
    restored: Optional[dict]  # the restored event: runs, applied, applied_b, outside, t
    runs: dict  # id -> time of its run line
    outside: dict  # outside id -> time it was scheduled
    join_ends: list  # times of join_end lines
    done: Optional[dict] = None
    #: bound_end results, with their times: (t, result dict).
    bounds: list = dataclasses.field(default_factory=list)
    #: The harness's events: every closure processed (:class:`Attempt`), and its
    #: (begin, end) around the wait for closures (``bound_*``) and the save (``save_*``).
    closures: list = dataclasses.field(default_factory=list)
    bound_spans: list = dataclasses.field(default_factory=list)
    save_spans: list = dataclasses.field(default_factory=list)

    def attempts(self, run: int) -> list:
        return [a for a in self.closures if a.run == run]


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
    """A fault that can re-execute a closure: on ``role`` (``worker1``, ``ps0``), from
    ``start`` to ``end`` (a pause: its signal to its SIGCONT; a kill or an exit: one
    moment)."""

    what: str
    start: float
    end: float
    role: str

    def hits(self, attempt: Attempt) -> bool:
        """Whether the fault can have re-executed ``attempt``: it was in flight while
        the fault lasted, on the worker hit (a PS's fault: on any worker)."""
        if not attempt.in_flight_during(self.start, self.end):
            return False
        if role_kind(self.role) == "ps":
            return True
        return attempt.worker == int(self.role[len(role_kind(self.role)) :])


@dataclasses.dataclass
class Application:
    """One application of an id beyond its first (a duplicate), and what excused it."""

    id: int
    life: str
    kind: str
    explained_by: Optional[str] = None


@dataclasses.dataclass
class Identity:
    """The verdict of :func:`check_identity`."""

    lost: list = dataclasses.field(default_factory=list)  # ids
    duplicates: list = dataclasses.field(default_factory=list)  # Application
    torn: list = dataclasses.field(default_factory=list)  # (snapshot, id)
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


def _named(save: Save, field: str) -> set:
    """The run ids a save's record lists under ``field`` (none for a count: a record
    that names no id excuses nothing)."""
    found = save.extra.get(field)
    return {int(i) for i in found} if isinstance(found, list) else set()


def _harness_spans(life: Life) -> Optional[tuple]:
    """``(bound_begin, bound_end, save_begin, save_end)`` of the last save the harness saw
    finish in ``life`` (the one the next life restored), or None."""
    saves = [span for span in life.save_spans if span[1] is not None]
    if not saves:
        return None
    save_begin, save_end = saves[-1]
    bounds = [b for b in life.bound_spans if b[1] is not None and b[1] <= save_begin]
    if not bounds:
        return None
    bound_begin, bound_end = bounds[-1]
    return bound_begin, bound_end, save_begin, save_end


def _save_excuse(life: Life, save: Save, run: int) -> Optional[str]:
    """Why the save that ended ``life``'s segment may have left ``run`` both in its
    checkpoint and to run again, by its record and the harness's events; None if
    neither holds (module docstring)."""
    spans = _harness_spans(life)
    if spans is None:
        return None
    bound_begin, bound_end, _, save_end = spans
    if run in _named(save, "in_flight_runs") and any(
        a.in_flight_during(bound_begin, bound_end) for a in life.attempts(run)
    ):
        return f"run {run} in flight at the save's bound (record and harness)"
    first_unfinished = save.agreed_step
    if (
        run in _named(save, "finished_after_first_unfinished")
        and any(a.ok and a.end is not None and a.end <= save_end for a in life.attempts(run))
        and not any(
            a.ok and a.end is not None and a.end < bound_begin
            for a in life.attempts(first_unfinished)
        )
    ):
        return f"run {run} finished after run {first_unfinished}, unfinished at the bound"
    return None


def check_identity(
    lives: list, saves: list, faults: list, steps: int, tf_coordinator: bool = False
) -> Identity:
    """Lost ids, duplicates (each excused or not) and torn closures (module docstring).

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
    # What each fault can have re-executed or cut short: the closures it hit in flight.
    hit = [
        {a.run for life in lives for a in life.closures if a.run is not None and f.hits(a)}
        for f in faults
    ]
    _check_torn(lives, chain, out, tf_coordinator, set().union(*hit))
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
    # The duplicates: every application but one (its own, else its first). A save's
    # record excuses an ahead application of its segment, once per id it names.
    by_save: set = set()  # (life, id) a save excused
    for i, found in sorted(apps.items()):
        keep = next((n for n, (_, k, _) in enumerate(found) if k == OWN), 0)
        for n, (life, kind, save) in enumerate(found):
            if n == keep:
                continue
            d = Application(i, life.name, RERUN if kind == OWN else kind)
            if kind == AHEAD and save is not None and (life.name, i) not in by_save:
                d.explained_by = _save_excuse(life, save, i)
                if d.explained_by is not None:
                    by_save.add((life.name, i))
            out.duplicates.append(d)
    # Then the faults: each excuses one application of each closure it hit in flight.
    left = [set(runs) for runs in hit]
    for d in out.duplicates:
        if d.explained_by is not None:
            continue
        for n, f in enumerate(faults):
            if d.id in left[n]:
                left[n].discard(d.id)
                d.explained_by = f"{f.what} with run {d.id} in flight"
                break
    unexplained = [d for d in out.duplicates if d.explained_by is None]
    if unexplained:
        text = (
            f"{len(unexplained)} duplicate application(s) that no save's record (confirmed "
            f"by the harness) nor kill or pause of a task running it excuses: "
            + "; ".join(f"id {d.id} {d.kind} in {d.life}" for d in unexplained[:10])
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


def _check_torn(lives: list, chain: list, out: Identity, tf_coordinator: bool, hit: set) -> None:
    """Every checkpoint holds both of a closure's writes or neither, but for the runs
    its save names in flight and those a fault hit in flight (a worker killed between
    the two); ``done`` likewise (module docstring)."""
    writer = {id(end): save for _, _, end, save in chain if save is not None}
    snapshots = [(life.name, "restored", life.restored) for life in lives if life.restored]
    snapshots += [(life.name, "done", life.done) for life in lives if life.done]
    for name, what, snapshot in snapshots:
        first, second = snapshot.get("applied"), snapshot.get("applied_b")
        if second is None:
            out.violations.append(f"{name}'s {what} has no applied_b (the second write)")
            continue
        save = writer.get(id(snapshot))
        excused = set(hit) | (_named(save, "in_flight_runs") if save is not None else set())
        for i, (a, b) in enumerate(zip(first, second)):
            if a != b and i not in excused:
                out.torn.append((f"{name} {what}", i))
    if out.torn:
        text = (
            f"{len(out.torn)} closure(s) half applied in a checkpoint (one of their two "
            f"writes), not named in flight by its save: "
            + "; ".join(f"id {i} in {where}" for where, i in out.torn[:10])
        )
        if tf_coordinator:
            out.notes["tf_coordinator_torn"] = text
        else:
            out.violations.append(text)


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
    SIGKILLed (at that moment) or paused (until its SIGCONT), or gone on its own (the
    last second before the launcher saw its exit)."""
    windows = []
    for f in driver.faults:
        if f.fired_at is None or f.role == "coordinator" or f.signal == "SIGTERM":
            continue
        end = f.continued_at if f.signal == "SIGSTOP" and f.continued_at else f.fired_at
        windows.append(FaultWindow(f"{f.signal} {f.role}", f.fired_at, end, f.role))
    for role in launcher.servers:
        for inc in launcher.history[role]:
            if inc.exited_at is None or inc.signals or inc.killed_by_launcher:
                continue
            windows.append(
                FaultWindow(f"{inc.name} gone on its own", inc.exited_at - 1.0, inc.exited_at, role)
            )
    return sorted(windows, key=lambda w: w.start)


def _attempts(inc) -> list:
    """The harness's ``closure_begin``/``closure_end`` events of one coordinator life as
    :class:`Attempt` (one worker thread runs one closure at a time: each begin pairs with
    the next end of its worker)."""
    open_by_worker: dict = {}
    found = []
    for e in inc.events():
        if e["event"] == "closure_begin":
            attempt = Attempt(e.get("run"), e.get("worker"), e["t"], None)
            open_by_worker[e.get("worker")] = attempt
            found.append(attempt)
        elif e["event"] == "closure_end":
            attempt = open_by_worker.pop(e.get("worker"), None)
            if attempt is not None:
                attempt.end, attempt.ok = e["t"], bool(e.get("ok"))
    return found


def _spans(inc, begin: str, end: str) -> list:
    """(begin, end) pairs of the harness's ``begin``/``end`` events (end None: never came)."""
    spans: list = []
    for e in inc.events():
        if e["event"] == begin:
            spans.append([e["t"], None])
        elif e["event"] == end and spans and spans[-1][1] is None:
            spans[-1][1] = e["t"]
    return [tuple(span) for span in spans]


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
                closures=_attempts(inc),
                bound_spans=_spans(inc, "bound_begin", "bound_end"),
                save_spans=_spans(inc, "save_begin", "save_end"),
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
            "in_flight_runs": p.extra.get("in_flight_runs"),
            "finished_after_first_unfinished": p.extra.get("finished_after_first_unfinished"),
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
    result.notes["torn"] = len(identity.torn)
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
