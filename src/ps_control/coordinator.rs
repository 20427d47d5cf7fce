//! The coordinator's protocol object: every decision of a ParameterServerStrategy
//! coordinator about its tasks, in one place, sans-IO (quinn-proto's `Connection`
//! shape): events go in with `now` ([`Coordinator::handle`]), actions come out
//! ([`Coordinator::poll`]), and [`Coordinator::poll_timeout`] says how long a lane may
//! wait. The Python layer (`_coordinator/cluster_poller.py`, `worker_drain.py`,
//! `closure_drain.py`) only performs each action and reports its result as an event.
//!
//! The coordinator's threads each perform one [`Lane`] of the object:
//!
//! | lane | thread | what it decides |
//! | --- | --- | --- |
//! | [`Lane::Poll`] | the poller | the rounds: which task to ask, when, what an answer's log line is, which notice is handed on, which task is reconnected |
//! | [`Lane::Release`] | whoever releases | a release's call, and its retries by the core's retry rule |
//! | [`Lane::Gone`] | whoever waits | the wait for a released task's process to be gone: probes, pauses, the bound |
//! | [`Lane::Drain`] | a worker's drain | the drain of a worker with a notice ([`super::drain`]) |
//! | [`Lane::Save`] | the handler's save | the wait for the closures before the save ([`super::save_drain`]) and the run count it saves |
//! | [`Lane::Join`] | the training thread's waits | how long each slice of a `join()` (or a result's wait) lasts before the handler's checks |
//! | [`Lane::Failure`] | a worker thread whose closure raised | TF's questions about the error, in TF's order ([`crate::failure::response`]), what to do, the bound of the wait for the worker's recovery and what follows it |
//! | [`Lane::Stop`] | whoever stops the failure handling | how long the stop waits for the worker-recovery thread to let go of the cluster, and then for the thread to end |
//!
//! Every call to a task, whichever lane makes it, first asks the object whether it
//! may start ([`Coordinator::start_call`], [`super::Calls`]: at most one outstanding
//! call per task, the abandoned ones bounded) and reports its return
//! ([`Coordinator::call_returned`]).
//!
//! A task released stays unasked by the poll until the wait for it to be gone ends
//! (an op sent to an exiting process fails, and TensorFlow can hand that error to
//! another thread's op).
//!
//! Times: one clock, the caller's monotonic `now` (the binding's object owns it: set
//! at construction). A notice's deadline is a Unix time, as the task reported it: it
//! is handed on as such ([`Action::Notice`]) and placed on the monotonic clock when
//! its answer arrives ([`NoticeSeen::wall`], [`crate::notice::monotonic`]), for the
//! drain of that worker.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::drain::{DrainStep, Ended, Outcome, WorkerDrain};
use super::save_drain::{settle_looks, SaveDrain, SaveStep};
use super::{
    reconnect, runs_at_save, Abandoned, CallId, Calls, PollLog, Refused, Watch, ABANDON_AFTER, CALL_TIMEOUT, COORDINATOR_SILENCE,
    DEFAULT_DRAIN_BOUND, DRAIN_ERROR_WAIT, DRAIN_SETTLE_LOOK, EXIT_WAIT, JOIN_SLICE, MAX_ABANDONED, POLL_INTERVAL, PORT_PROBE_TIMEOUT,
    WORKER_GET_SLICE,
};
use crate::failure::response::{self as failure_response, AfterWait, Question, Response};
use crate::failure::{DEFAULT_WORKER_RECOVERY_TIMEOUT, STOP_LOCK_BOUND};
use crate::retry::{Retry, Verdict};

/// Seconds between two probes of a released task's port while the coordinator
/// waits for its process to be gone.
pub const GONE_PROBE_EVERY: f64 = 0.1;
/// Seconds a stopped poll lane may still take past its round's call and pause:
/// what the stop waits for it, beyond those.
pub const STOP_MARGIN: f64 = 1.0;

crate::wire! {
    /// Which of the coordinator's threads asks ([module docs](self)).
    pub enum Lane via lane {
        /// The poller's rounds.
        Poll {},
        /// The release of this task.
        Release { task: String },
        /// The wait for this task's process to be gone.
        Gone { task: String },
        /// The drain of this worker.
        Drain { worker: usize },
        /// The handler's save: the wait for the closures, and its steps around it.
        Save {},
        /// A wait of the training thread (`ClusterCoordinator.join()`, a result's
        /// `fetch()`) that makes the handler's checks between its slices.
        Join {},
        /// The response of this worker thread (its id) to its closure's error.
        Failure { thread: u64 },
        /// The stop of the worker-failure handling (its recovery thread).
        Stop {},
    }
}

/// What a task answered a poll with.
#[derive(Clone, Debug, PartialEq)]
pub enum PollAnswer {
    /// A task's answer: its incarnation, and its notice or none.
    Task { incarnation: String, notice: Option<NoticeSeen> },
    /// An answer that is no task's answer.
    Bad,
}

/// An error a call to a task raised.
#[derive(Clone, Debug, PartialEq)]
pub struct CallError {
    /// Its type's name.
    pub kind: String,
    /// What it says.
    pub message: String,
    /// The call used its whole bound (the task does not answer).
    pub timed_out: bool,
}

/// A task's answer to a release.
#[derive(Clone, Debug, PartialEq)]
pub enum ReleaseReply {
    /// Accepted: the task exits.
    Released,
    /// Refused, for this reason (the answer's `why`).
    Refused(String),
}

/// A task's notice, as its poll's answer gave it.
#[derive(Clone, Debug, PartialEq)]
pub struct NoticeSeen {
    /// When the task took it (Unix seconds; None: not a number).
    pub at: Option<f64>,
    /// Its source ("signal SIGTERM", "kubernetes").
    pub source: String,
    /// When the machine goes (Unix seconds), if the notice says.
    pub deadline: Option<f64>,
    /// The wall clock (Unix seconds) when the answer came: where `deadline` is
    /// placed on the coordinator's clock.
    pub wall: f64,
}

/// What a release's call came to.
#[derive(Clone, Debug, PartialEq)]
enum ReleaseAnswer {
    /// The task accepted it.
    Released,
    /// The task refused it (the answer's `why`).
    Refused(String),
    /// The call used its whole bound: the task does not answer.
    TimedOut(String),
    /// Not started: the task's earlier call has not returned.
    Busy(String),
    /// The call failed (the task may be gone, or another task's error was handed on).
    Failed(String),
}

/// How a release ended ([`Action::Released`], with the reason or the error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseEnd {
    /// Accepted: the task exits.
    Released,
    /// Refused by the task.
    Refused,
    /// The task does not answer.
    NoAnswer,
    /// The task is gone, or the retries gave up.
    Gone,
}

// The words of the log lines and records (the binding's `str`s).
crate::words!(ReleaseEnd {
    ReleaseEnd::Released => "released",
    ReleaseEnd::Refused => "refused",
    ReleaseEnd::NoAnswer => "no answer",
    ReleaseEnd::Gone => "gone",
});

/// Why a drain that held the worker's thread ends ([`Action::DrainOver`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainEnd {
    /// The worker process is gone.
    Gone,
    /// Released, but still answering after the exit wait (the action's `bound`).
    StillAnswers,
    /// A new incarnation of the worker answers.
    NewIncarnation,
    /// The coordinator's poller stopped.
    Stopped,
    /// The release failed and the worker still serves after the hold's bound (the
    /// action's `bound`).
    HoldBoundPassed,
}

// The words of the log lines and records (the binding's `str`s).
crate::words!(DrainEnd {
    DrainEnd::Gone => "gone",
    DrainEnd::StillAnswers => "still answers",
    DrainEnd::NewIncarnation => "new incarnation",
    DrainEnd::Stopped => "stopped",
    DrainEnd::HoldBoundPassed => "hold bound passed",
});

