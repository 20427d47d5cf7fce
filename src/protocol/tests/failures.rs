//! The "Failures" table of [`crate::step_resolution`]'s module
//! documentation, as tests of the core.
//!
//! Each row of [`ROWS`] is one row of that table (or one sentence after it),
//! named after it. A row runs a small cluster on a simulated clock: every
//! worker holds the real [`Protocol`] (configured through
//! [`Protocol::configure`], with no exit reserve: see
//! [`simulated_protocol`]), which owns its resolver, its grace planner, the
//! driver's writes and the retry bound ([`Protocol::retry_bound`]), plus a
//! [`Retry`] per blocking call of the reader and the training thread; the
//! test performs the "I/O" the way the Python layer does
//! (`_protocol/driver.py`, `retries.py`, `step_keys.py`, `agreement.py`),
//! against a scripted fake coordination service whose calls fail, per effect
//! and worker, during the windows the row lists (a window that ends is a
//! transient failure, one that never ends a permanent one). The row's check
//! then asserts what the table promises. The protocol's `now` and the
//! driver's clock (`at`) are both the simulated clock.
//!
//! What the simulation does for Python, as Python does it:
//!
//! * the **driver**: its receive waits for an input until the next write is
//!   due ([`Protocol::poll_timeout`]); then one input a turn (a reader's
//!   failure, then step keys, then notices; a notice waits while
//!   [`Protocol::writes_busy`]), then at most one attempt of the write
//!   [`Protocol::poll`] answers; a notice ([`Protocol::notice`]) or a step
//!   key ([`Protocol::step_key`]) queues its write in the protocol (retried
//!   for the protocol's bound); a failure goes to [`Protocol::write_failed`],
//!   a success to [`Protocol::written`], and the next [`Protocol::poll`] says
//!   what it came to; `close()` takes the inputs still waiting, then
//!   [`Protocol::close`] and its last attempts;
//! * the **reader**: reads the round's step key, a failed read retried by a
//!   [`Retry`] started at the first failure and dropped when a read answers;
//! * the **training thread**: [`Protocol::before_step`] before every step; a
//!   publish retried by a [`Retry`] started before its first attempt; the
//!   wait for the acknowledgements bounded by the peer timeout, a failed read
//!   counting as "not yet" under its own [`Retry`]; the save; an error the
//!   driver or the reader met is raised by the next `run()`.
//!
//! The workers of a synchronous cluster are at most one step apart: a step
//! ends once every worker still in the cluster has started it; a worker whose
//! peer raised raises too (its own pending error, or the peer's, which
//! TensorFlow's collectives and the error report bring it). A worker that
//! exited or closed leaves the cluster. A run that does not end within
//! [`END`] seconds hung.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

use super::cluster::simulated_protocol;
use super::{DriverAction, Protocol, WriteEnd};
use crate::retry::{self, Retry, Verdict, MAX_PAUSE, MIN_ATTEMPTS, TRANSIENT_FAILURE_WINDOW};
use crate::step_resolution::{
    KeyAction, Notice, Round, SaveAction, StepAction, ACK_VALUE, LAST_RUN_TO_CHECKPOINT, PREEMPTION_NOTICE_KEY, RUN_TO_CHECKPOINT,
    STOP_WATCHER, TERMINATED_WORKER,
};
use crate::writes::{Kind, WriteId};

/// The simulated clock advances by this much; every actor acts at most once
/// a tick.
const TICK: f64 = 0.01;
/// One training step.
const STEP: f64 = 0.1;
/// One checkpoint save.
const SAVE: f64 = 0.2;
/// A run still going at this time hung.
const END: f64 = 60.0;
/// A coordination-service call on an idle machine.
const FAST: f64 = 0.01;
/// TensorFlow's default peer timeout is 300 s; anything above the window
/// gives the same bound.
const PEER_TIMEOUT: f64 = 30.0;
const INF: f64 = f64::INFINITY;

// ---------------------------------------------------------------------------
// The script: which calls fail, when.
// ---------------------------------------------------------------------------

/// An effect the caller performs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    /// The driver writes `TERMINATED_WORKER`.
    Claim,
    /// The driver writes `TF_DEFAULT_PREEMPTION_NOTICE_KEY`.
    Announce,
    /// The training thread writes the round's step key.
    Publish,
    /// The reader reads the round's step key.
    Read,
    /// The driver writes `RECEIVED_SIGNAL_<round>_<id>`.
    Acknowledge,
    /// The leader reads the acknowledgements.
    AwaitAcks,
    /// The checkpoint save.
    Save,
    /// `STOP_WATCHER` to both step keys at shutdown.
    Shutdown,
    /// `report_error_to_cluster`.
    Report,
}

/// Calls of `effect` (by `worker`, or by any) fail at times within `windows`
/// (`[from, until)`); an `until` of [`INF`] is a permanent failure.
#[derive(Clone, Copy, Debug)]
struct Fault {
    effect: Effect,
    worker: Option<usize>,
    windows: &'static [(f64, f64)],
}

const fn fail(effect: Effect, windows: &'static [(f64, f64)]) -> Fault {
    Fault {
        effect,
        worker: None,
        windows,
    }
}

const fn fail_on(worker: usize, effect: Effect, windows: &'static [(f64, f64)]) -> Fault {
    Fault {
        effect,
        worker: Some(worker),
        windows,
    }
}

/// Every coordination-service call of the protocol fails during `windows`.
const fn everything(windows: &'static [(f64, f64)]) -> [Fault; 6] {
    [
        fail(Effect::Claim, windows),
        fail(Effect::Announce, windows),
        fail(Effect::Publish, windows),
        fail(Effect::Read, windows),
        fail(Effect::Acknowledge, windows),
        fail(Effect::AwaitAcks, windows),
    ]
}

const ALWAYS: &[(f64, f64)] = &[(0.0, INF)];

/// When a worker's handler closes.
#[derive(Clone, Copy, Debug)]
enum Close {
    /// `close()` at this time.
    At(f64),
    /// `close()` as soon as a step key waits in the driver's inbox.
    WhenAStepKeyWaits,
}

type Check = fn(&Outcome) -> Result<(), String>;

/// One row of the "Failures" table.
struct Row {
    /// The table's row, and what of it this row shows.
    name: &'static str,
    workers: usize,
    grace: f64,
    peer_timeout: f64,
    /// How long each coordination-service call takes.
    call: f64,
    /// `(worker, at)`: a notice reaches that worker's driver.
    notices: &'static [(usize, f64)],
    faults: &'static [Fault],
    closes: &'static [(usize, Close)],
    /// `(worker, from, until)`: that worker's driver thread is not scheduled
    /// (a loaded machine): it makes no turn in `[from, until)`.
    stalls: &'static [(usize, f64, f64)],
    check: Check,
}

// ---------------------------------------------------------------------------
// What happened.
// ---------------------------------------------------------------------------

/// What `run()` raised.
#[derive(Clone, Debug, PartialEq)]
enum Raised {
    /// The rule gave up on `effect`: the named error of `retries._named`.
    GaveUp { effect: Effect, attempts: u32, seconds: f64 },
    /// The leader's wait ended at the peer timeout with these keys not set.
    DeadlineExceeded { missing: Vec<String> },
    /// A peer raised: the collective (and the peer's report) fails this one.
    Peer,
}

/// One attempt of a coordination-service call.
#[derive(Clone, Debug)]
struct Attempt {
    t: f64,
    worker: usize,
    effect: Effect,
    ok: bool,
}

