"""Type stubs for the Rust extension ``tf_failure_handling._native``."""

from typing import Any, Callable, ClassVar, List, Optional, Tuple, TypeVar

__version__: str
RUN_TO_CHECKPOINT: str
LAST_RUN_TO_CHECKPOINT: str
TERMINATED_WORKER: str
ACK_PREFIX: str
ACK_VALUE: str
STOP_WATCHER: str
PREEMPTION_NOTICE_KEY: str
CHECKPOINTED_RUNS: str

_T = TypeVar("_T")

class HandlerCore:
    """Native base of ``PreemptionCheckpointHandler``: the hot path and the step resolver."""

    _run_counter: int
    def __new__(cls, *args: Any, **kwargs: Any) -> HandlerCore: ...
    def run(
        self, distributed_train_function: Callable[..., _T], *args: Any, **kwargs: Any
    ) -> _T: ...
    def _protocol_core(self) -> ProtocolCore: ...

class ProtocolCore:
    """The handler's decisions, shared with its ``HandlerCore`` (``_protocol_core()``)."""

    run_counter: int
    @property
    def threads(self) -> tuple[int, int]: ...
    @property
    def attention(self) -> bool: ...
    def begin_step(self) -> bool: ...
    def step_done(self) -> None: ...
    def configure(
        self,
        *,
        worker_id: Optional[int] = ...,
        num_workers: int = ...,
        grace_period: float = ...,
        peer_timeout: float = ...,
        save_at_current_run: bool = ...,
        exit_reserve: float = ...,
        lost_worker_saves: bool = ...,
        clock: Optional[Callable[[], float]] = ...,
    ) -> float: ...
    def handle(self, event: Event) -> Any: ...
    def poll(self) -> Optional[Action]: ...
    def poll_timeout(self, waiting: bool = False) -> Optional[float]: ...
    def state(self) -> dict[str, Any]: ...
    #: What a write of the driver is (``src/writes.rs``; a field of ``Action``).
    WriteKind: ClassVar[type[_WriteKind]]
    @staticmethod
    def unix_time_of(moment: float, core: ProtocolCore) -> float:
        """The wall-clock time of ``moment``, a time on ``core``'s clock, read now."""

class SignalWatch:
    """Watches signals from any thread. An ``owner`` (a handler) holds back previously
    installed handlers while it lives; an observer chains them. With ``inbox``, the signal
    dispatcher posts every delivery into it at once; ``Inbox.recv(signals=)`` looks for
    displaced handlers."""

    def __init__(
        self, signals: list[int], owner: bool = False, inbox: Optional[Inbox] = None
    ) -> None: ...
    def close(self, at_exit: bool = False) -> list[int]: ...

class _Input:
    """One input of the protocol driver, as ``Inbox.recv`` returns it (``Inbox.Input``)."""

    class Notice(_Input):
        source: Optional[str]
        signal: Optional[int]
        at: float
        deadline: Optional[float]
        kill: Optional[float]
        def __init__(
            self,
            source: Optional[str] = None,
            signal: Optional[int] = None,
            at: float = 0.0,
            deadline: Optional[float] = None,
            kill: Optional[float] = None,
        ) -> None: ...

    class StepKey(_Input):
        round: str
        value: str
        def __init__(self, round: str, value: str) -> None: ...

    class KeyReadFailed(_Input):
        round: str
        def __init__(self, round: str) -> None: ...

    class Stop(_Input):
        def __init__(self) -> None: ...

DEFAULT_GRACE_PERIOD: float

class _CallTimeout(Exception):
    """A call to a task did not return within its bound (``src/ps_control/calls.rs``)."""

class InputResume:
    """Where a restarted input resumes (src/input_position.rs ``InputResume``), with the
    functions that answer it and the timing of a slow resume."""

    class Fresh(InputResume): ...

    class At(InputResume):
        iteration: int
        batches: int
        advance: int

    class Unreachable(InputResume):
        iteration: int
        batches: int

    @staticmethod
    def of(
        iteration: int,
        batches: int,
        previous: int,
        per_iteration: Optional[int],
        steps_per_iteration: Optional[int],
        new_iteration: Optional[bool],
        first_used: int,
    ) -> InputResume: ...
    @staticmethod
    def batches_given(start: int, runs_now: int, runs_at_made: int, per_run: int) -> int: ...

    class Timing:
        """The timing of a resume's slow part (a replay, or with ``advance`` the making
        of earlier iterators) and when each is logged; reads the clock itself."""

        def __init__(self, advance: bool = False) -> None: ...
        def poll_timeout(self) -> float: ...
        def poll(self) -> Optional[float]: ...