crate::wire! {
    /// What the caller reports ([`Coordinator::handle`]).
    pub enum CoordinatorEvent via coordinator_event {
        /// `task` answered its poll with `answer`.
        Answered { task: String, answer: PollAnswer },
        /// `task`'s poll raised `error`.
        PollFailed { task: String, error: CallError },
        /// The coordinator watches `tasks` (asked in this order each round) for a
        /// handler whose peer timeout is `peer_timeout` (None: [`DEFAULT_DRAIN_BOUND`]):
        /// its poll starts over (the failure handling's object takes on the watch).
        Watch { tasks: Vec<String>, peer_timeout: Option<f64> },
        /// The coordinator stops watching: every lane ends.
        Stop {},
        /// The poll lane's round failed (an error its caller did not expect): the round
        /// is over, the next one comes after the interval.
        RoundFailed {},
        /// Release `task` for `reason`, retrying for `bound` seconds (None: one call's
        /// timeout).
        ReleaseStart { task: String, reason: String, bound: Option<f64> },
        /// The release call of `task` answered `answer`.
        ReleaseAnswered { task: String, answer: ReleaseReply },
        /// The release call of `task` raised `error`; `busy`: it was not started (the
        /// task's earlier call has not returned).
        ReleaseFailed { task: String, error: CallError, busy: bool },
        /// Wait until `task`'s process is gone, at most `bound` seconds.
        WaitGone { task: String, bound: f64 },
        /// A probe of `task`'s port: `listening` when it accepted a connection.
        Probed { task: String, listening: bool },
        /// Drain `worker` (until its last notice's deadline, if it named one); `can_hold`:
        /// its thread can be held.
        DrainStart { worker: usize, can_hold: bool },
        /// The wait for `worker`'s closure in flight ended (`idle`: it finished).
        Idled { worker: usize, idle: bool },
        /// `worker`'s release ended (`ok`: accepted).
        DrainReleased { worker: usize, ok: bool },
        /// The wait for `worker`'s process ended (`gone`: it is gone).
        DrainWaited { worker: usize, gone: bool },
        /// The save waits for the closures, `bound` seconds; `scheduled` is the handler's
        /// run count (None: gaps not looked for); `held`: every worker thread was held.
        SaveStart { bound: f64, scheduled: Option<u64>, held: bool },
        /// What the save's wait left: the handler's runs unfinished (`count`), and by
        /// index when all are known (`queued`, `in_flight`).
        Unfinished { count: u64, queued: Option<Vec<u64>>, in_flight: Option<Vec<u64>> },
        /// Of the runs to promote, `found` are queued, and `takers` workers can run them.
        Promotable { found: Vec<u64>, takers: usize },
        /// The wait for the granted runs to be taken ended.
        Granted {},
        /// A notice the coordinator acts on (its own, or a PS's): `final_round` when its
        /// handler's final save round is already under way.
        OwnNotice { final_round: bool },
        /// The save's checkpoint is written.
        CheckpointSaved {},
        /// Training goes on in this process after the save (a grace period's countdown, a
        /// save that raised, an `exit_fn` that returned).
        TrainingGoesOn {},
        /// A closure's error on worker thread `thread` ([`Lane::Failure`]): its response
        /// starts.
        ClosureFailed { thread: u64 },
        /// The question [`Action::Ask`] asked of thread `thread` was answered `yes`.
        FailureAnswered { thread: u64, yes: bool },
        /// Thread `thread`'s wait for its worker's recovery ended: `running` whether the
        /// failure handling still runs, `recovered` whether the worker is back.
        RecoveryWaited { thread: u64, running: bool, recovered: bool },
    }
}

/// The coordinator's events (the Python name is the core's).
pub type Event = CoordinatorEvent;

crate::wire! {
    /// What the caller does next ([`Coordinator::poll`]).
    pub enum CoordinatorAction via coordinator_action {
        /// Ask `task` for its incarnation and notice, within `timeout` seconds; report
        /// [`Event::Answered`] or [`Event::PollFailed`].
        Poll { task: String, timeout: f64 },
        /// Log this line about `task` (`detail`: the error, or the incarnation).
        Say { line: PollLog, task: String, detail: String },
        /// Ask TensorFlow to reconnect to `task` (restarted, unknown to this coordinator),
        /// with no closure going to it meanwhile; each step within `bound` seconds.
        Reconnect { task: String, bound: f64 },
        /// Hand on `task`'s notice: a PS's is the coordinator's own; a worker is drained.
        Notice {
            task: String,
            job: String,
            index: usize,
            source: String,
            deadline: Option<f64>,
        },
        /// Call `task`'s release, within `timeout` seconds; report [`Event::ReleaseAnswered`].
        Release {
            task: String,
            reason: String,
            incarnation: Option<String>,
            notice_at: Option<f64>,
            timeout: f64,
        },
        /// The release of `task` ended: `end`, and the refusal's reason or the error.
        Released { task: String, end: ReleaseEnd, detail: String },
        /// Probe `task`'s port (a connection within `timeout` seconds); report
        /// [`Event::Probed`].
        Probe { task: String, timeout: f64 },
        /// Wait `timeout` seconds (or until the stop), then poll the lane again.
        /// `after`: the error that made a release wait before it is sent again.
        Pause { timeout: f64, after: Option<String> },
        /// The wait for the task's process ended: `gone` when it is.
        GoneOver { gone: bool },
        /// Hold the worker's thread and wait at most `bound` seconds for its closure in
        /// flight; report [`Event::Idled`].
        Hold { bound: f64 },
        /// Release the drained worker's process (run [`Lane::Release`]); report
        /// [`Event::DrainReleased`]. `drained`: its closure finished; `hold`: its thread is held.
        DrainRelease { task: String, drained: bool, hold: bool },
        /// Wait until the worker's process is gone (run [`Lane::Gone`]), at most `bound`;
        /// report [`Event::DrainWaited`]. `holding`: its release failed and it is kept
        /// out of the rotation this long in all (first wait only).
        DrainWaitGone { task: String, bound: f64, holding: Option<f64> },
        /// The drain is over; resume the worker's thread if `held`. `why` (None: nothing
        /// was held) and `bound` (the hold's, for [`Ended::HoldBoundPassed`]).
        DrainOver { held: bool, why: Option<DrainEnd>, bound: f64, outcome: Option<Outcome> },
        /// The threads cannot be held: wait for every scheduled closure, at most `bound`
        /// seconds; report [`Event::Unfinished`].
        WaitAll { bound: f64 },
        /// Wait for each held worker to be idle, each within [`Coordinator::poll_timeout`];
        /// a worker between two closures at the bound gets `looks` looks of `look`
        /// seconds. Report [`Event::Unfinished`].
        WaitIdle { look: f64, looks: u32 },
        /// Find which of these runs are still queued, and the workers that can take
        /// them; report [`Event::Promotable`].
        Promote { runs: Vec<u64> },
        /// Move these runs to the queue's head, let the held workers take that many, and
        /// wait at most `wait` seconds until they have; report [`Event::Granted`].
        Grant { runs: Vec<u64>, wait: f64 },
        /// The save's wait is over: runs `0..runs` are in the checkpoint (None: the run
        /// count is left as it is), `finished_after` run again, `filled` ran first.
        /// When the held workers left nothing unfinished, a closure's error is raised with
        /// a wait of `error_wait` seconds on the queue (None: the threads were not held;
        /// the wait for every closure raised it already).
        /// `took`: seconds the wait took.
        Saved {
            runs: Option<u64>,
            finished_after: Vec<u64>,
            filled: Vec<u64>,
            error_wait: Option<f64>,
            took: f64,
        },
        /// Hold every worker thread (`strict`: no closure at all; else one while the
        /// queue is full, so that a `schedule()` waiting for room returns).
        HoldAll { strict: bool },
        /// Release this PS task: the checkpoint its notice asked for is written. Not
        /// released, it leaves on its own `silence` seconds after the coordinator stops
        /// asking it (or at its notice's deadline).
        /// A failed release is sent again for `bound` seconds (the core's retry rule, within
        /// the task's notice's deadline).
        ReleaseSaved { task: String, silence: f64, bound: f64 },
        /// Stop the watch (the poller and every lane).
        StopWatch {},
        /// Resume every worker thread; the handler's run count is `runs` again when Some
        /// (the save had taken its unfinished runs off it).
        ResumeAll { runs: Option<u64> },
        /// Answer this question about the closure's error (TF's own call), then report
        /// [`Event::FailureAnswered`].
        Ask { question: Question },
        /// Put the closure back in the queue: the error is transient (the question answered
        /// yes says why).
        Retry { why: Question },
        /// The error is the closure's: re-raise it.
        Raise {},
        /// A worker failed: put the closure back and wait for its recovery, at most
        /// `timeout` seconds; report [`Event::RecoveryWaited`].
        Recover { timeout: f64 },
        /// What follows the recovery wait: run the recovery function unless `stopped` (the
        /// failure handling stopped: the thread ends); `timed_out`: the worker did not come
        /// back within `timeout` seconds (its closures run on the workers that are up).
        AfterRecovery { stopped: bool, timed_out: bool, timeout: f64 },
        /// Stop the failure handling: take the recovery thread's lock within `timeout`
        /// seconds (it holds it while a lost worker is away) to wake the waits; a wait for
        /// that thread to end gets what is left of it ([`Coordinator::poll_timeout`]).
        StopRecovery { timeout: f64 },
        /// Nothing to do in this lane: it ended (or never started).
        Done {},
    }
}

/// The coordinator's actions (the Python name is the core's).
pub type Action = CoordinatorAction;

#[derive(Debug, Default)]
struct PollLane {
    /// Tasks still to ask this round (None: between rounds).
    round: Option<VecDeque<String>>,
    /// When the next round starts.
    next_round: f64,
    /// Actions to hand out before the next poll (log lines, notices, reconnections).
    out: VecDeque<Action>,
}

#[derive(Debug)]
enum ReleasePhase {
    Call,
    Awaiting,
    Probing { error: String, until: f64 },
    Paused { until: f64, after: Option<String> },
    Over(ReleaseEnd, String),
}

#[derive(Debug)]
struct ReleaseLane {
    reason: String,
    retry: Retry,
    phase: ReleasePhase,
}

#[derive(Debug)]
struct GoneLane {
    until: f64,
    probed: Option<bool>,
    pause_until: f64,
}

#[derive(Debug)]
struct DrainLane {
    drain: WorkerDrain,
    next: DrainStep,
    incarnation: Option<String>,
    held: bool,
}

/// The handler's runs queued and in flight, by index.
type Runs = (Vec<u64>, Vec<u64>);

#[derive(Debug)]
struct SaveLane {
    drain: SaveDrain,
    next: Option<SaveStep>,
    scheduled: Option<u64>,
    /// The last report of what the wait left: the runs by index, and their count.
    left: Option<(Option<Runs>, u64)>,
    over: bool,
    /// The run count the save recorded.
    saved: Option<u64>,
    /// Every worker thread was held.
    held: bool,
    /// When the save's wait started.
    started: f64,
}