/// What one worker did.
#[derive(Debug, Default)]
struct WorkerOut {
    saves: Vec<(Round, u64)>,
    save_failures: u32,
    exited: Option<f64>,
    closed: Option<f64>,
    raised: Option<(f64, Raised)>,
    /// Every `GiveUp` of the rule: when, on what, after how many attempts
    /// over how long, and whether the handler was closing.
    gave_up: Vec<(f64, Effect, u32, f64, bool)>,
    warnings: Vec<String>,
    /// Step keys the driver took: when, which round, the value.
    keys_taken: Vec<(f64, Round, String)>,
    /// Every attempt of a driver's write: when, of what, when it was due,
    /// and whether a claim was due too.
    write_attempts: Vec<(f64, Effect, f64, bool)>,
    /// Step keys that read `STOP_WATCHER` (`KeyAction::Stop`).
    stops: u32,
    /// At close: the last attempts made, and whether each succeeded.
    last_attempts: Vec<(Effect, bool)>,
    /// At close: what was dropped (`"notice"`, `"claim"`).
    dropped: Vec<&'static str>,
    /// The error was reported to the cluster.
    reported: bool,
    leading: bool,
    needs_attention: bool,
}

struct Outcome {
    workers: Vec<WorkerOut>,
    /// Key → (value, when set).
    store: HashMap<String, (String, f64)>,
    log: Vec<Attempt>,
    /// Ended at [`END`] with a worker still going.
    hung: bool,
    call: f64,
    peer_timeout: f64,
}

// ---------------------------------------------------------------------------
// The simulation.
// ---------------------------------------------------------------------------

/// A write of the driver, as `retries.Write` holds it.
#[derive(Clone, Debug)]
enum Op {
    Claim,
    Announce,
    Ack(String),
}

impl Op {
    fn effect(&self) -> Effect {
        match self {
            Op::Claim => Effect::Claim,
            Op::Announce => Effect::Announce,
            Op::Ack(_) => Effect::Acknowledge,
        }
    }
}

#[derive(Debug)]
enum Train {
    /// The next `before_step` at this time.
    Ready(f64),
    Stepping {
        step: u64,
        ends: f64,
    },
    Publishing {
        round: Round,
        step: u64,
        ack_keys: Vec<String>,
        own_ack_key: Option<String>,
        retry: Retry,
        next: f64,
    },
    Awaiting {
        pending: VecDeque<String>,
        deadline: f64,
        retry: Option<Retry>,
        next: f64,
        since: f64,
    },
    Saving {
        round: Round,
        step: u64,
        ends: f64,
        ok: bool,
    },
    Done,
}

struct Worker {
    /// The handler's protocol: the resolver, the planner, the driver's writes.
    p: Protocol,
    // The inbox, and the driver.
    keys: VecDeque<(Round, String)>,
    notices: VecDeque<Notice>,
    read_failed: Option<Raised>,
    waiting: VecDeque<Notice>,
    ops: HashMap<WriteId, Op>,
    /// When each pending write is due, as the rule said.
    due: HashMap<WriteId, f64>,
    driver_free: f64,
    // The reader.
    reading: Option<Round>,
    read_retry: Option<Retry>,
    read_next: f64,
    // The training thread.
    train: Train,
    runs: u64,
    /// The step this worker is running or last ran.
    started: u64,
    /// An error handed to the next `run()`.
    pending: Option<Raised>,
    out: WorkerOut,
}

impl Worker {
    fn alive(&self) -> bool {
        self.out.exited.is_none() && self.out.closed.is_none() && self.out.raised.is_none()
    }
}

struct Sim<'a> {
    row: &'a Row,
    ws: Vec<Worker>,
    store: HashMap<String, (String, f64)>,
    log: Vec<Attempt>,
    notices_due: Vec<(usize, f64, bool)>,
    closes_due: Vec<(usize, Close, bool)>,
}

impl<'a> Sim<'a> {
    fn new(row: &'a Row) -> Self {
        let n = u32::try_from(row.workers).unwrap();
        let ws = (0..n)
            .map(|id| Worker {
                p: simulated_protocol(Some(id), n, row.grace, row.peer_timeout),
                keys: VecDeque::new(),
                notices: VecDeque::new(),
                read_failed: None,
                waiting: VecDeque::new(),
                ops: HashMap::new(),
                due: HashMap::new(),
                driver_free: 0.0,
                reading: Some(Round::Initial),
                read_retry: None,
                read_next: 0.0,
                train: Train::Ready(0.0),
                runs: 0,
                started: 0,
                pending: None,
                out: WorkerOut::default(),
            })
            .collect();
        Sim {
            row,
            ws,
            store: HashMap::new(),
            log: Vec::new(),
            notices_due: row.notices.iter().map(|&(w, at)| (w, at, false)).collect(),
            closes_due: row.closes.iter().map(|&(w, c)| (w, c, false)).collect(),
        }
    }

    fn fails(&self, effect: Effect, w: usize, t: f64) -> bool {
        self.row
            .faults
            .iter()
            .any(|f| f.effect == effect && (f.worker.is_none() || f.worker == Some(w)) && f.windows.iter().any(|&(a, b)| t >= a && t < b))
    }

    /// One attempt of `effect` by `w` at `t`: logged; whether it succeeded.
    fn call(&mut self, effect: Effect, w: usize, t: f64) -> bool {
        let ok = !self.fails(effect, w, t);
        self.log.push(Attempt { t, worker: w, effect, ok });
        ok
    }

    /// The coordination service's set: false when the key exists.
    fn set(&mut self, key: &str, value: &str, t: f64) -> bool {
        if self.store.contains_key(key) {
            return false;
        }
        self.store.insert(key.to_owned(), (value.to_owned(), t));
        true
    }

    fn run(mut self) -> Outcome {
        let mut hung = true;
        for i in 0..=(END / TICK) as u64 {
            let t = i as f64 * TICK;
            for k in 0..self.notices_due.len() {
                let (w, at, done) = self.notices_due[k];
                if !done && t >= at {
                    self.notices_due[k].2 = true;
                    if self.ws[w].alive() {
                        self.ws[w].notices.push_back(Notice::stated(t, None));
                    }
                }
            }
            for w in 0..self.ws.len() {
                self.reader(w, t);
            }
            for k in 0..self.closes_due.len() {
                let (w, close, done) = self.closes_due[k];
                let now = match close {
                    Close::At(at) => t >= at,
                    Close::WhenAStepKeyWaits => !self.ws[w].keys.is_empty(),
                };
                if !done && now {
                    self.closes_due[k].2 = true;
                    if self.ws[w].alive() {
                        self.ws[w].out.closed = Some(t);
                        self.shut_down(w, t);
                    }
                }
            }
            for w in 0..self.ws.len() {
                self.driver(w, t);
            }
            for w in 0..self.ws.len() {
                self.trainer(w, t);
            }
            if self.ws.iter().all(|w| !w.alive()) {
                hung = false;
                break;
            }
        }
        let workers = self
            .ws
            .into_iter()
            .map(|mut w| {
                w.out.leading = w.p.leading();
                w.out.needs_attention = w.p.needs_attention();
                w.out
            })
            .collect();
        Outcome {
            workers,
            store: self.store,
            log: self.log,
            hung,
            call: self.row.call,
            peer_timeout: self.row.peer_timeout,
        }
    }