class _TaskEvent:
    """What a served task's threads report (``src/ps_control/task.rs``)."""

    class Notice(_TaskEvent):
        def __init__(
            self, source: str, deadline: Optional[float], grace_period: Optional[float]
        ) -> None: ...

    class Asked(_TaskEvent): ...

class _TaskAction:
    """What a served task's serving thread does next (``src/ps_control/task.rs``)."""

    class WaitNotice(_TaskAction):
        timeout: float

    class Serving(_TaskAction):
        own: float
        source: str
        at_most: float

    class Serve(_TaskAction):
        timeout: float

    class Leave(_TaskAction):
        why: str
        reason: Optional[str]
        after: float
        silence: float
        cap_factor: float

class TaskProtocol:
    """A served task's protocol object (``src/ps_control/task.rs``)."""

    def __init__(
        self,
        job: str,
        task: int,
        incarnation: str,
        peer_timeout: Optional[float] = None,
        *,
        clock: Optional[Callable[[], float]] = None,
    ) -> None: ...
    #: The key a served task's control is registered under in TF's ``py_func``
    #: registry, which the coordinator's calls name (``src/ps_control.rs``).
    TOKEN: str
    Event: type[_TaskEvent]
    Action: type[_TaskAction]

    def handle(self, event: _TaskEvent) -> None: ...
    def poll(self) -> _TaskAction: ...
    def answer(self, request: Any) -> dict[str, Any]: ...
    def state(self) -> dict[str, Any]: ...

class Abandoned:
    """A call abandoned so that a new one could start (``CoordinatorProtocol.start_call``)."""

    @property
    def age(self) -> float: ...
    @property
    def count(self) -> int: ...
    @property
    def max(self) -> int: ...

class _WriteKind:
    """What a write of the driver is (``src/writes.rs``)."""

    class Acknowledge(_WriteKind): ...
    class Claim(_WriteKind): ...
    class Announce(_WriteKind): ...

class Event:
    """An input of the protocol driver (``ProtocolCore.handle``)."""

    class Notice(Event):
        def __init__(
            self,
            source: str,
            message: str,
            unix_deadline: Optional[float] = None,
            unix_kill: Optional[float] = None,
        ) -> None: ...

    class StepKey(Event):
        def __init__(self, round: str, value: str, superseded: bool = False) -> None: ...

    class Written(Event):
        def __init__(self, id: int, won: bool = True) -> None: ...

    class Failed(Event):
        def __init__(self, id: int, closing: bool = False) -> None: ...

    class Raised(Event):
        def __init__(self, id: int) -> None: ...

    class Close(Event):
        def __init__(self) -> None: ...

    class Resume(Event):
        def __init__(self) -> None: ...

    class Set(Event):
        def __init__(self, written: bool) -> None: ...

    class Got(Event):
        def __init__(self, value: Optional[str] = None) -> None: ...

    class CallFailed(Event):
        def __init__(self, closing: bool = False) -> None: ...

    class Reading(Event):
        def __init__(self) -> None: ...

    class Read(Event):
        def __init__(self, value: Optional[str] = None) -> None: ...

    class ReadFailed(Event):
        def __init__(self, closing: bool = False) -> None: ...

    class Timing(Event):
        def __init__(self) -> None: ...

    class Timed(Event):
        def __init__(self) -> None: ...

    class Restored(Event):
        def __init__(self) -> None: ...

    class Saved(Event):
        def __init__(self, round: str) -> None: ...

    class SaveFailed(Event):
        def __init__(self, shares: bool) -> None: ...

    class BeforeStep(Event):
        def __init__(self) -> None: ...

    class ChecksDone(Event):
        def __init__(self) -> None: ...

    class StepFailed(Event):
        def __init__(self, code: Optional[int] = None, message: Optional[str] = None) -> None: ...

    class Probed(Event):
        def __init__(self, unreachable: List[int]) -> None: ...

    class Job(Event):
        def __init__(self) -> None: ...

    class Claims(Event):
        def __init__(self, current: bool, claims: List[Tuple[int, int, List[int]]]) -> None: ...

    class Watch(Event):
        def __init__(self) -> None: ...

    class Scope(Event):
        def __init__(self, entered: bool) -> None: ...

    class WatchProbed(Event):
        def __init__(self, unreachable: List[int]) -> None: ...

    class Confirm(Event):
        def __init__(self, seen: bool, unreachable: Optional[List[int]] = None) -> None: ...

    class Pending(Event):
        def __init__(self, pending: bool) -> None: ...

    class Fit(Event):
        def __init__(self) -> None: ...

    class Exiting(Event):
        def __init__(self, ends_in: Optional[float] = None) -> None: ...

    class Shutdown(Event):
        def __init__(self) -> None: ...

    class ErrorReport(Event):
        def __init__(self) -> None: ...