/// The coordinator's protocol object ([module docs](self)).
#[derive(Debug)]
pub struct Coordinator {
    tasks: Vec<String>,
    peer_timeout: f64,
    interval: f64,
    call_timeout: f64,
    stopped: bool,
    watch: Watch,
    leaving: BTreeSet<String>,
    poll: PollLane,
    releases: BTreeMap<String, ReleaseLane>,
    gone: BTreeMap<String, GoneLane>,
    drains: BTreeMap<usize, DrainLane>,
    save: Option<SaveLane>,
    /// The handler's actions not tied to a save's wait (its lane is [`Lane::Save`]).
    handler: VecDeque<Action>,
    /// PS tasks whose notice was handed on: released once the checkpoint is written.
    ps_noticed: BTreeSet<String>,
    /// Each task's last notice's deadline, on the coordinator's clock (its drain's).
    deadlines: BTreeMap<String, Option<f64>>,
    /// The bound of a worker thread's wait for its worker's recovery.
    recovery_timeout: f64,
    /// Each worker thread's response to its closure's error.
    failures: BTreeMap<u64, FailureLane>,
    /// When the stop of the failure handling started.
    stop: Option<f64>,
    /// The outstanding and abandoned calls to the tasks.
    calls: Calls,
}

/// One worker thread's response to its closure's error.
#[derive(Debug)]
struct FailureLane {
    /// The question asked last (None: none yet).
    asked: Option<Question>,
    next: Response,
    /// What followed the recovery wait, once it ended.
    after: Option<AfterWait>,
}

/// `("worker", 1)` of `/job:worker/replica:0/task:1`.
fn job_task(task: &str) -> (String, usize) {
    let mut job = String::new();
    let mut index = 0;
    for part in task.trim_matches('/').split('/') {
        if let Some(j) = part.strip_prefix("job:") {
            job = j.to_owned();
        } else if let Some(i) = part.strip_prefix("task:") {
            index = i.parse().unwrap_or(0);
        }
    }
    (job, index)
}

/// The device name of worker `index`.
#[must_use]
pub fn worker_task(index: usize) -> String {
    format!("/job:worker/replica:0/task:{index}")
}

impl Coordinator {
    /// The coordinator of `tasks` (device names, asked in this order each round);
    /// `peer_timeout` is its handler's (None: [`DEFAULT_DRAIN_BOUND`]), the bound of a
    /// served worker's own wait; `interval` and `call_timeout` default to
    /// [`POLL_INTERVAL`] and [`CALL_TIMEOUT`].
    #[must_use]
    pub fn new(tasks: Vec<String>, peer_timeout: Option<f64>, interval: Option<f64>, call_timeout: Option<f64>) -> Self {
        Coordinator {
            tasks,
            peer_timeout: peer_timeout.unwrap_or(DEFAULT_DRAIN_BOUND),
            interval: interval.unwrap_or(POLL_INTERVAL),
            call_timeout: call_timeout.unwrap_or(CALL_TIMEOUT),
            stopped: false,
            watch: Watch::new(),
            leaving: BTreeSet::new(),
            poll: PollLane::default(),
            releases: BTreeMap::new(),
            gone: BTreeMap::new(),
            drains: BTreeMap::new(),
            save: None,
            handler: VecDeque::new(),
            ps_noticed: BTreeSet::new(),
            deadlines: BTreeMap::new(),
            recovery_timeout: DEFAULT_WORKER_RECOVERY_TIMEOUT,
            failures: BTreeMap::new(),
            stop: None,
            calls: Calls::new(ABANDON_AFTER, MAX_ABANDONED),
        }
    }

    /// A call to `task` is to start at `now`: its handle, and the earlier call it
    /// abandons, if any ([`Calls::start`]).
    ///
    /// # Errors
    ///
    /// [`Refused`] while the task's earlier call holds up the next ones.
    pub fn start_call(&mut self, task: &str, now: f64) -> Result<(CallId, Option<Abandoned>), Refused> {
        self.calls.start(task, now)
    }

    /// Call `id` to `task` returned (an answer or an error); false when it was
    /// reported before ([`Calls::returned`]).
    pub fn call_returned(&mut self, task: &str, id: CallId) -> bool {
        self.calls.returned(task, id)
    }

    /// The bound of a worker thread's wait for its worker's recovery (None:
    /// [`DEFAULT_WORKER_RECOVERY_TIMEOUT`], TensorFlow's).
    #[must_use]
    pub fn with_recovery_timeout(mut self, timeout: Option<f64>) -> Self {
        self.recovery_timeout = timeout.unwrap_or(DEFAULT_WORKER_RECOVERY_TIMEOUT);
        self
    }

    /// Whether [`Event::Stop {}`] came.
    #[must_use]
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// The tasks, in the poll's order.
    #[must_use]
    pub fn tasks(&self) -> &[String] {
        &self.tasks
    }

    /// The poll's view of every task (incarnations, unanswered tasks).
    #[must_use]
    pub fn watch(&self) -> &Watch {
        &self.watch
    }

    /// Tasks released and not yet seen gone: not asked meanwhile.
    #[must_use]
    pub fn leaving(&self) -> &BTreeSet<String> {
        &self.leaving
    }

    /// An event at `now`.
    #[allow(clippy::too_many_lines)]
    pub fn handle(&mut self, event: Event, now: f64) {
        match event {
            Event::Answered {
                task,
                answer: PollAnswer::Bad,
            } => self.watch.bad_answer(&task),
            Event::Answered {
                task,
                answer: PollAnswer::Task { incarnation, notice },
            } => {
                let at = notice.as_ref().map(|n| n.at);
                if let Some(line) = self.watch.answered(&task, &incarnation, at) {
                    self.poll.out.push_back(Action::Say {
                        line,
                        task: task.clone(),
                        detail: incarnation,
                    });
                }
                if let Some(n) = notice {
                    let deadline = n.deadline.map(|d| crate::notice::monotonic(now, n.wall, d));
                    self.deadlines.insert(task.clone(), deadline);
                    if self.watch.hand_on(&task) {
                        let (job, index) = job_task(&task);
                        if job == "ps" {
                            self.ps_noticed.insert(task.clone());
                        }
                        self.poll.out.push_back(Action::Notice {
                            task,
                            job,
                            index,
                            source: n.source,
                            deadline: n.deadline,
                        });
                    }
                }
            }
            Event::PollFailed {
                task,
                error: CallError { kind, message, .. },
            } => {
                if let Some(line) = self.watch.failed(&task, &kind, &message) {
                    self.poll.out.push_back(Action::Say {
                        line,
                        task: task.clone(),
                        detail: message.clone(),
                    });
                }
                if reconnect(&task, &message) {
                    self.poll.out.push_back(Action::Reconnect {
                        task,
                        bound: super::RECONNECT_BOUND,
                    });
                }
            }
            Event::Watch { tasks, peer_timeout } => {
                self.tasks = tasks;
                self.peer_timeout = peer_timeout.unwrap_or(DEFAULT_DRAIN_BOUND);
                self.stopped = false;
                self.poll = PollLane::default();
            }
            Event::Stop {} => self.stopped = true,
            Event::RoundFailed {} => {
                self.poll.round = None;
                self.poll.next_round = now + self.interval;
            }
            Event::ReleaseStart { task, reason, bound } => {
                let retry = Retry::new(bound.unwrap_or(self.call_timeout));
                self.releases.insert(
                    task,
                    ReleaseLane {
                        reason,
                        retry,
                        phase: ReleasePhase::Call,
                    },
                );
            }
            Event::ReleaseAnswered { task, answer } => {
                let answer = match answer {
                    ReleaseReply::Released => ReleaseAnswer::Released,
                    ReleaseReply::Refused(why) => ReleaseAnswer::Refused(why),
                };
                self.release_answered(&task, answer, now);
            }
            Event::ReleaseFailed { task, error, busy } => {
                let answer = if busy {
                    ReleaseAnswer::Busy(error.message)
                } else if error.timed_out {
                    ReleaseAnswer::TimedOut(error.message)
                } else {
                    ReleaseAnswer::Failed(error.message)
                };
                self.release_answered(&task, answer, now);
            }
            Event::WaitGone { task, bound } => {
                self.gone.insert(
                    task,
                    GoneLane {
                        until: now + bound.max(0.0),
                        probed: None,
                        pause_until: f64::NEG_INFINITY,
                    },
                );
            }
            Event::Probed { task, listening } => {
                if let Some(lane) = self.releases.get_mut(&task) {
                    if let ReleasePhase::Probing { error, until } = &lane.phase {
                        // A task that still listens gets the release again after the pause.
                        lane.phase = if listening {
                            ReleasePhase::Paused {
                                until: *until,
                                after: Some(error.clone()),
                            }
                        } else {
                            ReleasePhase::Over(ReleaseEnd::Gone, error.clone())
                        };
                        return;
                    }
                }
                if let Some(lane) = self.gone.get_mut(&task) {
                    lane.probed = Some(listening);
                }
            }
            Event::DrainStart { worker, can_hold } => {
                let deadline = self.deadlines.get(&worker_task(worker)).copied().flatten();
                let mut drain = WorkerDrain::new(deadline, self.peer_timeout);
                let next = drain.start(can_hold, now);
                let incarnation = self
                    .watch
                    .incarnations()
                    .into_iter()
                    .find(|(t, _)| *t == worker_task(worker))
                    .map(|(_, i)| i);
                self.drains.insert(
                    worker,
                    DrainLane {
                        drain,
                        next,
                        incarnation,
                        held: false,
                    },
                );
            }
            Event::Idled { worker, idle } => {
                if let Some(lane) = self.drains.get_mut(&worker) {
                    lane.next = lane.drain.idled(idle);
                }
            }
            Event::DrainReleased { worker, ok } => {
                let stopped = self.stopped;
                if let Some(lane) = self.drains.get_mut(&worker) {
                    lane.next = lane.drain.released(ok, stopped, now);
                }
            }
            Event::DrainWaited { worker, gone } => {
                let stopped = self.stopped;
                let now_incarnation = self.incarnation_of(&worker_task(worker));
                if let Some(lane) = self.drains.get_mut(&worker) {
                    let same = now_incarnation == lane.incarnation;
                    lane.next = lane.drain.waited(gone, same, stopped, now);
                }
            }
            Event::SaveStart { bound, scheduled, held } => {
                let mut drain = SaveDrain::new(bound, scheduled);
                let next = drain.start(held, now);
                self.save = Some(SaveLane {
                    drain,
                    next: Some(next),
                    scheduled,
                    left: None,
                    over: false,
                    saved: None,
                    held,
                    started: now,
                });
            }
            Event::Unfinished { count, queued, in_flight } => {
                let runs = queued.zip(in_flight);
                if let Some(lane) = self.save.as_mut() {
                    let step = lane.drain.unfinished(runs.as_ref().map(|(q, f)| (q.as_slice(), f.as_slice())), now);
                    lane.left = Some((runs, count));
                    lane.next = Some(step);
                }
            }
            Event::Promotable { found, takers } => {
                if let Some(lane) = self.save.as_mut() {
                    lane.next = Some(lane.drain.promotable(&found, takers, now));
                }
            }
            Event::Granted {} => {
                if let Some(lane) = self.save.as_mut() {
                    lane.next = Some(lane.drain.granted());
                }
            }
            // With no grace period the save comes next: from now on no worker takes a
            // new closure (but for a schedule() waiting for room, which must return to
            // reach the check that saves).
            Event::OwnNotice { final_round } => {
                if !final_round {
                    self.handler.push_back(Action::HoldAll { strict: false });
                }
            }
            // Until then the PS tasks see the coordinator ask, and wait for it.
            Event::CheckpointSaved {} => {
                let mut noticed: Vec<String> = std::mem::take(&mut self.ps_noticed).into_iter().collect();
                noticed.sort_by_key(|t| job_task(t).1);
                for task in noticed {
                    let deadline = self.deadlines.get(&task).copied().flatten();
                    self.handler.push_back(Action::ReleaseSaved {
                        task,
                        silence: COORDINATOR_SILENCE,
                        bound: crate::retry::bound(self.peer_timeout, deadline, now),
                    });
                }
                self.handler.push_back(Action::StopWatch {});
            }
            // The closures left unfinished count again, and the workers take closures again.
            Event::TrainingGoesOn {} => {
                let runs = self.save.take().and_then(|l| match (l.saved, l.scheduled) {
                    (Some(saved), Some(scheduled)) if saved != scheduled => Some(scheduled),
                    _ => None,
                });
                self.handler.push_back(Action::ResumeAll { runs });
            }
            Event::ClosureFailed { thread } => {
                self.failures.insert(
                    thread,
                    FailureLane {
                        asked: None,
                        next: failure_response::respond(None, false),
                        after: None,
                    },
                );
            }
            Event::FailureAnswered { thread, yes } => {
                if let Some(lane) = self.failures.get_mut(&thread) {
                    lane.next = failure_response::respond(lane.asked, yes);
                }
            }
            Event::RecoveryWaited {
                thread,
                running,
                recovered,
            } => {
                if let Some(lane) = self.failures.get_mut(&thread) {
                    lane.after = Some(failure_response::after_recovery_wait(running, recovered));
                }
            }
        }
    }