    /// `step_keys._read_step_key` and `_watch_step_keys_until_done`.
    fn reader(&mut self, w: usize, t: f64) {
        let Some(round) = self.ws[w].reading else { return };
        if !self.ws[w].alive() || t < self.ws[w].read_next {
            return;
        }
        let call = self.row.call;
        if !self.call(Effect::Read, w, t) {
            let end = t + call;
            let bound = self.ws[w].p.retry_bound(end);
            let ws = &mut self.ws[w];
            let retry = ws.read_retry.get_or_insert_with(|| Retry::new(bound).started(end));
            match retry.failed(end, false) {
                Verdict::Again { at, .. } => ws.read_next = at.max(end),
                Verdict::GiveUp { attempts, seconds } => {
                    ws.out.gave_up.push((end, Effect::Read, attempts, seconds, false));
                    ws.read_failed = Some(Raised::GaveUp {
                        effect: Effect::Read,
                        attempts,
                        seconds,
                    });
                    ws.reading = None;
                }
            }
            return;
        }
        let value = self.store.get(round.key()).map(|(v, _)| v.clone());
        let grace = self.row.grace;
        let ws = &mut self.ws[w];
        ws.read_retry = None;
        ws.read_next = t + call.max(TICK);
        if let Some(value) = value {
            let last = value == STOP_WATCHER || round == Round::Final || grace <= 0.0;
            ws.keys.push_back((round, value));
            ws.reading = if last { None } else { Some(Round::Final) };
        }
    }

    /// One turn of `Driver._drive` (`_protocol/driver.py`).
    fn driver(&mut self, w: usize, t: f64) {
        let stalled = self.row.stalls.iter().any(|&(x, a, b)| x == w && t >= a && t < b);
        if !self.ws[w].alive() || t < self.ws[w].driver_free || stalled {
            return;
        }
        let ws = &mut self.ws[w];
        // The receive (`sources.receive(wait)`) returns an input, or nothing
        // once the next write is due (`Protocol::poll_timeout`), or at once
        // when a notice waited for the writes of the one before it and they
        // are done; with none of these, the driver sleeps. Such a notice starts
        // at the first turn after those writes end (here the next tick).
        let input = ws.read_failed.is_some() || !ws.keys.is_empty() || !ws.notices.is_empty();
        let write_due = ws.p.poll_timeout().is_some_and(|due| due <= t);
        let notice_free = !ws.waiting.is_empty() && !ws.p.writes_busy();
        if !(input || write_due || notice_free) {
            return;
        }
        if let Some(e) = ws.read_failed.take() {
            ws.pending.get_or_insert(e);
        } else if let Some((round, value)) = ws.keys.pop_front() {
            self.take_key(w, round, &value, t);
        } else if let Some(n) = ws.notices.pop_front() {
            ws.waiting.push_back(n);
        }
        while !self.ws[w].p.writes_busy() {
            let Some(n) = self.ws[w].waiting.pop_front() else { break };
            // The protocol queues the notice's write itself (a claim here: no
            // worker of the table leads without one).
            self.ws[w].p.notice(n, "a source", "notice", t, t).expect("configured");
            self.track_queued(w, t);
        }
        if let Some(DriverAction::Write { id, .. }) = self.ws[w].p.poll(t) {
            self.attempt(w, id, t, false);
        }
    }

    /// A write the protocol just queued (the newest pending one), due at `t`:
    /// the simulation follows it by its handle.
    fn track_queued(&mut self, w: usize, t: f64) {
        let ws = &mut self.ws[w];
        let Some(id) = ws.p.newest_write() else { return };
        if ws.ops.contains_key(&id) {
            return;
        }
        let call = ws.p.write_call(id).expect("pending");
        let op = match call.kind {
            Kind::Claim {} => Op::Claim,
            Kind::Announce {} => Op::Announce,
            Kind::Acknowledge {} => Op::Ack(call.key.clone()),
        };
        ws.ops.insert(id, op);
        ws.due.insert(id, t);
    }

    /// `_on_step_key`: the resolver, which queues the acknowledgement it asks for.
    fn take_key(&mut self, w: usize, round: Round, value: &str, t: f64) {
        let ws = &mut self.ws[w];
        ws.out.keys_taken.push((t, round, value.to_owned()));
        match ws
            .p
            .step_key(round, value, false, t, t)
            .expect("configured")
            .expect("the simulation writes run counts")
        {
            KeyAction::Acknowledge { .. } => self.track_queued(w, t),
            KeyAction::Stop => ws.out.stops += 1,
        }
    }

    /// The driver's attempt of a `DriverAction::Write` and its report to the
    /// protocol (`written`, `write_failed`), which queues what follows and says
    /// what the write came to (the next `poll`). Returns whether the attempt
    /// succeeded.
    fn attempt(&mut self, w: usize, id: WriteId, t: f64, closing: bool) -> bool {
        let op = self.ws[w].ops[&id].clone();
        let end = t + self.row.call;
        let ws = &mut self.ws[w];
        ws.driver_free = end;
        let claim_due = ws
            .ops
            .iter()
            .any(|(other, o)| *other != id && matches!(o, Op::Claim) && ws.due[other] <= t);
        ws.out.write_attempts.push((t, op.effect(), ws.due[&id], claim_due));
        if !self.call(op.effect(), w, t) {
            self.ws[w].p.write_failed(id, end, closing);
            match self.ws[w].p.poll(end) {
                Some(DriverAction::Retrying { pause, .. }) => {
                    self.ws[w].due.insert(id, end + pause);
                }
                Some(DriverAction::Finished {
                    end: WriteEnd::GaveUp { attempts, seconds },
                    ..
                }) => {
                    let ws = &mut self.ws[w];
                    ws.ops.remove(&id);
                    ws.due.remove(&id);
                    ws.out.gave_up.push((end, op.effect(), attempts, seconds, closing));
                    let error = Raised::GaveUp {
                        effect: op.effect(),
                        attempts,
                        seconds,
                    };
                    match op {
                        // The protocol no longer counts on a claim it gave up.
                        Op::Claim => {
                            ws.pending.get_or_insert(error);
                        }
                        Op::Ack(_) if !closing => {
                            ws.pending.get_or_insert(error);
                        }
                        Op::Ack(_) => ws.out.warnings.push("closing: acknowledgement failed".into()),
                        Op::Announce => ws.out.warnings.push(format!("could not publish {PREEMPTION_NOTICE_KEY}")),
                    }
                }
                other => panic!("a failed write is retried or given up: {other:?}"),
            }
            return false;
        }
        let id_str = self.ws[w].p.resolver().expect("configured").id().to_owned();
        let written = match &op {
            Op::Claim => self.set(TERMINATED_WORKER, &id_str, t),
            Op::Announce => self.set(PREEMPTION_NOTICE_KEY, &id_str, t),
            Op::Ack(key) => self.set(key, ACK_VALUE, t),
        };
        let ws = &mut self.ws[w];
        ws.ops.remove(&id);
        ws.due.remove(&id);
        ws.p.written(id, written, t, t);
        let report = ws.p.poll(t);
        assert!(matches!(report, Some(DriverAction::Finished { .. })), "{report:?}");
        // The protocol queues the announce of a won claim itself.
        self.track_queued(w, t);
        true
    }