class Action:
    """What the handler's protocol object tells Python to do (``ProtocolCore.handle``
    and ``ProtocolCore.poll``): one type, each variant the answer to one event."""

    # A termination notice (Event.Notice).
    class Lead(Action):
        final_round: bool
        writes: bool

    class Claim(Action):
        key: str
        value: str

    class Replan(Action): ...
    class Absorb(Action): ...
    class Wait(Action): ...

    # The check before a step (Event.BeforeStep).
    class Proceed(Action): ...

    class Publish(Action):
        round: str
        step: int
        ack_keys: list[str]
        own_ack_key: Optional[str]

    class Save(Action):
        round: str
        step: int
        drain: float

    # A step key a leader published (Event.StepKey).
    class Acknowledge(Action):
        ack_key: str
        next_round: Optional[str]

    class Stop(Action): ...

    # A save's end (Event.Saved, Event.SaveFailed).
    class Exit(Action): ...
    class Countdown(Action): ...
    class Raise(Action): ...

    class ExitUnmerged(Action):
        code: int

    # A failed step (Event.StepFailed, Probed).
    class Probe(Action):
        suspects: List[str]
        detection: Optional[str]

    class PeerLost(Action):
        lost: List[int]
        detection: str
        writes: bool

    # A non-chief's wait for the chief's checkpoint (Event.Confirm).
    class Look(Action):
        seconds: float

    # The step watch (Event.Watch, Event.WatchProbed).
    class Abort(Action):
        message: str

    # The survivors' save (Event.Job, Event.Claims).
    class MarkJob(Action): ...
    class ReadJob(Action): ...
    class SaveLastStep(Action): ...

    class NameLatest(Action):
        writer: int
        runs: int
        unix_time: float

    class Settled(Action):
        writer: int
        discard: bool

    class Refuse(Action):
        why: str
        discard: bool

    # The leader's round (Event.Resume, Set, Got, CallFailed).
    class Set(Action):
        key: str
        value: str
        timeout: float
        what: str

    class Get(Action):
        key: str
        timeout: float
        what: str
        ack: bool

    class Pause(Action):
        """The leader's or the reader's last call failed: wait, then resume."""

        seconds: float
        what: str
        attempts: int
        left: float

    class Published(Action):
        round: str
        step: int

    class Lost(Action):
        round: str
        value: Optional[str]

    class Agreed(Action): ...

    class GaveUp(Action):
        """The leader's or the reader's retries gave up."""

        what: str
        attempts: int
        seconds: float

    class Missing(Action):
        round: str
        step: int
        missing: list[str]

    # The step-key reader (Event.Reading, Read, ReadFailed).
    class Read(Action):
        key: str
        timeout: float

    class Post(Action):
        round: str
        value: str

    class Done(Action): ...

    # The driver's writes (ProtocolCore.poll).
    class Write(Action):
        id: int
        kind: _WriteKind
        key: str
        value: str
        timeout: float
        what: str
        subject: str

    class Retrying(Action):
        id: int
        what: str
        attempts: int
        pause: float
        left: float

    class Written(Action):
        kind: _WriteKind
        key: str
        value: str
        what: str
        subject: str
        won: bool
        ends_notice: bool

    class WriteGaveUp(Action):
        kind: _WriteKind
        key: str
        value: str
        what: str
        subject: str
        attempts: int
        seconds: float
        ends_notice: bool

    class Raised(Action):
        kind: _WriteKind
        key: str
        value: str
        what: str
        subject: str
        ends_notice: bool

    class Dropped(Action):
        what: str