    fn incarnation_of(&self, task: &str) -> Option<String> {
        self.watch.incarnations().into_iter().find(|(t, _)| t == task).map(|(_, i)| i)
    }

    fn release_answered(&mut self, task: &str, answer: ReleaseAnswer, now: f64) {
        let stopped = self.stopped;
        let Some(lane) = self.releases.get_mut(task) else {
            return;
        };
        let (error, probe) = match answer {
            ReleaseAnswer::Released => {
                self.leaving.insert(task.to_owned());
                lane.phase = ReleasePhase::Over(ReleaseEnd::Released, String::new());
                return;
            }
            ReleaseAnswer::Refused(why) => {
                lane.phase = ReleasePhase::Over(ReleaseEnd::Refused, why);
                return;
            }
            ReleaseAnswer::TimedOut(e) => {
                lane.phase = ReleasePhase::Over(ReleaseEnd::NoAnswer, e);
                return;
            }
            // Refused at once: this task's earlier call (a poll) has not returned.
            ReleaseAnswer::Busy(e) => (e, false),
            // TensorFlow can hand one task's error (a stopped PS's) to another thread's
            // next op: while the task still listens, the release is sent again (a
            // release is idempotent for the task).
            ReleaseAnswer::Failed(e) => (e, true),
        };
        match lane.retry.failed(now, stopped) {
            Verdict::GiveUp { .. } => lane.phase = ReleasePhase::Over(ReleaseEnd::Gone, error),
            Verdict::Again { at, .. } => {
                lane.phase = if probe {
                    ReleasePhase::Probing { error, until: at }
                } else {
                    ReleasePhase::Paused {
                        until: at,
                        after: Some(error),
                    }
                };
            }
        }
    }

    /// The next action of `lane` at `now`.
    pub fn poll(&mut self, lane: &Lane, now: f64) -> Action {
        match lane {
            Lane::Poll {} => self.poll_round(now),
            Lane::Release { task } => self.poll_release(task, now),
            Lane::Gone { task } => self.poll_gone(task, now),
            Lane::Drain { worker } => self.poll_drain(*worker),
            Lane::Save {} => self.poll_save(now),
            Lane::Join {} => Action::Done {},
            Lane::Failure { thread } => self.poll_failure(*thread),
            Lane::Stop {} => self.poll_stop(now),
        }
    }

    fn poll_failure(&mut self, thread: u64) -> Action {
        let Some(lane) = self.failures.get_mut(&thread) else {
            return Action::Done {};
        };
        let timeout = self.recovery_timeout;
        if let Some(after) = lane.after {
            self.failures.remove(&thread);
            return Action::AfterRecovery {
                stopped: after == AfterWait::Stopped,
                timed_out: after == AfterWait::TimedOut,
                timeout,
            };
        }
        match lane.next {
            Response::Ask(question) => {
                lane.asked = Some(question);
                Action::Ask { question }
            }
            Response::Recover => Action::Recover { timeout },
            Response::Retry(why) => {
                self.failures.remove(&thread);
                Action::Retry { why }
            }
            Response::Raise => {
                self.failures.remove(&thread);
                Action::Raise {}
            }
        }
    }

    /// The stop: the lock within [`STOP_LOCK_BOUND`] (the thread's end within what is
    /// left of it, [`Coordinator::poll_timeout`]).
    fn poll_stop(&mut self, now: f64) -> Action {
        self.stop = Some(now);
        Action::StopRecovery { timeout: STOP_LOCK_BOUND }
    }

    fn poll_round(&mut self, now: f64) -> Action {
        if let Some(action) = self.poll.out.pop_front() {
            return action;
        }
        if self.stopped {
            self.poll.round = None;
            return Action::Done {};
        }
        if self.poll.round.is_none() {
            if now < self.poll.next_round {
                return Action::Pause {
                    timeout: self.poll.next_round - now,
                    after: None,
                };
            }
            self.poll.round = Some(self.tasks.iter().cloned().collect());
        }
        let round = self.poll.round.as_mut().expect("a round");
        while let Some(task) = round.pop_front() {
            if !self.leaving.contains(&task) {
                return Action::Poll {
                    task,
                    timeout: self.call_timeout,
                };
            }
        }
        self.poll.round = None;
        self.poll.next_round = now + self.interval;
        Action::Pause {
            timeout: self.interval,
            after: None,
        }
    }

    fn poll_release(&mut self, task: &str, now: f64) -> Action {
        let (incarnation, notice_at) = self.watch.release_names(task);
        let call_timeout = self.call_timeout;
        let Some(lane) = self.releases.get_mut(task) else {
            return Action::Done {};
        };
        if let ReleasePhase::Paused { until, after } = &mut lane.phase {
            if now < *until && !self.stopped {
                // The error is said once, at the first pause after it.
                return Action::Pause {
                    timeout: *until - now,
                    after: after.take(),
                };
            }
            lane.phase = ReleasePhase::Call;
        }
        match &lane.phase {
            ReleasePhase::Call => {
                lane.phase = ReleasePhase::Awaiting;
                Action::Release {
                    task: task.to_owned(),
                    reason: lane.reason.clone(),
                    incarnation,
                    notice_at,
                    timeout: call_timeout,
                }
            }
            ReleasePhase::Probing { .. } => Action::Probe {
                task: task.to_owned(),
                timeout: PORT_PROBE_TIMEOUT,
            },
            ReleasePhase::Over(..) => {
                let Some(ReleaseLane {
                    phase: ReleasePhase::Over(end, detail),
                    ..
                }) = self.releases.remove(task)
                else {
                    unreachable!("the lane is over")
                };
                Action::Released {
                    task: task.to_owned(),
                    end,
                    detail,
                }
            }
            // Awaiting an answer that was not reported (a caller's bug): over.
            ReleasePhase::Awaiting | ReleasePhase::Paused { .. } => {
                self.releases.remove(task);
                Action::Released {
                    task: task.to_owned(),
                    end: ReleaseEnd::NoAnswer,
                    detail: "no answer reported".to_owned(),
                }
            }
        }
    }