    /// `close()` (and the exit path): the driver's last look
    /// (`Driver._finish`), then the shutdown writes
    /// (`_stop_peer_watcher`). Nothing waits for them.
    fn shut_down(&mut self, w: usize, t: f64) {
        while let Some((round, value)) = self.ws[w].keys.pop_front() {
            self.take_key(w, round, &value, t);
        }
        let ws = &mut self.ws[w];
        ws.read_failed = None; // closing: logged
        ws.waiting.extend(ws.notices.drain(..));
        ws.p.close(t);
        let mut dropped_claim = false;
        while let Some(action) = self.ws[w].p.poll(t) {
            match action {
                DriverAction::Dropped { .. } => dropped_claim = true,
                DriverAction::Write { id, .. } => {
                    self.ws[w].due.insert(id, t);
                    let effect = self.ws[w].ops[&id].effect();
                    let ok = self.attempt(w, id, t, true);
                    self.ws[w].out.last_attempts.push((effect, ok));
                }
                other => panic!("only last attempts and a dropped claim at close: {other:?}"),
            }
        }
        let ws = &mut self.ws[w];
        for _ in ws.waiting.drain(..) {
            ws.out.dropped.push("notice");
        }
        if dropped_claim {
            let claims: Vec<WriteId> = ws.ops.iter().filter(|(_, o)| matches!(o, Op::Claim)).map(|(id, _)| *id).collect();
            for id in claims {
                ws.ops.remove(&id);
                ws.due.remove(&id);
            }
            ws.out.dropped.push("claim");
        }
        ws.reading = None;
        ws.train = Train::Done;
        for key in self.ws[w].p.shutdown_keys().expect("configured") {
            if self.call(Effect::Shutdown, w, t) {
                self.set(key, STOP_WATCHER, t);
            } else {
                self.ws[w].out.warnings.push(format!("ignoring error while releasing {key}"));
            }
        }
    }

    /// `run()` raises `error` (and reports it to the cluster).
    fn raise(&mut self, w: usize, error: Raised, t: f64) {
        let report = error != Raised::Peer && self.call(Effect::Report, w, t);
        let ws = &mut self.ws[w];
        if error != Raised::Peer && !report {
            ws.out.warnings.push("could not report the error to the cluster".into());
        }
        ws.out.reported = report;
        ws.out.raised = Some((t, error));
        ws.train = Train::Done;
        ws.reading = None;
    }

    /// One look of the training thread (`step_check`, `agreement`, `save`).
    #[allow(clippy::too_many_lines)]
    fn trainer(&mut self, w: usize, t: f64) {
        if !self.ws[w].alive() {
            return;
        }
        let call = self.row.call;
        match std::mem::replace(&mut self.ws[w].train, Train::Done) {
            Train::Ready(at) if t >= at => {
                if let Some(e) = self.ws[w].pending.take() {
                    return self.raise(w, e, t);
                }
                let ws = &mut self.ws[w];
                let action = ws.p.before_step(ws.runs, t).expect("configured");
                let runs = ws.runs;
                self.ws[w].train = match action {
                    StepAction::Proceed => {
                        // The checks took no time: the step starts now.
                        self.ws[w].p.checks_done(t);
                        self.ws[w].started = runs + 1;
                        Train::Stepping {
                            step: runs + 1,
                            ends: t + STEP,
                        }
                    }
                    StepAction::Publish {
                        round,
                        step,
                        ack_keys,
                        own_ack_key,
                    } => Train::Publishing {
                        round,
                        step,
                        ack_keys,
                        own_ack_key,
                        retry: Retry::new(self.ws[w].p.retry_bound(t)).started(t),
                        next: t,
                    },
                    StepAction::Save { round, step } => Train::Saving {
                        round,
                        step,
                        ends: t + SAVE,
                        ok: !self.fails(Effect::Save, w, t),
                    },
                };
            }
            Train::Stepping { step, ends } if t >= ends => {
                if self.ws.iter().any(|v| v.out.raised.is_some()) {
                    let e = self.ws[w].pending.take().unwrap_or(Raised::Peer);
                    return self.raise(w, e, t);
                }
                let joined = self.ws.iter().all(|v| !v.alive() || v.started >= step);
                let ws = &mut self.ws[w];
                if joined {
                    ws.runs = step;
                    // The step's sample is its own STEP, from its start to `ends`
                    // (the wait for the peers is not timed): the interval from
                    // `checks_done` at its start to this `step_started`.
                    ws.p.step_started(ends);
                    ws.train = Train::Ready(t);
                } else {
                    ws.train = Train::Stepping { step, ends };
                }
            }
            Train::Publishing {
                round,
                step,
                ack_keys,
                own_ack_key,
                mut retry,
                next,
            } if t >= next => {
                let end = t + call;
                if self.call(Effect::Publish, w, t) {
                    if !self.set(round.key(), &step.to_string(), t) {
                        self.ws[w].out.warnings.push(format!("{} was already set", round.key()));
                        self.ws[w].train = Train::Ready(end);
                        return;
                    }
                    if let Some(own) = &own_ack_key {
                        self.set(own, ACK_VALUE, t);
                    }
                    self.ws[w].train = Train::Awaiting {
                        pending: ack_keys.into(),
                        deadline: end + self.row.peer_timeout,
                        retry: None,
                        next: end,
                        since: t,
                    };
                    return;
                }
                // The training thread knows when its attempt started (Retrier.call).
                retry.attempt(t);
                match retry.failed(end, false) {
                    Verdict::Again { at, .. } => {
                        self.ws[w].train = Train::Publishing {
                            round,
                            step,
                            ack_keys,
                            own_ack_key,
                            retry,
                            next: at.max(end),
                        };
                    }
                    Verdict::GiveUp { attempts, seconds } => {
                        self.ws[w].out.gave_up.push((end, Effect::Publish, attempts, seconds, false));
                        let error = Raised::GaveUp {
                            effect: Effect::Publish,
                            attempts,
                            seconds,
                        };
                        self.raise(w, error, end);
                    }
                }
            }
            Train::Awaiting {
                mut pending,
                deadline,
                mut retry,
                next,
                since,
            } if t >= next => {
                if pending.is_empty() {
                    let ws = &mut self.ws[w];
                    ws.p.handle_agreement(t - since);
                    // `before_step` again: Proceed (the step runs).
                    let action = ws.p.before_step(ws.runs, t).expect("configured");
                    assert_eq!(action, StepAction::Proceed);
                    ws.p.checks_done(t);
                    ws.started = ws.runs + 1;
                    ws.train = Train::Stepping {
                        step: ws.runs + 1,
                        ends: t + STEP,
                    };
                    return;
                }
                if t >= deadline {
                    let error = match retry {
                        Some(r) => Raised::GaveUp {
                            effect: Effect::AwaitAcks,
                            attempts: r.attempts(),
                            seconds: t - r.since().unwrap_or(t),
                        },
                        None => Raised::DeadlineExceeded {
                            missing: pending.into_iter().filter(|k| !self.store.contains_key(k)).collect(),
                        },
                    };
                    return self.raise(w, error, t);
                }
                let end = t + call;
                let mut next = end.max(t + TICK);
                if self.call(Effect::AwaitAcks, w, t) {
                    retry = None;
                    if self.store.contains_key(&pending[0]) {
                        pending.pop_front();
                        next = t;
                    }
                } else {
                    let bound = self.ws[w].p.retry_bound(end);
                    let r = retry.get_or_insert_with(|| Retry::new(bound).started(end));
                    match r.failed(end, false) {
                        Verdict::Again { at, .. } => next = at.min(deadline).max(end),
                        Verdict::GiveUp { attempts, seconds } => {
                            self.ws[w].out.gave_up.push((end, Effect::AwaitAcks, attempts, seconds, false));
                            let error = Raised::GaveUp {
                                effect: Effect::AwaitAcks,
                                attempts,
                                seconds,
                            };
                            return self.raise(w, error, end);
                        }
                    }
                }
                self.ws[w].train = Train::Awaiting {
                    pending,
                    deadline,
                    retry,
                    next,
                    since,
                };
            }
            Train::Saving { round, step, ends, ok } if t >= ends => {
                let ws = &mut self.ws[w];
                if !ok {
                    // `run()` raises the save's error; the script runs again.
                    ws.p.handle_save_failed(false).expect("configured");
                    ws.out.save_failures += 1;
                    ws.train = Train::Ready(t);
                    return;
                }
                ws.out.saves.push((round, step));
                match ws
                    .p
                    .handle_saved(round, SAVE)
                    .expect("configured")
                    .expect("a save that was asked for")
                {
                    SaveAction::Countdown => ws.train = Train::Ready(t),
                    SaveAction::Exit => {
                        ws.out.exited = Some(t);
                        self.shut_down(w, t);
                    }
                }
            }
            other => self.ws[w].train = other,
        }
    }
}