class Inbox:
    """The protocol driver's inputs in one place (``src/inbox.rs``); ``recv`` releases the GIL."""

    #: What an inbox holds (``Inbox.Input.Notice``, ``.StepKey``, ``.KeyReadFailed``, ``.Stop``).
    Input: ClassVar[type[_Input]]
    def __init__(self) -> None: ...
    def post(self, input: _Input) -> bool: ...
    def recv(
        self, timeout: Optional[float] = None, signals: Optional[SignalWatch] = None
    ) -> Optional[_Input]: ...
    def drain(self) -> list[_Input]: ...

class ClosureQueue:
    """TF's ``_CoordinatedClosureQueue`` on a native core; blocking calls release the GIL."""

    #: TF's ``_CLOSURE_QUEUE_MAX_SIZE``: the default ``max_size``.
    MAX_SIZE: int

    def __new__(cls, max_size: int = 262144, *args: Any, **kwargs: Any) -> ClosureQueue: ...
    def put(self, closure: Any, tag: Optional[int] = None) -> None: ...
    def get(self, timeout: Optional[float] = None, tag: Optional[int] = None) -> Any: ...
    def finish(
        self,
        error: Optional[BaseException] = None,
        *,
        put_back: Any = None,
        in_flight: bool = True,
    ) -> None: ...
    def wait(self, timeout: Optional[float] = None) -> bool: ...
    def stop(self) -> None: ...
    def clear_tag_unlocked(self, tag: int) -> None: ...
    def qsize(self) -> int: ...
    def queued_closures(self) -> list: ...
    def promote(self, closures: list) -> int: ...
    @staticmethod
    def poll_timeout(held: Optional[bool] = None) -> float: ...
    @property
    def inflight_closure_count(self) -> int: ...
    @inflight_closure_count.setter
    def inflight_closure_count(self, count: int) -> None: ...
    @property
    def _error(self) -> Optional[BaseException]: ...

class Completions:
    """A count of completions to wait on (the coordinator's ``RemoteValue``s); ``wait``
    releases the GIL."""

    def __init__(self, not_ready: Any) -> None: ...
    def advance(self) -> None: ...
    def wait(self, remote_value: Any, timeout: Optional[float] = None) -> bool: ...

class Timed:
    """Times from its construction to :meth:`add`, which adds the seconds to ``cell`` (a
    TF coordinator metric's cell)."""

    def __init__(self, cell: Any) -> None: ...
    def add(self) -> None: ...

def _type_layout_known() -> bool: ...
def is_worker_failure(e: object) -> bool: ...
def is_ps_failure(e: object) -> bool: ...
def classify_failure(e: object) -> tuple[bool, bool]: ...
def failed_ps_instances(message: str) -> set[int]: ...

RECORD_FIELDS: dict[str, bool]

def read_records(
    sources: list[tuple[str, Optional[bytes]]], task: Optional[tuple[str, str]] = None
) -> str:
    """JSON text: ``{"preemptions", "resumes", "skipped", "groups"}`` of the files ``(name, bytes,
    or None if unreadable)``; with ``task`` ``(job, str(task))``, its last exit or null."""

def record_valid(value: object, field: Optional[str] = None) -> bool: ...
def claim_resume(folder: str, job: str, task: str, preemption: Optional[str]) -> bool: ...
def stamp_record(record: dict[str, Any]) -> int: ...
def records_bound(timeout: Optional[float] = None, notice_line: bool = False) -> float: ...

class _Lane:
    """Which of the coordinator's threads asks (``src/ps_control/coordinator.rs``)."""

    class Poll(_Lane): ...

    class Release(_Lane):
        task: str
        def __init__(self, task: str) -> None: ...

    class Gone(_Lane):
        task: str
        def __init__(self, task: str) -> None: ...

    class Drain(_Lane):
        worker: int
        def __init__(self, worker: int) -> None: ...

    class Save(_Lane): ...
    class Join(_Lane): ...

    class Failure(_Lane):
        thread: int
        def __init__(self, thread: int) -> None: ...

    class Stop(_Lane): ...