    fn poll_gone(&mut self, task: &str, now: f64) -> Action {
        let stopped = self.stopped;
        let Some(lane) = self.gone.get_mut(task) else {
            return Action::Done {};
        };
        let ended = if stopped {
            Some(false)
        } else if let Some(listening) = lane.probed.take() {
            if !listening {
                Some(true)
            } else if now >= lane.until {
                Some(false)
            } else {
                lane.pause_until = now + GONE_PROBE_EVERY.min(lane.until - now);
                None
            }
        } else if now >= lane.pause_until {
            return Action::Probe {
                task: task.to_owned(),
                timeout: PORT_PROBE_TIMEOUT,
            };
        } else {
            None
        };
        match ended {
            Some(gone) => {
                self.gone.remove(task);
                // Either way it is asked again (a restarted task is watched like the first).
                self.leaving.remove(task);
                Action::GoneOver { gone }
            }
            None => Action::Pause {
                timeout: lane.pause_until - now,
                after: None,
            },
        }
    }

    fn poll_drain(&mut self, worker: usize) -> Action {
        let Some(lane) = self.drains.get_mut(&worker) else {
            return Action::Done {};
        };
        let task = worker_task(worker);
        match lane.next {
            DrainStep::Hold { bound } => {
                lane.held = true;
                Action::Hold { bound }
            }
            DrainStep::Release { drained, hold } => Action::DrainRelease { task, drained, hold },
            DrainStep::WaitGone { bound, holding } => Action::DrainWaitGone { task, bound, holding },
            DrainStep::Resume(why) => {
                let lane = self.drains.remove(&worker).expect("the lane");
                let (why, bound) = match why {
                    Ended::Gone => (DrainEnd::Gone, 0.0),
                    Ended::StillAnswers => (DrainEnd::StillAnswers, EXIT_WAIT),
                    Ended::NewIncarnation => (DrainEnd::NewIncarnation, 0.0),
                    Ended::Stopped => (DrainEnd::Stopped, 0.0),
                    Ended::HoldBoundPassed(bound) => (DrainEnd::HoldBoundPassed, bound),
                };
                Action::DrainOver {
                    held: lane.held,
                    why: Some(why),
                    bound,
                    outcome: lane.drain.outcome(),
                }
            }
            DrainStep::Done => {
                let lane = self.drains.remove(&worker).expect("the lane");
                Action::DrainOver {
                    held: lane.held,
                    why: None,
                    bound: 0.0,
                    outcome: lane.drain.outcome(),
                }
            }
        }
    }

    fn poll_save(&mut self, now: f64) -> Action {
        if let Some(action) = self.handler.pop_front() {
            return action;
        }
        let Some(lane) = self.save.as_mut() else {
            return Action::Done {};
        };
        if lane.over {
            return Action::Done {};
        }
        match lane.next.take() {
            Some(SaveStep::WaitAll { bound }) => Action::WaitAll { bound },
            Some(SaveStep::WaitIdle { .. }) => Action::WaitIdle {
                look: DRAIN_SETTLE_LOOK,
                looks: settle_looks(WORKER_GET_SLICE),
            },
            Some(SaveStep::Promote { runs }) => Action::Promote { runs },
            Some(SaveStep::Grant { runs, wait }) => Action::Grant { runs, wait },
            // Done, or WaitAll reported: what the checkpoint holds.
            Some(SaveStep::Done) | None => {
                lane.over = true;
                let (runs, finished_after) = match (&lane.left, lane.scheduled) {
                    (Some((Some((queued, in_flight)), _)), Some(scheduled)) => {
                        let saved = runs_at_save(scheduled, queued, in_flight);
                        (Some(saved.runs), saved.finished_after)
                    }
                    // Not all known by index (TensorFlow's coordinator): the unfinished
                    // ones are taken as the last.
                    (Some((None, count)), Some(scheduled)) => (Some(scheduled.saturating_sub(*count)), Vec::new()),
                    _ => (lane.scheduled, Vec::new()),
                };
                lane.saved = runs;
                Action::Saved {
                    runs,
                    finished_after,
                    filled: lane.drain.filled().to_vec(),
                    error_wait: lane.held.then_some(DRAIN_ERROR_WAIT),
                    took: now - lane.started,
                }
            }
        }
    }