fn simulate(row: &Row) -> Outcome {
    Sim::new(row).run()
}

// ---------------------------------------------------------------------------
// Checks.
// ---------------------------------------------------------------------------

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        let holds: bool = $cond;
        if !holds {
            return Err(format!($($fmt)+));
        }
    };
}

/// "Every worker still saves at one step and exits": each worker saved
/// `rounds` times, the workers agree round by round, nobody raised.
fn every_worker_saves_at_one_step(o: &Outcome, rounds: usize) -> Result<(), String> {
    for (i, w) in o.workers.iter().enumerate() {
        ensure!(w.raised.is_none(), "worker {i} raised {:?}", w.raised);
        ensure!(w.exited.is_some(), "worker {i} did not exit");
        ensure!(w.saves.len() == rounds, "worker {i} saved {:?}, not {rounds} round(s)", w.saves);
    }
    for k in 0..rounds {
        let at: Vec<_> = o.workers.iter().map(|w| w.saves[k]).collect();
        ensure!(at.windows(2).all(|p| p[0] == p[1]), "round {k}: saves at {at:?}");
    }
    Ok(())
}

/// The rule gave up on `effect` for worker `w`, not while closing, after at
/// least [`MIN_ATTEMPTS`] attempts, once the failures lasted `bound` (and
/// not much longer: at most one pause and one call more).
fn gave_up_after(o: &Outcome, w: usize, effect: Effect, bound: f64) -> Result<(), String> {
    let gave_up: Vec<_> = o.workers[w].gave_up.iter().filter(|g| g.1 == effect).collect();
    ensure!(gave_up.len() == 1, "worker {w}: {effect:?} gave up {gave_up:?}");
    let &(_, _, attempts, seconds, closing) = gave_up[0];
    ensure!(!closing, "worker {w}: {effect:?} gave up at close");
    ensure!(attempts >= MIN_ATTEMPTS, "worker {w}: {effect:?} gave up after {attempts} attempts");
    ensure!(
        seconds >= bound - 1e-9 && seconds <= bound + MAX_PAUSE + o.call + TICK,
        "worker {w}: {effect:?} gave up after {seconds} s, bound {bound}"
    );
    Ok(())
}

fn raised(o: &Outcome, w: usize) -> Result<&Raised, String> {
    o.workers[w]
        .raised
        .as_ref()
        .map(|(_, e)| e)
        .ok_or_else(|| format!("worker {w} raised nothing"))
}

fn raised_gave_up(o: &Outcome, w: usize, effect: Effect) -> Result<(), String> {
    let e = raised(o, w)?;
    ensure!(
        matches!(e, Raised::GaveUp { effect: x, .. } if *x == effect),
        "worker {w} raised {e:?}, not the give-up of {effect:?}"
    );
    Ok(())
}

/// "A permanent one ends in a named error on every worker (its own, or the
/// one reported to the cluster by a peer), never in a silent continuation."
fn every_worker_raised(o: &Outcome) -> Result<(), String> {
    for (i, w) in o.workers.iter().enumerate() {
        ensure!(w.raised.is_some(), "worker {i} ended without an error: {w:?}");
        ensure!(w.saves.is_empty() && w.exited.is_none(), "worker {i} saved or exited: {w:?}");
    }
    Ok(())
}

fn nothing_published(o: &Outcome) -> Result<(), String> {
    for key in [RUN_TO_CHECKPOINT, LAST_RUN_TO_CHECKPOINT] {
        ensure!(
            !o.store.get(key).is_some_and(|(v, _)| v != STOP_WATCHER),
            "{key} was published: {:?}",
            o.store.get(key)
        );
    }
    Ok(())
}

fn failed_attempts(o: &Outcome, w: usize, effect: Effect) -> Vec<f64> {
    o.log
        .iter()
        .filter(|a| a.worker == w && a.effect == effect && !a.ok)
        .map(|a| a.t)
        .collect()
}

// claim ---------------------------------------------------------------------

fn claim_transient(o: &Outcome) -> Result<(), String> {
    ensure!(!failed_attempts(o, 0, Effect::Claim).is_empty(), "the claim never failed");
    ensure!(o.workers[0].leading, "worker 0 does not lead");
    every_worker_saves_at_one_step(o, 1)
}

fn claim_given_up(o: &Outcome) -> Result<(), String> {
    gave_up_after(o, 0, Effect::Claim, TRANSIENT_FAILURE_WINDOW)?;
    // on_claim(false): the resolver does not lead, has nothing to do.
    ensure!(!o.workers[0].leading, "worker 0 leads after its claim was given up");
    ensure!(!o.workers[0].needs_attention, "worker 0 still needs attention");
    ensure!(!o.store.contains_key(TERMINATED_WORKER), "TERMINATED_WORKER was written");
    nothing_published(o)?;
    raised_gave_up(o, 0, Effect::Claim)?;
    let (when, _) = o.workers[0].raised.as_ref().unwrap();
    ensure!(*when >= o.workers[0].gave_up[0].0, "raised before the claim gave up");
    every_worker_raised(o)
}

fn claim_bound_is_the_peer_timeout(o: &Outcome) -> Result<(), String> {
    gave_up_after(o, 0, Effect::Claim, o.peer_timeout)?;
    raised_gave_up(o, 0, Effect::Claim)?;
    nothing_published(o)
}

// announce --------------------------------------------------------------------

fn announce_given_up(o: &Outcome) -> Result<(), String> {
    gave_up_after(o, 0, Effect::Announce, TRANSIENT_FAILURE_WINDOW)?;
    ensure!(
        o.workers[0].warnings.iter().any(|w| w.contains(PREEMPTION_NOTICE_KEY)),
        "no warning: {:?}",
        o.workers[0].warnings
    );
    ensure!(!o.store.contains_key(PREEMPTION_NOTICE_KEY), "the announce was written");
    // The protocol does not depend on it: both rounds, no error.
    every_worker_saves_at_one_step(o, 2)
}

// publish ---------------------------------------------------------------------

fn publish_transient(o: &Outcome) -> Result<(), String> {
    ensure!(!failed_attempts(o, 0, Effect::Publish).is_empty(), "the publish never failed");
    every_worker_saves_at_one_step(o, 1)
}

fn publish_given_up(o: &Outcome) -> Result<(), String> {
    // With no grace period the leading notice's deadline is the notice
    // itself: the bound is its floor, a second.
    gave_up_after(o, 0, Effect::Publish, retry::MIN_BOUND_BEFORE_DEADLINE)?;
    raised_gave_up(o, 0, Effect::Publish)?;
    ensure!(o.workers[0].reported, "the error was not reported");
    nothing_published(o)?;
    every_worker_raised(o)
}