class _CoordinatorEvent:
    """What the coordinator's threads report (``src/ps_control/coordinator.rs``)."""

    class Answered(_CoordinatorEvent):
        def __init__(self, task: str, answer: Any) -> None: ...

    class PollFailed(_CoordinatorEvent):
        def __init__(self, task: str, error: BaseException) -> None: ...

    class Watch(_CoordinatorEvent):
        def __init__(self, tasks: List[str], peer_timeout: Optional[float]) -> None: ...

    class Stop(_CoordinatorEvent): ...
    class RoundFailed(_CoordinatorEvent): ...

    class ReleaseStart(_CoordinatorEvent):
        def __init__(self, task: str, reason: str, bound: Optional[float]) -> None: ...

    class ReleaseAnswered(_CoordinatorEvent):
        def __init__(self, task: str, answer: Any) -> None: ...

    class ReleaseFailed(_CoordinatorEvent):
        def __init__(self, task: str, error: BaseException, busy: bool) -> None: ...

    class WaitGone(_CoordinatorEvent):
        def __init__(self, task: str, bound: float) -> None: ...

    class Probed(_CoordinatorEvent):
        def __init__(self, task: str, listening: bool) -> None: ...

    class DrainStart(_CoordinatorEvent):
        def __init__(self, worker: int, can_hold: bool) -> None: ...

    class Idled(_CoordinatorEvent):
        def __init__(self, worker: int, idle: bool) -> None: ...

    class DrainReleased(_CoordinatorEvent):
        def __init__(self, worker: int, ok: bool) -> None: ...

    class DrainWaited(_CoordinatorEvent):
        def __init__(self, worker: int, gone: bool) -> None: ...

    class SaveStart(_CoordinatorEvent):
        def __init__(self, bound: float, scheduled: Optional[int], held: bool) -> None: ...

    class Unfinished(_CoordinatorEvent):
        def __init__(
            self, count: int, queued: Optional[List[int]], in_flight: Optional[List[int]]
        ) -> None: ...

    class Promotable(_CoordinatorEvent):
        def __init__(self, found: List[int], takers: int) -> None: ...

    class Granted(_CoordinatorEvent): ...

    class OwnNotice(_CoordinatorEvent):
        def __init__(self, final_round: bool) -> None: ...

    class CheckpointSaved(_CoordinatorEvent): ...
    class TrainingGoesOn(_CoordinatorEvent): ...

    class ClosureFailed(_CoordinatorEvent):
        def __init__(self, thread: int) -> None: ...

    class FailureAnswered(_CoordinatorEvent):
        def __init__(self, thread: int, yes: bool) -> None: ...

    class RecoveryWaited(_CoordinatorEvent):
        def __init__(self, thread: int, running: bool, recovered: bool) -> None: ...

class _CoordinatorAction:
    """What a coordinator's thread does next (``src/ps_control/coordinator.rs``)."""

    class Poll(_CoordinatorAction):
        task: str
        timeout: float

    class Say(_CoordinatorAction):
        line: str
        task: str
        detail: str

    class Reconnect(_CoordinatorAction):
        task: str
        bound: float

    class Notice(_CoordinatorAction):
        task: str
        job: str
        index: int
        source: str
        deadline: Optional[float]

    class Release(_CoordinatorAction):
        task: str
        reason: str
        incarnation: Optional[str]
        notice_at: Optional[float]
        timeout: float

    class Released(_CoordinatorAction):
        task: str
        end: str
        detail: str

    class Probe(_CoordinatorAction):
        task: str
        timeout: float

    class Pause(_CoordinatorAction):
        timeout: float
        after: Optional[str]

    class GoneOver(_CoordinatorAction):
        gone: bool

    class Hold(_CoordinatorAction):
        bound: float

    class DrainRelease(_CoordinatorAction):
        task: str
        drained: bool
        hold: bool

    class DrainWaitGone(_CoordinatorAction):
        task: str
        bound: float
        holding: Optional[float]

    class DrainOver(_CoordinatorAction):
        held: bool
        why: Optional[str]
        bound: float
        outcome: Optional[str]

    class WaitAll(_CoordinatorAction):
        bound: float

    class WaitIdle(_CoordinatorAction):
        look: float
        looks: int

    class Promote(_CoordinatorAction):
        runs: List[int]

    class Grant(_CoordinatorAction):
        runs: List[int]
        wait: float

    class Saved(_CoordinatorAction):
        runs: Optional[int]
        finished_after: List[int]
        filled: List[int]
        error_wait: Optional[float]
        took: float

    class HoldAll(_CoordinatorAction):
        strict: bool

    class ReleaseSaved(_CoordinatorAction):
        task: str
        silence: float
        bound: float

    class StopWatch(_CoordinatorAction): ...

    class ResumeAll(_CoordinatorAction):
        runs: Optional[int]

    class Ask(_CoordinatorAction):
        question: str

    class Retry(_CoordinatorAction):
        why: str

    class Raise(_CoordinatorAction): ...

    class Recover(_CoordinatorAction):
        timeout: float

    class AfterRecovery(_CoordinatorAction):
        stopped: bool
        timed_out: bool
        timeout: float

    class StopRecovery(_CoordinatorAction):
        timeout: float
        def __init__(self, timeout: float) -> None: ...

    class Done(_CoordinatorAction): ...