    /// Seconds `lane` may wait from `now` before it is polled again (None: no bound:
    /// it waits for an event). For [`Lane::Save {}`], what is left of the save's bound;
    /// for a stopped [`Lane::Poll {}`], how long its round in progress may still take.
    #[must_use]
    pub fn poll_timeout(&self, lane: &Lane, now: f64) -> Option<f64> {
        match lane {
            Lane::Poll {} if self.stopped => Some(self.interval + self.call_timeout + STOP_MARGIN),
            Lane::Poll {} => self.poll.round.is_none().then(|| (self.poll.next_round - now).max(0.0)),
            Lane::Release { task } => match self.releases.get(task).map(|l| &l.phase) {
                Some(ReleasePhase::Paused { until, .. }) => Some((until - now).max(0.0)),
                _ => None,
            },
            Lane::Gone { task } => self.gone.get(task).map(|l| (l.pause_until - now).max(0.0)),
            Lane::Drain { worker: _ } => None,
            Lane::Save {} => self.save.as_ref().map(|l| l.drain.left(now)),
            Lane::Join {} => Some(JOIN_SLICE),
            Lane::Failure { thread: _ } => None,
            Lane::Stop {} => self.stop.map(|at| (at + STOP_LOCK_BOUND - now).max(0.0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PS: &str = "/job:ps/replica:0/task:0";
    const W0: &str = "/job:worker/replica:0/task:0";
    const W1: &str = "/job:worker/replica:0/task:1";
    const NOW: f64 = 1_024.0;

    fn coordinator() -> Coordinator {
        Coordinator::new(vec![PS.into(), W0.into(), W1.into()], Some(30.0), None, None)
    }

    fn answered(task: &str, incarnation: &str, notice: Option<(f64, Option<f64>)>) -> Event {
        answered_at(task, incarnation, notice, NOW)
    }

    /// An answer that came when the wall clock said `wall`.
    fn answered_at(task: &str, incarnation: &str, notice: Option<(f64, Option<f64>)>, wall: f64) -> Event {
        Event::Answered {
            task: task.into(),
            answer: PollAnswer::Task {
                incarnation: incarnation.into(),
                notice: notice.map(|(at, deadline)| NoticeSeen {
                    at: Some(at),
                    source: "signal SIGTERM".into(),
                    deadline,
                    wall,
                }),
            },
        }
    }

    /// One round: every task asked (answers from `answer`), the actions other than
    /// the polls, up to the pause.
    fn round(c: &mut Coordinator, now: f64, answer: &dyn Fn(&str) -> Event) -> (Vec<String>, Vec<Action>) {
        let (mut asked, mut said) = (Vec::new(), Vec::new());
        loop {
            match c.poll(&Lane::Poll {}, now) {
                Action::Poll { task, timeout } => {
                    assert_eq!(timeout, CALL_TIMEOUT);
                    c.handle(answer(&task), now);
                    asked.push(task);
                }
                Action::Pause { .. } | Action::Done {} => return (asked, said),
                other => said.push(other),
            }
        }
    }

    #[test]
    fn every_task_is_asked_each_round_and_rounds_are_an_interval_apart() {
        let mut c = coordinator();
        let (asked, said) = round(&mut c, NOW, &|t| answered(t, "a", None));
        assert_eq!(asked, [PS, W0, W1]);
        assert!(said.is_empty());
        assert_eq!(
            c.poll(&Lane::Poll {}, NOW + 0.25),
            Action::Pause {
                timeout: POLL_INTERVAL - 0.25,
                after: None
            }
        );
        assert_eq!(c.poll_timeout(&Lane::Poll {}, NOW + 0.25), Some(POLL_INTERVAL - 0.25));
        let (asked, _) = round(&mut c, NOW + POLL_INTERVAL, &|t| answered(t, "a", None));
        assert_eq!(asked.len(), 3);
    }

    #[test]
    fn a_failed_round_ends_and_the_next_comes_after_the_interval() {
        let mut c = coordinator();
        assert!(matches!(c.poll(&Lane::Poll {}, NOW), Action::Poll { .. }));
        assert_eq!(c.poll_timeout(&Lane::Poll {}, NOW), None);
        c.handle(Event::RoundFailed {}, NOW);
        assert_eq!(c.poll_timeout(&Lane::Poll {}, NOW), Some(POLL_INTERVAL));
        assert_eq!(
            c.poll(&Lane::Poll {}, NOW),
            Action::Pause {
                timeout: POLL_INTERVAL,
                after: None
            }
        );
        let (asked, _) = round(&mut c, NOW + POLL_INTERVAL, &|t| answered(t, "a", None));
        assert_eq!(asked, [PS, W0, W1]);
    }

    #[test]
    fn each_incarnations_first_notice_is_handed_on_once() {
        let mut c = coordinator();
        let notice = |t: &str| answered(t, "a", (t == W1).then_some((5.0, Some(50.0))));
        let (_, said) = round(&mut c, NOW, &notice);
        let handed = Action::Notice {
            task: W1.into(),
            job: "worker".into(),
            index: 1,
            source: "signal SIGTERM".into(),
            deadline: Some(50.0),
        };
        assert_eq!(said, [handed]);
        let (_, said) = round(&mut c, NOW + 1.0, &notice);
        assert!(said.is_empty());
        // Restarted and preempted again: handed on again, and said.
        let (_, said) = round(&mut c, NOW + 2.0, &|t| {
            answered(t, if t == W1 { "b" } else { "a" }, (t == W1).then_some((9.0, None)))
        });
        assert!(matches!(&said[0], Action::Say { line: PollLog::NewIncarnation, detail, .. } if detail == "b"));
        assert!(matches!(
            &said[1],
            Action::Notice {
                index: 1,
                deadline: None,
                ..
            }
        ));
    }

    #[test]
    fn a_failed_poll_is_said_once_a_streak_and_a_stale_worker_is_reconnected() {
        let mut c = coordinator();
        let stale = format!("PyFunc failed: {STALE_CONTEXT} matching");
        let fail = |t: &str| Event::PollFailed {
            task: t.into(),
            error: CallError {
                kind: "RuntimeError".into(),
                message: if t == PS { "refused".into() } else { stale.clone() },
                timed_out: false,
            },
        };
        let (_, said) = round(&mut c, NOW, &fail);
        let reconnects: Vec<_> = said.iter().filter(|a| matches!(a, Action::Reconnect { .. })).collect();
        // Never a PS; each with the bound of its steps.
        assert_eq!(reconnects.len(), 2);
        assert!(reconnects
            .iter()
            .all(|a| matches!(a, Action::Reconnect { bound, .. } if *bound == super::super::RECONNECT_BOUND)));
        assert_eq!(said.iter().filter(|a| matches!(a, Action::Say { .. })).count(), 3);
        let (_, said) = round(&mut c, NOW + 1.0, &fail);
        assert!(said.iter().all(|a| matches!(a, Action::Reconnect { .. })));
        c.handle(
            Event::Answered {
                task: PS.into(),
                answer: PollAnswer::Bad,
            },
            NOW,
        );
        assert_eq!(c.watch().unanswered_tasks()[0], (PS.to_owned(), "bad answer".to_owned()));
    }

    use super::super::STALE_CONTEXT;

    /// The event that reports `answer` of `task`'s release call.
    fn reported(task: &str, answer: ReleaseAnswer) -> Event {
        let error = |message: String, timed_out: bool| CallError {
            kind: "Error".into(),
            message,
            timed_out,
        };
        let task = task.to_owned();
        match answer {
            ReleaseAnswer::Released => Event::ReleaseAnswered {
                task,
                answer: ReleaseReply::Released,
            },
            ReleaseAnswer::Refused(why) => Event::ReleaseAnswered {
                task,
                answer: ReleaseReply::Refused(why),
            },
            ReleaseAnswer::TimedOut(e) => Event::ReleaseFailed {
                task,
                error: error(e, true),
                busy: false,
            },
            ReleaseAnswer::Busy(e) => Event::ReleaseFailed {
                task,
                error: error(e, false),
                busy: true,
            },
            ReleaseAnswer::Failed(e) => Event::ReleaseFailed {
                task,
                error: error(e, false),
                busy: false,
            },
        }
    }

    fn release(
        c: &mut Coordinator,
        task: &str,
        answers: &mut Vec<ReleaseAnswer>,
        listening: bool,
        now: &mut f64,
    ) -> ((ReleaseEnd, String), u32) {
        c.handle(
            Event::ReleaseStart {
                task: task.into(),
                reason: "drained".into(),
                bound: None,
            },
            *now,
        );
        let mut calls = 0;
        loop {
            match c.poll(&Lane::Release { task: task.into() }, *now) {
                Action::Release { timeout, .. } => {
                    assert_eq!(timeout, CALL_TIMEOUT);
                    calls += 1;
                    let answer = answers.remove(0);
                    c.handle(reported(task, answer), *now);
                }
                Action::Probe { .. } => c.handle(
                    Event::Probed {
                        task: task.into(),
                        listening,
                    },
                    *now,
                ),
                Action::Pause { timeout, after } => {
                    assert!(after.is_some());
                    // Polled again before the pause ends: the error is not said again.
                    let again = c.poll(&Lane::Release { task: task.into() }, *now + timeout / 2.0);
                    assert!(matches!(again, Action::Pause { after: None, .. }), "{again:?}");
                    *now += timeout;
                }
                Action::Released { end, detail, .. } => return ((end, detail), calls),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_release_names_what_the_poll_saw_and_a_released_task_is_not_asked_until_gone() {
        let mut c = coordinator();
        c.handle(answered(W1, "inc", Some((7.0, None))), NOW);
        c.handle(
            Event::ReleaseStart {
                task: W1.into(),
                reason: "drained".into(),
                bound: None,
            },
            NOW,
        );
        assert_eq!(
            c.poll(&Lane::Release { task: W1.into() }, NOW),
            Action::Release {
                task: W1.into(),
                reason: "drained".into(),
                incarnation: Some("inc".into()),
                notice_at: Some(7.0),
                timeout: CALL_TIMEOUT
            }
        );
        c.handle(reported(W1, ReleaseAnswer::Released), NOW);
        assert_eq!(
            c.poll(&Lane::Release { task: W1.into() }, NOW),
            Action::Released {
                task: W1.into(),
                end: ReleaseEnd::Released,
                detail: String::new(),
            }
        );
        assert!(c.leaving().contains(W1));
        let (asked, _) = round(&mut c, NOW, &|t| answered(t, "a", None));
        assert_eq!(asked, [PS, W0]);
        // Waited for: not gone within the bound, then asked again.
        c.handle(
            Event::WaitGone {
                task: W1.into(),
                bound: 0.15,
            },
            NOW,
        );
        let gone = Lane::Gone { task: W1.into() };
        assert_eq!(
            c.poll(&gone, NOW),
            Action::Probe {
                task: W1.into(),
                timeout: PORT_PROBE_TIMEOUT
            }
        );
        c.handle(
            Event::Probed {
                task: W1.into(),
                listening: true,
            },
            NOW,
        );
        assert!(matches!(c.poll(&gone, NOW), Action::Pause { timeout, .. } if (timeout - GONE_PROBE_EVERY).abs() < 1e-9));
        assert!(matches!(c.poll(&gone, NOW + 0.1), Action::Probe { .. }));
        c.handle(
            Event::Probed {
                task: W1.into(),
                listening: true,
            },
            NOW + 0.1,
        );
        assert!(matches!(c.poll(&gone, NOW + 0.1), Action::Pause { timeout, .. } if (timeout - 0.05).abs() < 1e-9));
        c.handle(
            Event::Probed {
                task: W1.into(),
                listening: true,
            },
            NOW + 0.15,
        );
        assert_eq!(c.poll(&gone, NOW + 0.15), Action::GoneOver { gone: false });
        assert!(c.leaving().is_empty());
        // A refused port: gone.
        c.handle(
            Event::WaitGone {
                task: W1.into(),
                bound: 10.0,
            },
            NOW,
        );
        c.poll(&gone, NOW);
        c.handle(
            Event::Probed {
                task: W1.into(),
                listening: false,
            },
            NOW,
        );
        assert_eq!(c.poll(&gone, NOW), Action::GoneOver { gone: true });
        // The stop ends a wait at once.
        c.handle(
            Event::WaitGone {
                task: W1.into(),
                bound: 10.0,
            },
            NOW,
        );
        c.handle(Event::Stop {}, NOW);
        assert_eq!(c.poll(&gone, NOW), Action::GoneOver { gone: false });
        assert_eq!(c.poll(&Lane::Poll {}, NOW), Action::Done {});
        assert_eq!(
            c.poll_timeout(&Lane::Poll {}, NOW),
            Some(POLL_INTERVAL + CALL_TIMEOUT + STOP_MARGIN)
        );
    }

    #[test]
    fn the_release_table() {
        use ReleaseAnswer as A;
        // (answers, the task listens, end and detail, calls)
        type Row = (Vec<A>, bool, (ReleaseEnd, String), u32);
        let rows: Vec<Row> = vec![
            (vec![A::Released], true, (ReleaseEnd::Released, String::new()), 1),
            (
                vec![A::Refused("no notice".into())],
                true,
                (ReleaseEnd::Refused, "no notice".into()),
                1,
            ),
            // A call that used its bound is not sent again.
            (vec![A::TimedOut("t".into())], true, (ReleaseEnd::NoAnswer, "t".into()), 1),
            // Another task's error while the task listens, or a refusal at once: again.
            (
                vec![A::Failed("e".into()), A::Released],
                true,
                (ReleaseEnd::Released, String::new()),
                2,
            ),
            (
                vec![A::Busy("b".into()), A::Released],
                false,
                (ReleaseEnd::Released, String::new()),
                2,
            ),
            // Failed and its port refuses: gone, not sent again.
            (vec![A::Failed("e".into())], false, (ReleaseEnd::Gone, "e".into()), 1),
        ];
        for (i, (mut answers, listening, end, calls)) in rows.into_iter().enumerate() {
            let mut c = coordinator();
            let mut now = NOW;
            assert_eq!(release(&mut c, PS, &mut answers, listening, &mut now), (end, calls), "row {i}");
        }
        // Failing for good: given up by the retry rule within its bound.
        let mut c = coordinator();
        let mut now = NOW;
        let mut answers: Vec<A> = (0..100).map(|_| A::Busy("b".into())).collect();
        let (end, calls) = release(&mut c, PS, &mut answers, true, &mut now);
        assert_eq!(end, (ReleaseEnd::Gone, "b".into()));
        assert!(
            calls >= crate::retry::MIN_ATTEMPTS && now - NOW <= CALL_TIMEOUT + 5.0,
            "{calls} {now}"
        );
    }

    fn drain_to_end(c: &mut Coordinator, worker: usize, idle: bool, released: bool, gone: &[bool], now: f64) -> Vec<Action> {
        let lane = Lane::Drain { worker };
        let mut actions = Vec::new();
        let mut gone = gone.to_vec();
        loop {
            let action = c.poll(&lane, now);
            actions.push(action.clone());
            match action {
                Action::Hold { .. } => c.handle(Event::Idled { worker, idle }, now),
                Action::DrainRelease { .. } => c.handle(Event::DrainReleased { worker, ok: released }, now),
                Action::DrainWaitGone { bound, .. } => {
                    let g = gone.remove(0);
                    c.handle(Event::DrainWaited { worker, gone: g }, now + bound);
                }
                _ => return actions,
            }
        }
    }

    #[test]
    fn a_drain_holds_releases_waits_and_resumes() {
        let mut c = coordinator();
        // The notice's deadline (a Unix time) is placed on the coordinator's clock as
        // its answer arrives: 31 s on.
        c.handle(answered_at(W1, "inc-1", Some((1.0, Some(1_700_000_031.0))), 1_700_000_000.0), NOW);
        c.handle(Event::DrainStart { worker: 1, can_hold: true }, NOW);
        let actions = drain_to_end(&mut c, 1, true, true, &[true], NOW);
        assert_eq!(actions[0], Action::Hold { bound: 30.0 });
        assert_eq!(
            actions[1],
            Action::DrainRelease {
                task: W1.into(),
                drained: true,
                hold: true
            }
        );
        assert!(matches!(actions[2], Action::DrainWaitGone { holding: None, .. }));
        assert_eq!(
            actions[3],
            Action::DrainOver {
                held: true,
                why: Some(DrainEnd::Gone),
                bound: 0.0,
                outcome: Some(Outcome::Released)
            }
        );
        assert_eq!(c.poll(&Lane::Drain { worker: 1 }, NOW), Action::Done {});
        // The coordinator cannot hold: released at once, waited for, nothing resumed.
        c.handle(
            Event::DrainStart {
                worker: 1,
                can_hold: false,
            },
            NOW,
        );
        let actions = drain_to_end(&mut c, 1, false, true, &[false], NOW);
        assert_eq!(
            actions[0],
            Action::DrainRelease {
                task: W1.into(),
                drained: false,
                hold: false
            }
        );
        assert_eq!(
            actions[2],
            Action::DrainOver {
                held: false,
                why: None,
                bound: 0.0,
                outcome: Some(Outcome::NoHold)
            }
        );
    }

    #[test]
    fn an_unreleased_worker_is_held_until_gone_or_a_new_incarnation_answers() {
        let mut c = coordinator();
        c.handle(answered(W1, "inc-1", None), NOW);
        c.handle(Event::DrainStart { worker: 1, can_hold: true }, NOW);
        let actions = drain_to_end(&mut c, 1, true, false, &[false, false, true], NOW);
        let hold = super::super::unreleased_hold_bound(None, 30.0, super::super::EXIT_WAIT, NOW);
        assert!(matches!(actions[2], Action::DrainWaitGone { holding: Some(h), .. } if h == hold));
        assert_eq!(actions.len(), 6);
        assert_eq!(
            actions[5],
            Action::DrainOver {
                held: true,
                why: Some(DrainEnd::Gone),
                bound: 0.0,
                outcome: Some(Outcome::NotReleased)
            }
        );
        // The poll sees a new incarnation meanwhile: resumed.
        c.handle(Event::DrainStart { worker: 1, can_hold: true }, NOW);
        c.poll(&Lane::Drain { worker: 1 }, NOW);
        c.handle(Event::Idled { worker: 1, idle: true }, NOW);
        c.poll(&Lane::Drain { worker: 1 }, NOW);
        c.handle(Event::DrainReleased { worker: 1, ok: false }, NOW);
        c.poll(&Lane::Drain { worker: 1 }, NOW);
        c.handle(answered(W1, "inc-2", None), NOW);
        c.handle(Event::DrainWaited { worker: 1, gone: false }, NOW + 30.0);
        assert_eq!(
            c.poll(&Lane::Drain { worker: 1 }, NOW),
            Action::DrainOver {
                held: true,
                why: Some(DrainEnd::NewIncarnation),
                bound: 0.0,
                outcome: Some(Outcome::NotReleased)
            }
        );
    }

    fn save(c: &mut Coordinator, scheduled: Option<u64>, held: bool, reports: &[Event]) -> Vec<Action> {
        c.handle(
            Event::SaveStart {
                bound: 5.0,
                scheduled,
                held,
            },
            NOW,
        );
        let mut actions = Vec::new();
        let mut reports = reports.to_vec();
        let mut at = NOW;
        loop {
            let action = c.poll(&Lane::Save {}, at);
            actions.push(action.clone());
            if matches!(action, Action::Saved { .. } | Action::Done {}) {
                return actions;
            }
            c.handle(reports.remove(0), NOW + 1.0);
            at = NOW + 1.0;
        }
    }

    fn unfinished(queued: &[u64], in_flight: &[u64]) -> Event {
        Event::Unfinished {
            queued: Some(queued.to_vec()),
            in_flight: Some(in_flight.to_vec()),
            count: (queued.len() + in_flight.len()) as u64,
        }
    }

    #[test]
    fn the_save_counts_the_finished_prefix_and_runs_the_gaps_first() {
        let mut c = coordinator();
        // Runs 8 and 9 unfinished of 10: saved at 8.
        let actions = save(&mut c, Some(10), true, &[unfinished(&[9], &[8])]);
        assert_eq!(
            actions[0],
            Action::WaitIdle {
                look: DRAIN_SETTLE_LOOK,
                looks: settle_looks(WORKER_GET_SLICE)
            }
        );
        assert_eq!(c.poll_timeout(&Lane::Save {}, NOW + 1.0), Some(4.0));
        assert_eq!(
            actions[1],
            Action::Saved {
                runs: Some(8),
                finished_after: vec![],
                filled: vec![],
                error_wait: Some(DRAIN_ERROR_WAIT),
                took: 1.0
            }
        );
        // Run 3 put back by a lost worker: promoted, granted, then all finished.
        let actions = save(
            &mut c,
            Some(10),
            true,
            &[
                unfinished(&[3], &[]),
                Event::Promotable { found: vec![3], takers: 1 },
                Event::Granted {},
                unfinished(&[], &[]),
            ],
        );
        assert_eq!(actions[1], Action::Promote { runs: vec![3] });
        assert_eq!(actions[2], Action::Grant { runs: vec![3], wait: 4.0 });
        assert_eq!(
            actions[4],
            Action::Saved {
                runs: Some(10),
                finished_after: vec![],
                filled: vec![3],
                error_wait: Some(DRAIN_ERROR_WAIT),
                took: 1.0
            }
        );
        // No worker to take the gap: saved at 3, the finished runs after it named.
        let actions = save(
            &mut c,
            Some(6),
            true,
            &[unfinished(&[3], &[]), Event::Promotable { found: vec![3], takers: 0 }],
        );
        assert_eq!(
            actions[2],
            Action::Saved {
                runs: Some(3),
                finished_after: vec![4, 5],
                filled: vec![],
                error_wait: Some(DRAIN_ERROR_WAIT),
                took: 1.0
            }
        );
    }

    #[test]
    fn tensorflows_coordinator_saves_with_the_unfinished_taken_as_the_last_runs() {
        let mut c = coordinator();
        let actions = save(
            &mut c,
            Some(10),
            false,
            &[Event::Unfinished {
                count: 3,
                queued: None,
                in_flight: None,
            }],
        );
        assert_eq!(actions[0], Action::WaitAll { bound: 5.0 });
        assert_eq!(
            actions[1],
            Action::Saved {
                runs: Some(7),
                finished_after: vec![],
                filled: vec![],
                error_wait: None,
                took: 1.0
            }
        );
        let actions = save(
            &mut c,
            Some(2),
            false,
            &[Event::Unfinished {
                count: 3,
                queued: None,
                in_flight: None,
            }],
        );
        assert!(matches!(actions[1], Action::Saved { runs: Some(0), .. }));
        assert_eq!(c.poll(&Lane::Save {}, NOW), Action::Done {});
        // No run count: left as it is.
        let actions = save(&mut c, None, true, &[unfinished(&[3], &[])]);
        assert!(matches!(actions[1], Action::Saved { runs: None, .. }));
    }

    #[test]
    fn a_lane_never_started_is_done() {
        let mut c = coordinator();
        assert_eq!(c.poll(&Lane::Drain { worker: 4 }, NOW), Action::Done {});
        assert_eq!(c.poll(&Lane::Save {}, NOW), Action::Done {});
        assert_eq!(c.poll(&Lane::Release { task: PS.into() }, NOW), Action::Done {});
        assert_eq!(c.poll(&Lane::Gone { task: PS.into() }, NOW), Action::Done {});
        assert_eq!(c.poll(&Lane::Join {}, NOW), Action::Done {});
        assert_eq!(c.poll_timeout(&Lane::Join {}, NOW), Some(JOIN_SLICE));
        c.handle(Event::TrainingGoesOn {}, NOW);
        assert_eq!(c.poll(&Lane::Save {}, NOW), Action::ResumeAll { runs: None });
        assert_eq!(job_task(W1), ("worker".to_owned(), 1));
    }

    #[test]
    fn a_notice_holds_the_workers_unless_the_final_round_is_under_way() {
        let mut c = coordinator();
        c.handle(Event::OwnNotice { final_round: false }, NOW);
        assert_eq!(c.poll(&Lane::Save {}, NOW), Action::HoldAll { strict: false });
        assert_eq!(c.poll(&Lane::Save {}, NOW), Action::Done {});
        c.handle(Event::OwnNotice { final_round: true }, NOW);
        assert_eq!(c.poll(&Lane::Save {}, NOW), Action::Done {});
    }

    #[test]
    fn the_ps_tasks_with_a_notice_are_released_after_the_save_then_the_watch_stops() {
        let mut c = Coordinator::new(
            vec![
                "/job:ps/replica:0/task:0".into(),
                "/job:ps/replica:0/task:1".into(),
                "/job:ps/replica:0/task:10".into(),
                W0.into(),
            ],
            None,
            None,
            None,
        );
        round(&mut c, NOW, &|t| {
            answered(t, "a", (!t.ends_with(":0") || t == PS).then_some((1.0, None)))
        });
        c.handle(Event::CheckpointSaved {}, NOW);
        let released: Vec<Action> = (0..4).map(|_| c.poll(&Lane::Save {}, NOW)).collect();
        let saved = |task: &str| Action::ReleaseSaved {
            task: task.into(),
            silence: COORDINATOR_SILENCE,
            bound: crate::retry::bound(DEFAULT_DRAIN_BOUND, None, NOW),
        };
        assert_eq!(
            released,
            [
                saved(PS),
                saved("/job:ps/replica:0/task:1"),
                saved("/job:ps/replica:0/task:10"),
                Action::StopWatch {}
            ]
        );
        // Once: a second save releases nothing more.
        c.handle(Event::CheckpointSaved {}, NOW);
        assert_eq!(c.poll(&Lane::Save {}, NOW), Action::StopWatch {});
    }

    #[test]
    fn training_that_goes_on_after_a_save_counts_its_unfinished_runs_again() {
        let mut c = coordinator();
        save(&mut c, Some(10), true, &[unfinished(&[9], &[8])]);
        c.handle(Event::TrainingGoesOn {}, NOW);
        assert_eq!(c.poll(&Lane::Save {}, NOW), Action::ResumeAll { runs: Some(10) });
        // All finished: the run count stays.
        save(&mut c, Some(10), true, &[unfinished(&[], &[])]);
        c.handle(Event::TrainingGoesOn {}, NOW);
        assert_eq!(c.poll(&Lane::Save {}, NOW), Action::ResumeAll { runs: None });
    }

    /// Every path of a closure's error through TF's questions, as a worker thread
    /// performs them: the answers given, the questions asked, the outcome.
    #[test]
    fn a_closures_error_meets_tfs_questions_one_at_a_time() {
        use Question::{DerivedCancellation, TransientPsFailure, TransientTimeout, WorkerFailure};
        let rows: &[(&[bool], &[Question], Action)] = &[
            (&[true], &[TransientPsFailure], Action::Retry { why: TransientPsFailure }),
            (
                &[false, true],
                &[TransientPsFailure, TransientTimeout],
                Action::Retry { why: TransientTimeout },
            ),
            (
                &[false, false, true],
                &[TransientPsFailure, TransientTimeout, DerivedCancellation],
                Action::Retry { why: DerivedCancellation },
            ),
            (
                &[false, false, false, false],
                &[TransientPsFailure, TransientTimeout, DerivedCancellation, WorkerFailure],
                Action::Raise {},
            ),
            (
                &[false, false, false, true],
                &[TransientPsFailure, TransientTimeout, DerivedCancellation, WorkerFailure],
                Action::Recover { timeout: 7.0 },
            ),
        ];
        for (answers, want_asked, want) in rows {
            let mut c = coordinator().with_recovery_timeout(Some(7.0));
            let lane = Lane::Failure { thread: 3 };
            c.handle(Event::ClosureFailed { thread: 3 }, NOW);
            let mut answers = answers.iter();
            let mut asked = Vec::new();
            let end = loop {
                match c.poll(&lane, NOW) {
                    Action::Ask { question } => {
                        asked.push(question);
                        let yes = *answers.next().expect("asked more than the row answers");
                        c.handle(Event::FailureAnswered { thread: 3, yes }, NOW);
                    }
                    other => break other,
                }
            };
            assert_eq!((&asked[..], &end), (*want_asked, want));
            assert!(answers.next().is_none());
            if end == (Action::Raise {}) || matches!(end, Action::Retry { .. }) {
                assert_eq!(c.poll(&lane, NOW), Action::Done {}, "the lane ends with its outcome");
            }
        }
    }

    #[test]
    fn after_the_recovery_wait_a_stop_wins() {
        // (running, recovered, stopped, timed out)
        let rows = [
            (false, false, true, false),
            (false, true, true, false),
            (true, true, false, false),
            (true, false, false, true),
        ];
        for (running, recovered, stopped, timed_out) in rows {
            let mut c = coordinator();
            c.handle(Event::ClosureFailed { thread: 1 }, NOW);
            for _ in 0..3 {
                c.poll(&Lane::Failure { thread: 1 }, NOW);
                c.handle(Event::FailureAnswered { thread: 1, yes: false }, NOW);
            }
            c.poll(&Lane::Failure { thread: 1 }, NOW);
            c.handle(Event::FailureAnswered { thread: 1, yes: true }, NOW);
            assert_eq!(
                c.poll(&Lane::Failure { thread: 1 }, NOW),
                Action::Recover {
                    timeout: DEFAULT_WORKER_RECOVERY_TIMEOUT
                }
            );
            c.handle(
                Event::RecoveryWaited {
                    thread: 1,
                    running,
                    recovered,
                },
                NOW,
            );
            assert_eq!(
                c.poll(&Lane::Failure { thread: 1 }, NOW),
                Action::AfterRecovery {
                    stopped,
                    timed_out,
                    timeout: DEFAULT_WORKER_RECOVERY_TIMEOUT
                }
            );
            assert_eq!(c.poll(&Lane::Failure { thread: 1 }, NOW), Action::Done {});
        }
    }

    #[test]
    fn the_stop_waits_for_the_recovery_thread_within_one_bound() {
        let mut c = coordinator();
        assert_eq!(c.poll_timeout(&Lane::Stop {}, NOW), None);
        assert_eq!(c.poll(&Lane::Stop {}, NOW), Action::StopRecovery { timeout: STOP_LOCK_BOUND });
        assert_eq!(c.poll_timeout(&Lane::Stop {}, NOW + 2.0), Some(STOP_LOCK_BOUND - 2.0));
        assert_eq!(c.poll_timeout(&Lane::Stop {}, NOW + 60.0), Some(0.0));
    }

    #[test]
    fn a_ps_released_after_the_save_is_retried_within_its_notices_deadline() {
        let mut c = coordinator();
        c.handle(answered_at(PS, "a", Some((1.0, Some(1_700_000_004.0))), 1_700_000_000.0), NOW);
        c.handle(Event::CheckpointSaved {}, NOW + 1.0);
        assert_eq!(
            c.poll(&Lane::Save {}, NOW + 1.0),
            Action::ReleaseSaved {
                task: PS.into(),
                silence: COORDINATOR_SILENCE,
                bound: crate::retry::bound(30.0, Some(NOW + 4.0), NOW + 1.0),
            }
        );
    }

    #[test]
    fn the_failure_handlings_object_takes_on_a_watch_and_a_second_one() {
        let mut c = Coordinator::new(Vec::new(), None, None, None);
        assert_eq!(
            c.poll(&Lane::Poll {}, NOW),
            Action::Pause {
                timeout: POLL_INTERVAL,
                after: None
            }
        );
        for _ in 0..2 {
            c.handle(
                Event::Watch {
                    tasks: vec![PS.into(), W1.into()],
                    peer_timeout: Some(30.0),
                },
                NOW,
            );
            let (asked, _) = round(&mut c, NOW, &|t| answered(t, "a", None));
            assert_eq!(asked, [PS, W1]);
            c.handle(Event::Stop {}, NOW);
            assert_eq!(c.poll(&Lane::Poll {}, NOW), Action::Done {});
        }
    }

    #[test]
    fn the_coordinator_decides_which_call_to_a_task_may_start() {
        let mut c = coordinator();
        let (first, abandoned) = c.start_call(PS, NOW).unwrap();
        assert!(abandoned.is_none());
        assert!(matches!(c.start_call(PS, NOW + 1.0), Err(Refused::Outstanding { .. })));
        // Another task is not held up by this one's call.
        assert!(c.start_call(W0, NOW + 1.0).is_ok());
        let (_, abandoned) = c.start_call(PS, NOW + ABANDON_AFTER).unwrap();
        assert_eq!(abandoned.map(|a| (a.count, a.max)), Some((1, MAX_ABANDONED)));
        assert!(c.call_returned(PS, first));
        assert!(!c.call_returned(PS, first));
    }
}