// read ------------------------------------------------------------------------

fn read_with_answers_between(o: &Outcome) -> Result<(), String> {
    for w in 0..o.workers.len() {
        let failed = failed_attempts(o, w, Effect::Read);
        let span = failed.last().unwrap_or(&0.0) - failed.first().unwrap_or(&0.0);
        ensure!(
            span > TRANSIENT_FAILURE_WINDOW,
            "worker {w}: reads failed over {span} s only, not longer than the bound"
        );
        ensure!(o.workers[w].gave_up.is_empty(), "worker {w} gave up: {:?}", o.workers[w].gave_up);
    }
    every_worker_saves_at_one_step(o, 1)
}

fn read_given_up(o: &Outcome) -> Result<(), String> {
    for w in 0..o.workers.len() {
        gave_up_after(o, w, Effect::Read, TRANSIENT_FAILURE_WINDOW)?;
        // Posted to the driver, handed to the next run().
        raised_gave_up(o, w, Effect::Read)?;
    }
    every_worker_raised(o)
}

// acknowledge -------------------------------------------------------------------

fn acknowledge_transient(o: &Outcome) -> Result<(), String> {
    for w in 0..o.workers.len() {
        ensure!(!failed_attempts(o, w, Effect::Acknowledge).is_empty(), "worker {w}: no ack failed");
    }
    every_worker_saves_at_one_step(o, 1)
}

fn acknowledge_ahead_of_a_failing_claim(o: &Outcome) -> Result<(), String> {
    let w = 1;
    let attempts = &o.workers[w].write_attempts;
    let first = attempts
        .iter()
        .position(|a| a.1 == Effect::Acknowledge)
        .ok_or("worker 1 never acknowledged")?;
    let (t, _, due, claim_due) = attempts[first];
    // The claim's retry was due as well, and the acknowledgement went first,
    // at once.
    ensure!(claim_due, "the claim was not due with the acknowledgement: {attempts:?}");
    ensure!(
        t - due <= o.call + TICK + 1e-9,
        "the acknowledgement due at {due} was attempted at {t}"
    );
    ensure!(
        attempts[first + 1..].iter().any(|a| a.1 == Effect::Claim),
        "the claim was not attempted after the acknowledgement: {attempts:?}"
    );
    ensure!(
        o.store.get(&Round::Initial.ack_key("1")).is_some_and(|(_, at)| *at == t),
        "the acknowledgement was not written by that attempt"
    );
    ensure!(!o.workers[w].leading, "worker 1 leads");
    every_worker_saves_at_one_step(o, 1)
}

fn acknowledge_given_up(o: &Outcome) -> Result<(), String> {
    gave_up_after(o, 1, Effect::Acknowledge, TRANSIENT_FAILURE_WINDOW)?;
    raised_gave_up(o, 1, Effect::Acknowledge)?;
    let key = Round::Initial.ack_key("1");
    ensure!(
        raised(o, 0)? == &Raised::DeadlineExceeded { missing: vec![key] },
        "the leader raised {:?}",
        raised(o, 0)
    );
    every_worker_raised(o)
}

// await acknowledgements ---------------------------------------------------------

fn await_transient(o: &Outcome) -> Result<(), String> {
    ensure!(!failed_attempts(o, 0, Effect::AwaitAcks).is_empty(), "no read of an ack failed");
    every_worker_saves_at_one_step(o, 1)
}

fn await_given_up(o: &Outcome) -> Result<(), String> {
    gave_up_after(o, 0, Effect::AwaitAcks, retry::MIN_BOUND_BEFORE_DEADLINE)?;
    raised_gave_up(o, 0, Effect::AwaitAcks)?;
    // Promptly: long before the peer timeout.
    let (when, _) = o.workers[0].raised.as_ref().unwrap();
    ensure!(*when < o.peer_timeout / 2.0, "raised at {when}");
    ensure!(o.workers[0].reported, "the error was not reported");
    every_worker_raised(o)
}

fn await_deadline_exceeded(o: &Outcome) -> Result<(), String> {
    let e = raised(o, 0)?;
    ensure!(
        e == &Raised::DeadlineExceeded {
            missing: vec![Round::Initial.ack_key("2")]
        },
        "the leader raised {e:?}"
    );
    let (when, _) = o.workers[0].raised.as_ref().unwrap();
    ensure!(*when >= o.peer_timeout, "raised at {when}, before the peer timeout");
    ensure!(o.workers[0].reported, "the error was not reported");
    every_worker_raised(o)
}

// save ---------------------------------------------------------------------------

fn save_failed_then_saved(o: &Outcome) -> Result<(), String> {
    ensure!(o.workers[1].save_failures == 1, "save failures: {}", o.workers[1].save_failures);
    ensure!(o.workers[0].save_failures == 0, "worker 0's save failed");
    every_worker_saves_at_one_step(o, 1)
}

// shutdown writes -------------------------------------------------------------------

fn shutdown_releases_readers(o: &Outcome) -> Result<(), String> {
    ensure!(
        o.store.get(LAST_RUN_TO_CHECKPOINT).is_some_and(|(v, _)| v == STOP_WATCHER),
        "LAST_RUN_TO_CHECKPOINT: {:?}",
        o.store.get(LAST_RUN_TO_CHECKPOINT)
    );
    ensure!(o.workers[1].stops == 1, "worker 1's reader was not stopped");
    ensure!(!o.store.contains_key(&Round::Final.ack_key("1")), "STOP_WATCHER was acknowledged");
    for (i, w) in o.workers.iter().enumerate() {
        ensure!(w.raised.is_none(), "worker {i} raised {:?}", w.raised);
        ensure!(w.saves.len() == 1, "worker {i} saved {:?}", w.saves);
    }
    Ok(())
}

fn shutdown_failure_is_logged(o: &Outcome) -> Result<(), String> {
    // Worker 0's writes failed; worker 1's own close (at 4 s) releases its reader.
    let closed = o.workers[1].closed.ok_or("worker 1 did not close")?;
    ensure!(
        !o.store.get(LAST_RUN_TO_CHECKPOINT).is_some_and(|(_, at)| *at < closed),
        "LAST_RUN_TO_CHECKPOINT was written before worker 1 closed: {:?}",
        o.store.get(LAST_RUN_TO_CHECKPOINT)
    );
    ensure!(
        o.workers[0].warnings.iter().any(|w| w.contains("releasing")),
        "no warning: {:?}",
        o.workers[0].warnings
    );
    ensure!(o.workers[0].closed == Some(3.0), "close took {:?}", o.workers[0].closed);
    ensure!(o.workers[1].stops == 0, "worker 1's reader was stopped");
    for (i, w) in o.workers.iter().enumerate() {
        ensure!(w.raised.is_none(), "worker {i} raised {:?}", w.raised);
    }
    Ok(())
}

// close() while inputs wait ------------------------------------------------------------

fn close_acknowledges_a_waiting_key(o: &Outcome) -> Result<(), String> {
    let closed = o.workers[1].closed.ok_or("worker 1 did not close")?;
    ensure!(
        o.workers[1].keys_taken.iter().any(|(t, _, _)| *t == closed),
        "the waiting key was not taken at close: {:?}",
        o.workers[1].keys_taken
    );
    ensure!(
        o.workers[1].last_attempts == [(Effect::Acknowledge, true)],
        "last attempts: {:?}",
        o.workers[1].last_attempts
    );
    acknowledged_at_close(o, closed)
}