class CoordinatorProtocol:
    """The coordinator's protocol object (``src/ps_control/coordinator.rs``)."""

    def __init__(
        self,
        tasks: List[str],
        peer_timeout: Optional[float] = None,
        interval: Optional[float] = None,
        call_timeout: Optional[float] = None,
        *,
        recovery_timeout: Optional[float] = None,
        clock: Optional[Callable[[], float]] = None,
    ) -> None: ...
    Event: type[_CoordinatorEvent]
    Action: type[_CoordinatorAction]
    Lane: type[_Lane]
    CallTimeout: type[_CallTimeout]

    def handle(self, event: _CoordinatorEvent) -> None: ...
    def poll(self, lane: _Lane) -> _CoordinatorAction: ...
    def poll_timeout(self, lane: _Lane) -> Optional[float]: ...
    def start_call(self, task: str) -> tuple[int, Optional[Abandoned]]:
        """A call to ``task`` starts now: its handle, and the earlier call it abandons
        (or None); raises ``CallTimeout`` while an earlier call holds the task up."""
    def call_returned(self, task: str, id: int) -> bool: ...
    @staticmethod
    def grpc_options_with_keepalive(current: str) -> Optional[str]:
        """``TF_GRPC_DEFAULT_OPTIONS`` with the keepalive options it does not name added
        (``src/ps_control/keepalive.rs``); None when it names them all."""
    def state(self) -> dict[str, Any]: ...

class TransientFailures:
    """TF's ``Cluster`` transient-failure tolerances (PS strikes per task, timeouts)."""

    def __init__(
        self,
        num_ps: int,
        num_workers: int,
        *,
        ps_threshold: Optional[int] = None,
        timeouts_threshold: Optional[int] = None,
    ) -> None: ...
    def record_and_ignore_transient_ps_failure(
        self, e: BaseException, *, ps_failure: Optional[bool] = None
    ) -> bool: ...
    def record_and_ignore_transient_timeouts(self, e: BaseException) -> bool: ...
    def state(self) -> dict[str, Any]: ...

class WatcherFnPoll:
    def __init__(self, inbox: Inbox, *, interval: float = ..., slow: float = ...) -> None: ...
    def next(self, fired: bool) -> bool: ...
    def stop(self, wait: bool = True) -> None: ...

class KeyWatch:
    """The watch of one coordination-service key (``src/sources/key_watch.rs``): each
    blocking get for ``next()`` seconds until it answers None; ``close()`` answers the
    bound on joining the watching thread."""

    def __init__(self, timeout: Optional[float] = None) -> None: ...
    def next(self) -> Optional[float]: ...
    def close(self) -> float: ...

class MetadataWatch:
    """Polls a cloud's metadata service (GCE, AWS, Azure) for termination notices."""

    def __init__(
        self,
        cloud: str,
        base_url: str,
        wake: Optional[Inbox] = None,
        *,
        interval: float = 0.5,
        request_timeout: float = 1.0,
    ) -> None: ...
    def close(self) -> None: ...

def platforms() -> list[dict[str, Any]]:
    """The platforms' table: each cloud's row (``name``, ``kind`` ``"cloud"``,
    ``variable``, ``host_port``, ``default_base``, ``exit_code``, ``grace_period`` and
    ``probe(base_url, timeout=None, *, terminating=False, sysfs=None) -> bool``), in
    detection order, then Kubernetes' (``name``, ``kind`` ``"scheduler"`` and
    ``sigterm_deadlines(unix_now, grace) -> (deadline, kill)``)."""

def coordination_bounds(
    write_timeout: Optional[float] = None,
    get: Optional[float] = None,
    cluster: Optional[float] = None,
) -> dict[str, Any]:
    """The bounds of a coordination client's calls, by name: ``write`` (s), ``probe_ms``
    and ``probe_join`` (s), ``get_ms`` (TensorFlow's milliseconds for a get of ``get``
    seconds, None without it) and ``cluster`` (s, a simulated cluster's waits)."""

DEFAULT_EXIT_CODE: int

# Checkpoint shares (src/shares.rs): which worker writes which tensor.
def assign_shares(
    sizes: list[int], pinned: list[bool], workers: int
) -> tuple[list[int], list[int]]: ...

class _SharesAction:
    """What a worker does next in the shares' waits (``SharesWaits.Action``; src/shares.rs
    ``SharesAction``)."""

    class Wait(_SharesAction):
        timeout: float
        bound: float

    class Look(_SharesAction): ...

    class Looked(_SharesAction):
        seen: bool
        looked: float

    class Merge(_SharesAction):
        bound: float

    class Keep(_SharesAction):
        needed: float
        left: float

class SharesWaits:
    """Every wait of one worker in the shares: the probe, or one save
    (src/shares.rs ``Waits``); reads the clock itself."""

    Action = _SharesAction

    def __init__(
        self, core: Optional[ProtocolCore] = None, chief: bool = False, probe: bool = False
    ) -> None: ...
    def handle(self, event: str, seen: bool = False) -> None: ...
    def poll(self) -> _SharesAction: ...
    def poll_timeout(self) -> float: ...

# Whether a non-chief's whole copy of a checkpoint may go to memory (src/host_memory.rs).
def copy_place(
    copy_bytes: int,
    cgroups: list[tuple[Optional[int], Optional[int], Optional[int]]],
    mem_available: Optional[int],
) -> tuple[str, int, Optional[int]]: ...

# SLURM (src/sources/slurm/job.rs): the job as one protocol object: its read, a
# notice's deadlines, the requeue after the save.
class _SlurmEvent:
    """What a thread tells the SLURM job (``SlurmJob.Event``, to ``SlurmJob.handle``)."""

    class Read(_SlurmEvent): ...

    class Notice(_SlurmEvent):
        def __init__(
            self, at: float, end: Optional[float], sigterms: Optional[int], srun_step: bool
        ) -> None: ...

    class Requeue(_SlurmEvent):
        def __init__(
            self, enabled: bool, procid: Optional[str], time_limit_signal: Optional[bool]
        ) -> None: ...

    class Exited(_SlurmEvent):
        def __init__(self, call: int, code: int, stdout: str, stderr: str) -> None: ...

    class NotRun(_SlurmEvent):
        def __init__(self, call: int, why: str, timed_out: bool) -> None: ...

class _SlurmAction:
    """What the thread that reported does next (``SlurmJob.Action``, from ``SlurmJob.handle``)."""

    class Scontrol(_SlurmAction):
        call: int
        args: list[str]
        timeout: float

    class Read(_SlurmAction):
        end_time: Optional[float]
        partition: Optional[str]
        grace_time: Optional[float]
        kill_wait: Optional[float]
        requeue: Optional[bool]
        error: Optional[str]

    class Deadlines(_SlurmAction):
        deadline: Optional[float]
        kill: Optional[float]
        unread: Optional[str]

    class Requeued(_SlurmAction):
        requeued: bool
        message: str
        what: str
        reason: Optional[str]
        took: float
        kill_in: Optional[float]
        kill_wait: Optional[float]
        job_state: Optional[str]

    class Done(_SlurmAction): ...

class SlurmJob:
    Event = _SlurmEvent
    Action = _SlurmAction

    def __init__(self, job_id: str, restart_count: int) -> None: ...
    def handle(self, event: _SlurmEvent) -> _SlurmAction: ...

# exit_guard.rs: after the last save, an exit still running just before the deadline
# ends with the exit code (grace::exit_guard_delay decides when).
def exit_guard(
    deadline: Optional[float] = None, now: float = 0.0, code: Optional[int] = None
) -> Optional[float]:
    """With ``code``: arms the guard (the seconds it waits, or None: not armed);
    without: stands every waiting guard down."""

EXIT_GUARD_LEAD: float