/// Worker 1's acknowledgement was written at its close, and the leader, waiting
/// for it, saved.
fn acknowledged_at_close(o: &Outcome, closed: f64) -> Result<(), String> {
    let (_, at) = o.store.get(&Round::Initial.ack_key("1")).ok_or("no acknowledgement")?;
    ensure!(*at == closed, "acknowledged at {at}, closed at {closed}");
    ensure!(o.workers[0].raised.is_none(), "the leader raised {:?}", o.workers[0].raised);
    ensure!(o.workers[0].saves.len() == 1, "the leader saved {:?}", o.workers[0].saves);
    Ok(())
}

fn close_retries_a_failing_acknowledgement_once(o: &Outcome) -> Result<(), String> {
    let closed = o.workers[1].closed.ok_or("worker 1 did not close")?;
    ensure!(
        failed_attempts(o, 1, Effect::Acknowledge).iter().any(|t| *t < closed),
        "the acknowledgement did not fail before the close"
    );
    ensure!(
        o.workers[1].last_attempts == [(Effect::Acknowledge, true)],
        "last attempts: {:?}",
        o.workers[1].last_attempts
    );
    acknowledged_at_close(o, closed)
}

fn close_finishes_an_announce(o: &Outcome) -> Result<(), String> {
    let closed = o.workers[0].closed.ok_or("worker 0 did not close")?;
    ensure!(
        failed_attempts(o, 0, Effect::Announce).iter().any(|t| *t < closed),
        "the announce did not fail before the close"
    );
    ensure!(
        o.workers[0].last_attempts == [(Effect::Announce, true)],
        "last attempts: {:?}",
        o.workers[0].last_attempts
    );
    let (_, at) = o.store.get(PREEMPTION_NOTICE_KEY).ok_or("not announced")?;
    ensure!(*at == closed, "announced at {at}, closed at {closed}");
    Ok(())
}

fn close_drops_a_claim(o: &Outcome) -> Result<(), String> {
    ensure!(o.workers[1].dropped == ["notice", "claim"], "dropped: {:?}", o.workers[1].dropped);
    ensure!(
        o.workers[1].last_attempts.is_empty(),
        "last attempts: {:?}",
        o.workers[1].last_attempts
    );
    ensure!(!o.store.contains_key(TERMINATED_WORKER), "TERMINATED_WORKER was written");
    ensure!(!o.workers[1].leading, "worker 1 leads");
    nothing_published(o)?;
    for (i, w) in o.workers.iter().enumerate() {
        ensure!(w.raised.is_none(), "worker {i} raised {:?}", w.raised);
        ensure!(w.closed.is_some(), "worker {i} did not close");
    }
    Ok(())
}

// error report ---------------------------------------------------------------------------

fn report_failure_keeps_the_steps_error(o: &Outcome) -> Result<(), String> {
    raised_gave_up(o, 0, Effect::Publish)?;
    ensure!(!o.workers[0].reported, "reported");
    ensure!(
        o.workers[0].warnings.iter().any(|w| w.contains("report")),
        "no warning: {:?}",
        o.workers[0].warnings
    );
    every_worker_raised(o)
}

// after the table ------------------------------------------------------------------------

fn burst_one_round(o: &Outcome) -> Result<(), String> {
    ensure!(o.log.iter().filter(|a| !a.ok).count() > 0, "nothing failed");
    for w in &o.workers {
        ensure!(w.gave_up.is_empty(), "gave up: {:?}", w.gave_up);
    }
    every_worker_saves_at_one_step(o, 1)
}

fn burst_two_rounds(o: &Outcome) -> Result<(), String> {
    for w in &o.workers {
        ensure!(w.gave_up.is_empty(), "gave up: {:?}", w.gave_up);
    }
    for round in [Round::Initial, Round::Final] {
        ensure!(o.store.contains_key(round.key()), "{} was not published", round.key());
    }
    every_worker_saves_at_one_step(o, 2)
}

fn minimum_attempts_on_a_slow_machine(o: &Outcome) -> Result<(), String> {
    let failed = failed_attempts(o, 0, Effect::Publish);
    ensure!(failed.len() == (MIN_ATTEMPTS - 1) as usize, "publish failures: {failed:?}");
    let span = failed[failed.len() - 1] + o.call - failed[0];
    ensure!(
        span > retry::MIN_BOUND_BEFORE_DEADLINE,
        "the failures lasted {span} s, not longer than the bound"
    );
    burst_one_round(o)
}

fn a_publish_the_service_does_not_answer(o: &Outcome) -> Result<(), String> {
    let gave_up: Vec<_> = o.workers[0].gave_up.iter().filter(|g| g.1 == Effect::Publish).collect();
    ensure!(gave_up.len() == 1, "publish gave up {gave_up:?}");
    let &(_, _, attempts, seconds, _) = gave_up[0];
    ensure!(attempts == 1, "publish gave up after {attempts} attempts of {} s", o.call);
    ensure!(seconds >= o.call && seconds <= o.call + TICK, "publish gave up after {seconds} s");
    nothing_published(o)?;
    every_worker_raised(o)
}

fn permanent_failure(o: &Outcome) -> Result<(), String> {
    nothing_published(o)?;
    every_worker_raised(o)
}

// ---------------------------------------------------------------------------
// The table.
// ---------------------------------------------------------------------------

const BURST: [Fault; 6] = everything(&[(0.45, 1.3)]);
const TWO_BURSTS: [Fault; 6] = everything(&[(0.45, 1.3), (19.0, 19.6)]);
const OUTAGE: [Fault; 6] = everything(&[(0.45, INF)]);

const fn row(name: &'static str, check: Check) -> Row {
    Row {
        name,
        workers: 2,
        grace: 0.0,
        peer_timeout: PEER_TIMEOUT,
        call: FAST,
        notices: &[(0, 0.5)],
        faults: &[],
        closes: &[],
        stalls: &[],
        check,
    }
}

/// One row per row of the "Failures" table (and per sentence after it).
const ROWS: &[Row] = &[
    Row {
        faults: &[fail(Effect::Claim, &[(0.0, 1.5)])],
        ..row("claim: retried within the bound (a failure shorter than it: won, leads)", claim_transient)
    },
    Row {
        faults: &[fail(Effect::Claim, ALWAYS)],
        ..row(
            "claim: retried within the bound; then on_claim(false) (does not lead, nothing published) and the next run() raises",
            claim_given_up,
        )
    },
    Row {
        peer_timeout: 3.0,
        faults: &[fail(Effect::Claim, ALWAYS)],
        ..row("claim: the bound is the peer timeout when shorter than the window", claim_bound_is_the_peer_timeout)
    },
    Row {
        grace: 20.0,
        faults: &[fail(Effect::Announce, ALWAYS)],
        ..row(
            "announce: retried within the bound; then a warning (the protocol does not depend on it: both rounds saved)",
            announce_given_up,
        )
    },
    Row {
        faults: &[fail(Effect::Publish, &[(0.0, 1.0)])],
        ..row("publish: retried within the bound (a failure shorter than it: every worker saves)", publish_transient)
    },
    Row {
        workers: 3,
        faults: &[fail(Effect::Publish, ALWAYS)],
        ..row(
            "publish: retried within the bound (the leading notice's deadline: 1 s); then run() raises and reports it (Python's raise; the core's rule)",
            publish_given_up,
        )
    },
    Row {
        notices: &[(0, 12.5)],
        faults: &[fail(Effect::Read, &[(0.3, 5.0), (6.5, 12.0)])],
        ..row(
            "read: a failed read is retried until reads have failed without a break for longer than the bound (failures longer in all, with answers between: no give-up)",
            read_with_answers_between,
        )
    },
    Row {
        notices: &[],
        faults: &[fail(Effect::Read, &[(0.3, INF)])],
        ..row(
            "read: then the reader posts the error and ends, and the driver hands it to the next run()",
            read_given_up,
        )
    },
    Row {
        workers: 3,
        faults: &[fail(Effect::Acknowledge, &[(0.55, 1.5)])],
        ..row("acknowledge: retried within the bound (a failure shorter than it: the leader gets every one)", acknowledge_transient)
    },
    Row {
        // Worker 1 claims, failing; worker 0 wins and publishes while worker
        // 1's driver is not scheduled, so that when it is, the step key waits
        // and the claim's retry is due: both writes are due at once.
        notices: &[(1, 0.45), (0, 1.5)],
        faults: &[fail_on(1, Effect::Claim, &[(0.4, 8.0)])],
        stalls: &[(1, 1.0, 3.0)],
        ..row(
            "acknowledge: ahead of any claim (an acknowledgement waits at most for the one call in flight, never for a failing claim's retries)",
            acknowledge_ahead_of_a_failing_claim,
        )
    },
    Row {
        faults: &[fail_on(1, Effect::Acknowledge, ALWAYS)],
        ..row(
            "acknowledge: then the next run() raises (and the leader's wait ends in DeadlineExceededError naming the worker)",
            acknowledge_given_up,
        )
    },
    Row {
        workers: 3,
        faults: &[fail_on(0, Effect::AwaitAcks, &[(0.6, 1.2)])],
        ..row("await acknowledgements: a failed read counts as \"not yet\" within the bound", await_transient)
    },
    Row {
        workers: 3,
        faults: &[fail_on(0, Effect::AwaitAcks, &[(0.55, INF)])],
        ..row(
            "await acknowledgements: reads that failed for longer than the bound: run() raises, promptly, and reports it",
            await_given_up,
        )
    },
    Row {
        workers: 3,
        peer_timeout: 3.0,
        faults: &[fail_on(2, Effect::Acknowledge, ALWAYS)],
        ..row(
            "await acknowledgements: \"not set\" until the peer timeout: DeadlineExceededError naming the missing workers and keys (Python's error; the core's ack keys)",
            await_deadline_exceeded,
        )
    },
    Row {
        faults: &[fail_on(1, Effect::Save, &[(0.0, 0.8)])],
        ..row(
            "save: on_save_failed, then the next before_step saves at the same step (Python raises the save's error; here the script runs again)",
            save_failed_then_saved,
        )
    },
    Row {
        grace: 30.0,
        closes: &[(0, Close::At(3.0)), (1, Close::At(4.0))],
        ..row(
            "shutdown writes: both step keys := STOP_WATCHER release the readers (KeyAction::Stop, not acknowledged)",
            shutdown_releases_readers,
        )
    },
    Row {
        grace: 30.0,
        faults: &[fail_on(0, Effect::Shutdown, ALWAYS)],
        closes: &[(0, Close::At(3.0)), (1, Close::At(4.0))],
        ..row("shutdown writes: logged; nothing waits for them (Python's)", shutdown_failure_is_logged)
    },
    Row {
        closes: &[(1, Close::WhenAStepKeyWaits)],
        ..row(
            "close() while inputs wait: a step key that arrived is acknowledged (a leader waits for it)",
            close_acknowledges_a_waiting_key,
        )
    },
    Row {
        faults: &[fail_on(1, Effect::Acknowledge, &[(0.55, 0.95)])],
        closes: &[(1, Close::At(0.95))],
        ..row(
            "close() while inputs wait: every pending acknowledgement gets one more attempt",
            close_retries_a_failing_acknowledgement_once,
        )
    },
    Row {
        grace: 30.0,
        faults: &[fail_on(0, Effect::Announce, &[(0.0, 0.9)])],
        closes: &[(0, Close::At(0.9)), (1, Close::At(1.0))],
        ..row(
            "close() while inputs wait: an announce in progress gets one last attempt",
            close_finishes_an_announce,
        )
    },
    Row {
        notices: &[(1, 0.5), (1, 0.7)],
        faults: &[fail_on(1, Effect::Claim, ALWAYS)],
        closes: &[(0, Close::At(1.0)), (1, Close::At(1.0))],
        ..row(
            "close() while inputs wait: a notice, or the claim of one in progress, is dropped (nobody stands down)",
            close_drops_a_claim,
        )
    },
    Row {
        faults: &[fail(Effect::Publish, ALWAYS), fail(Effect::Report, ALWAYS)],
        ..row(
            "error report: logged as a warning; the step's own error is raised (Python's; the core's give-up is that error)",
            report_failure_keeps_the_steps_error,
        )
    },
    Row {
        workers: 4,
        faults: &BURST,
        ..row(
            "a transient failure (a burst shorter than the bound) never loses a preemption: every worker saves at one step",
            burst_one_round,
        )
    },
    Row {
        workers: 3,
        grace: 20.0,
        faults: &TWO_BURSTS,
        ..row(
            "a transient failure never loses a preemption: with a grace period, both rounds agree",
            burst_two_rounds,
        )
    },
    Row {
        call: 0.7,
        faults: &[fail(Effect::Publish, &[(0.5, 2.2)])],
        ..row(
            "the minimum of attempts: a burst of fewer failures survives calls slower than the bound",
            minimum_attempts_on_a_slow_machine,
        )
    },
    Row {
        peer_timeout: 4.0,
        call: 4.0,
        faults: &[fail(Effect::Publish, &[(0.45, INF)])],
        ..row(
            "a publish the service does not answer for the whole bound (its leader cut off) raises after that one attempt, not four",
            a_publish_the_service_does_not_answer,
        )
    },
    Row {
        workers: 3,
        faults: &OUTAGE,
        ..row(
            "a permanent failure ends in a named error on every worker, never a silent continuation or a hang",
            permanent_failure,
        )
    },
];

fn summary(o: &Outcome) -> String {
    let mut s = String::new();
    for (i, w) in o.workers.iter().enumerate() {
        let _ = writeln!(s, "  worker {i}: {w:?}");
    }
    let _ = writeln!(s, "  store: {:?}", o.store);
    let failed: Vec<_> = o.log.iter().filter(|a| !a.ok).take(40).collect();
    let _ = writeln!(s, "  first failed calls: {failed:?}");
    s
}

#[test]
fn every_row_of_the_failures_table() {
    let mut failures = Vec::new();
    for row in ROWS {
        let o = simulate(row);
        let result = if o.hung {
            Err(format!("still going at {END} s (a hang)"))
        } else {
            (row.check)(&o)
        };
        if let Err(e) = result {
            failures.push(format!("{}\n  {e}\n{}", row.name, summary(&o)));
        }
    }
    assert!(failures.is_empty(), "{} row(s) failed:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn rows_are_named_once() {
    let mut names: Vec<_> = ROWS.iter().map(|r| r.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), ROWS.len());
}

/// Without a fault, the simulation is the protocol's happy path: the rows'
/// failures are what changes their outcome.
#[test]
fn without_faults_every_worker_saves_at_one_step() {
    for grace in [0.0, 20.0] {
        let o = simulate(&Row {
            workers: 3,
            grace,
            ..row("no fault", burst_one_round)
        });
        assert!(!o.hung);
        assert!(o.log.iter().all(|a| a.ok));
        every_worker_saves_at_one_step(&o, if grace > 0.0 { 2 } else { 1 }).unwrap();
    }
}
