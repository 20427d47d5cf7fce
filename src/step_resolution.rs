//! Step resolution: which worker saves at which step, and when everyone exits.
//!
//! # Actors
//!
//! Every worker of a `MultiWorkerMirroredStrategy` cluster runs one
//! [`Resolver`]. Two threads of a worker feed it events:
//!
//! * the **training thread** calls [`Resolver::before_step`] before every
//!   `run()` and [`Resolver::on_saved`] after a save;
//! * the **driver** takes every other input from one
//!   [`crate::inbox::Inbox`]: a notice (signals, metadata servers, a user's
//!   `termination_watcher_fn`) goes to [`Resolver::on_notice`] and, once the
//!   claim of `TERMINATED_WORKER` is decided, [`Resolver::on_claim`]; a step
//!   key goes to [`Resolver::on_step_key`]. The step keys are read by a
//!   **reader** thread that blocks on the coordination service for the key
//!   of each round and only posts what it reads into the inbox.
//!
//! The resolver never performs I/O and never reads a clock: every method takes
//! what happened (and `now`, in seconds on a monotonic clock the caller
//! chooses) and returns what the caller must do next. The caller owns the
//! coordination service, the checkpoint and the exit.
//!
//! # Keys (identical to TensorFlow 2.21, so mixed clusters and tools agree)
//!
//! | key | written by | value |
//! | --- | --- | --- |
//! | `TERMINATED_WORKER` | the first worker with a notice | its id; later writers get AlreadyExists and stand down |
//! | `RUN_TO_CHECKPOINT` | that worker, at its next `run()` | its run count + 1 |
//! | `RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_<id>` | every worker's driver; the publisher's own, by the publisher with the step key | `"1"` |
//! | `LAST_RUN_TO_CHECKPOINT` | the same worker, when the grace period runs out | its run count + 1 |
//! | `RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_<id>` | every worker's driver; the publisher's own, by the publisher | `"1"` |
//! | both step keys | every worker at shutdown | `STOP_WATCHER`, to release blocked readers |
//!
//! # States of one worker
//!
//! ```text
//!  Training ──notice──▶ Claiming ──won──▶ Leading ──before_step──▶ Publish(k = runs+1)
//!     │                    └─lost─▶ (stands down, follows the leader)
//!     └──step key k──▶ Agreed(k) ──before_step with runs == k──▶ Save
//!  Save ──grace 0 or final round──▶ Exit
//!  Save ──grace > 0, first round──▶ Countdown: the leader (or a worker with a
//!        tighter notice of its own) publishes the final step when the grace
//!        planner says the last save would otherwise end after the deadline;
//!        everyone saves once more and exits.
//! ```
//!
//! Two values hold these states. [`Phase`] is the saves' half: Training,
//! Agreed(round), Saving(round) (the diagram's Save), Countdown and
//! Exited(round); [`PHASE_MOVES`] lists every move between them with the event
//! that makes it, and the tests hold every transition of their table and every
//! step of the simulated clusters to it. The claim is the other half
//! (Claiming, Leading, or following a peer), kept apart because a leader stays
//! the leader through both rounds. What is known of each round (its agreed
//! step, whether this worker published it) is data beside them, not a phase:
//! the final round's step can arrive before the first save.
//!
//! Workers of a synchronous cluster are at most one step apart: a step's
//! collectives cannot finish until every worker joined them. The leader
//! publishes `runs + 1` *before* starting that step and waits for every
//! acknowledgement (bounded by the caller's peer timeout), so every worker has
//! the agreed step before it can finish step `runs + 1`, and each saves exactly
//! once, at the same step, in each round.
//!
//! # Several notices: the earliest deadline wins
//!
//! Without a grace period every notice saves at once, and a second one
//! changes nothing. With one, a worker keeps its own notice with the earliest
//! deadline ([`NoticeAction::Replan`] when a tighter one arrives while a claim,
//! a round or the countdown is under way; TensorFlow ignores it), and **any
//! worker with a notice of its own may publish the final round** when its
//! planner says that deadline leaves no later chance: the leader in the
//! countdown as before, a follower whose notice is tighter than the leader's
//! earlier. So one worker's tighter notice is the cluster's, through the key
//! every worker already reads. Two publishers of the same round race on the
//! coordination service's set: the first writer wins, and the other takes the
//! key's value ([`Resolver::on_publish_lost`]) and waits for nobody. Before the
//! first save, a final round that would be due by the time that save ends is
//! published at the first round's step: the first save is then the last (one
//! save, not two). Why every worker still saves at one step is in
//! [`Resolver::before_step`]; the property test on the simulated cluster
//! (`src/protocol/tests/cluster.rs`, "(f)") checks that the last save ends before
//! the earliest deadline whenever the measured save time allows it.
//!
//! # Failures
//!
//! The caller performs every effect (the Python driver, `_protocol/`); each
//! has one rule for when the coordination service fails, decided in
//! [`crate::retry`]: "the bound" is [`crate::retry::bound`] (the
//! transient-failure window, or the peer timeout or the time left before the
//! leading notice's deadline when shorter), and the pauses between attempts
//! are a [`crate::retry::Retry`]'s; a run of quick failures gives up only
//! after [`crate::retry::MIN_ATTEMPTS`] attempts, however slow the machine
//! (a blocking call that took the whole bound by itself, the service not
//! answering, ends the run once the bound has passed). A
//! service that fails for longer is in an
//! error state (a peer reported an error), and that error must reach the
//! worker promptly, with its own type. "Raises" below means: the last error
//! again, of its own TF type, its message naming the worker, the key, how
//! often and how long it failed.
//!
//! Each row of this table is a test: a row of `ROWS` in
//! `src/protocol/tests/failures.rs`, named after it, runs a small cluster of
//! the core's parts (the resolver, the grace planner, the driver's
//! [`crate::writes::Writes`], the retry rule) on a simulated clock against a
//! coordination service that fails as the row scripts, and asserts what the
//! row says. Rows that Python performs (publish's raise, the save's error,
//! the shutdown writes, the error report) are tested there as far as the
//! core's part goes; so are the two sentences after the table.
//!
//! | effect | key | on failure |
//! | --- | --- | --- |
//! | claim (driver) | `TERMINATED_WORKER` | retried within the bound; then `on_claim(false)` and the next `run()` raises |
//! | announce (driver, for `PreemptionWatcher`s) | `TF_DEFAULT_PREEMPTION_NOTICE_KEY` | retried within the bound; then a warning (the protocol does not depend on it) |
//! | publish (training thread) | `RUN_TO_CHECKPOINT`, `LAST_RUN_TO_CHECKPOINT`, then the publisher's own acknowledgement | retried within the bound; then `run()` raises, and reports it to the cluster; an attempt the service did not answer for the whole bound (its write timeout) is the last once the bound has passed |
//! | read (reader) | the round's step key | a failed read is retried until reads have failed without a break for longer than the bound; then the reader posts the error and ends, and the driver hands it to the next `run()` |
//! | acknowledge (driver) | `RECEIVED_SIGNAL_<round>_<id>` | retried within the bound, ahead of any claim or announce; then the next `run()` raises |
//! | await acknowledgements (leader) | every `RECEIVED_SIGNAL_<round>_<id>` | a failed read counts as "not yet" until reads have failed for longer than the bound (then `run()` raises); reads that answer "not set" until the peer timeout end in `DeadlineExceededError` naming the missing workers and keys; both are reported to the cluster |
//! | save | — | `on_save_failed`; the save's error is raised by `run()` and reported |
//! | shutdown writes | both step keys := `STOP_WATCHER` | logged; nothing waits for them |
//! | `close()` while inputs wait | — | the driver's last look: a step key that arrived is acknowledged and every pending acknowledgement gets one more attempt (a leader waits for it); a notice, or the claim or announce of one in progress, is dropped and logged (a claim now would make the peers stand down for a leader that will never publish) |
//! | error report | `report_error_to_cluster` | logged as a warning; the step's own error is raised |
//!
//! A transient failure (a burst shorter than the bound) therefore never loses
//! a preemption: every worker still saves at one step and exits. A permanent
//! one ends in a named error on every worker (its own, or the one reported to
//! the cluster by a peer), never in a silent continuation or a hang. Errors
//! the driver's threads meet are handed to the next `run()`
//! (`ProtocolCore.set_pending` makes it take the slow path).
//!
//! ## Why the driver acknowledges, and how a claim cannot starve it
//!
//! The driver performs the claim, the announce and the acknowledgements, one
//! call at a time. A leader waits for every acknowledgement for at most the
//! peer timeout, and a claim may be retried for up to the bound (10 s); done
//! one after the other with sleeps in between, a claim's retries could hold
//! an acknowledgement back until the leader gives up. They are not done that
//! way: the driver never sleeps. The pause before a write's next attempt is
//! the deadline of its next receive from the inbox, so a step key posted
//! meanwhile is taken at once, and when several writes are due the oldest
//! acknowledgement goes first; the inbox also hands out step keys before
//! notices. An acknowledgement therefore waits for at most the one call
//! already in flight, itself bounded by the write timeout ([`write_timeout`]):
//! the peer timeout clamped to 1..60 s (to 1..10 s for the announce), so never longer than
//! the leader's own wait when that is a second or more. Only a call that
//! hangs for all of it (a service that hangs every call, the
//! acknowledgement's included) makes the leader give up, naming this worker. Keeping the writes in one
//! thread, rather than letting the reader acknowledge, puts every effect of
//! a notice or a step key, and every failure rule above, in one loop; the
//! reader stays a reader because a coordination-service get is a blocking
//! call that cannot be waited on together with the inbox.

use thiserror::Error;

use crate::grace::GracePlanner;
pub use crate::notice::Notice;

/// Claimed by the first worker with a notice; its value is that worker's id.
pub const TERMINATED_WORKER: &str = "TERMINATED_WORKER";
/// Step key of the first round.
pub const RUN_TO_CHECKPOINT: &str = "RUN_TO_CHECKPOINT";
/// Step key of the second (final) round, used only with a grace period.
pub const LAST_RUN_TO_CHECKPOINT: &str = "LAST_RUN_TO_CHECKPOINT";
/// Prefix of the acknowledgement keys.
pub const ACK_PREFIX: &str = "RECEIVED_SIGNAL";
/// Written to both step keys at shutdown so blocked readers return.
pub const STOP_WATCHER: &str = "STOP_WATCHER";
/// Key that `PreemptionWatcher` reads.
pub const PREEMPTION_NOTICE_KEY: &str = "TF_DEFAULT_PREEMPTION_NOTICE_KEY";
/// Name of the run counter variable attached to the user's checkpoint.
pub const CHECKPOINTED_RUNS: &str = "checkpointed_runs";
/// Value of the acknowledgement keys.
pub const ACK_VALUE: &str = "1";

/// Seconds the leader waits for every worker to acknowledge a step key, unless
/// `TerminationConfig(peer_timeout=...)` or `TF_FAILURE_HANDLING_PEER_TIMEOUT` says
/// otherwise. Acknowledgements come from a background thread of each peer and
/// normally take milliseconds; the bound is there for a peer that is gone
/// (TensorFlow waits for them forever).
pub const DEFAULT_PEER_TIMEOUT: f64 = 300.0;
/// Default bound, in seconds, on one write to the coordination service
/// (`_cluster/coordination.py`'s `Client`).
pub const COORDINATION_WRITE_TIMEOUT: f64 = 60.0;
/// Seconds one peer health probe may take: TensorFlow's own timeout argument.
/// TensorFlow holds the GIL during a probe, so the probe threads of
/// `_cluster/membership.py` run one at a time, not in parallel.
pub const PEER_PROBE_TIMEOUT: f64 = 2.0;
/// Bound, in seconds, on joining a watcher thread (the step-key reader, the
/// driver) at shutdown: the handler's `Event.Shutdown` answers with it.
pub const THREAD_JOIN_TIMEOUT: f64 = 10.0;
/// Bound, in seconds, on one coordination-service write that nothing waits for
/// (releasing blocked readers at shutdown, reporting an error, announcing a
/// notice): the `Action.Set`s of `Event.Shutdown` and the answer to
/// `Event.ErrorReport` carry it. The protocol's own writes are bounded by the peer
/// timeout (60 s at most).
pub const SHUTDOWN_WRITE_TIMEOUT: f64 = 10.0;

/// Longest single blocking get of the step-key reader, in seconds; it looks
/// whether the handler is closing between two (shutdown's `STOP_WATCHER`
/// normally releases it at once).
pub const PEER_WATCH_SLICE: f64 = 5.0;
/// Longest single blocking get of a leader's wait for one acknowledgement, in
/// seconds; the wait's own bound (the peer timeout) is checked between two.
pub const ACK_READ_SLICE: f64 = 1.0;
/// Longest single blocking get of a `PreemptionWatcher` on the notice key, in
/// seconds; its close is checked between two.
pub const WATCHER_KEY_SLICE: f64 = 1.0;

/// The shortest bound on one write of the protocol, in seconds, however short
/// the peer timeout.
pub const MIN_WRITE_TIMEOUT: f64 = 1.0;

/// Which of the protocol's writes a bound is for ([`write_timeout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteBound {
    /// A claim, an acknowledgement, a publish: the coordination client's bound.
    Protocol,
    /// The announce of a notice to `PreemptionWatcher`s, which nothing waits for.
    Announce,
}

/// The bound on one coordination-service call of the protocol: the peer
/// timeout clamped to [`MIN_WRITE_TIMEOUT`]..[`COORDINATION_WRITE_TIMEOUT`]
/// (..[`SHUTDOWN_WRITE_TIMEOUT`] for the announce), so that an
/// acknowledgement queued behind the call in flight waits no longer than the
/// leader's own wait when that is a second or more ("Why the driver
/// acknowledges" above).
#[must_use]
pub fn write_timeout(peer_timeout: f64, write: WriteBound) -> f64 {
    let cap = match write {
        WriteBound::Protocol => COORDINATION_WRITE_TIMEOUT,
        WriteBound::Announce => SHUTDOWN_WRITE_TIMEOUT,
    };
    peer_timeout.min(cap).max(MIN_WRITE_TIMEOUT)
}

/// One of the two agreement rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Round {
    /// Save as soon as possible after the notice.
    Initial,
    /// Save right before the grace period ends.
    Final,
}

impl Round {
    /// The coordination-service key that carries this round's agreed step.
    #[must_use]
    pub fn key(self) -> &'static str {
        match self {
            Round::Initial => RUN_TO_CHECKPOINT,
            Round::Final => LAST_RUN_TO_CHECKPOINT,
        }
    }

    /// The key worker `id` writes to acknowledge this round.
    #[must_use]
    pub fn ack_key(self, id: &str) -> String {
        format!("{ACK_PREFIX}_{}_{id}", self.key())
    }

    fn index(self) -> usize {
        match self {
            Round::Initial => 0,
            Round::Final => 1,
        }
    }
}

/// Where this worker sits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Membership {
    /// No cluster (MirroredStrategy, OneDevice, an empty ClusterSpec): id
    /// `single_worker`, chief, no coordination service.
    Local,
    /// A member of a multi-worker cluster with `num_workers` members whose
    /// ids are `0..num_workers` (TensorFlow's `id_in_cluster`).
    Worker {
        /// This worker's `id_in_cluster`.
        id: u32,
        /// How many workers acknowledge each round.
        num_workers: u32,
    },
}

impl Membership {
    /// The id used in keys: `single_worker` locally, else the decimal id.
    #[must_use]
    pub fn id(&self) -> String {
        match self {
            Membership::Local => "single_worker".to_owned(),
            Membership::Worker { id, .. } => id.to_string(),
        }
    }
}

/// What the caller does with a notice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NoticeAction {
    /// Local mode: this worker leads; nothing to write.
    Lead,
    /// Write `TERMINATED_WORKER = value`, then report the outcome with
    /// [`Resolver::on_claim`].
    Claim {
        /// Always [`TERMINATED_WORKER`].
        key: &'static str,
        /// This worker's id.
        value: String,
    },
    /// With a grace period, a notice whose deadline is earlier than any this
    /// worker knew, while a claim, a round or the countdown is under way: the
    /// final round is planned for it from now on (and this worker may publish
    /// it, [`Resolver::before_step`]). Nothing to write.
    Replan,
    /// Absorbed: no grace period and a claim, a round or the countdown is
    /// already under way; a notice no earlier than one this worker knows; or
    /// the worker is done.
    Absorb,
}

/// What the caller does with a step key's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyAction {
    /// Write `ack_key = "1"`; then, if `next_round` is set, block on that
    /// round's key next, else the peer watcher is done.
    Acknowledge {
        /// The acknowledgement key for this worker and round.
        ack_key: String,
        /// The round to watch after acknowledging, if any.
        next_round: Option<Round>,
    },
    /// The value was `STOP_WATCHER`: the peer watcher ends.
    Stop,
}

/// What the training thread does before a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepAction {
    /// Run the step.
    Proceed,
    /// This worker leads: publish `step` for `round`. In multi-worker mode,
    /// write `round.key() = step` and wait (bounded) for the acknowledgements
    /// `ack_keys`; then run the step.
    Publish {
        /// The round being agreed.
        round: Round,
        /// The agreed step (run count + 1).
        step: u64,
        /// Keys to wait for; empty in local mode.
        ack_keys: Vec<String>,
        /// This worker's own acknowledgement (one of `ack_keys`; `None` in local
        /// mode): the publisher writes it right after the step key, so its wait
        /// never depends on its own reader and driver threads. The driver's
        /// acknowledgement of the same key later finds it set, which is no error.
        own_ack_key: Option<String>,
    },
    /// Save a checkpoint now, then call [`Resolver::on_saved`].
    Save {
        /// The round this save completes.
        round: Round,
        /// The run count being saved.
        step: u64,
    },
}

/// What follows a save.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveAction {
    /// Stop the watchers, clean up and call the exit function.
    Exit,
    /// Keep training through the grace period; a final round follows.
    Countdown,
}

/// Errors of [`Resolver::on_step_key`].
#[derive(Debug, Error, PartialEq, Eq)]
pub enum StepKeyError {
    /// The value is neither a run count nor `STOP_WATCHER`.
    #[error("coordination-service key {key} holds {value:?}, which is not a run count")]
    Malformed {
        /// The key read.
        key: &'static str,
        /// What it held.
        value: String,
    },
}

/// Errors of [`Resolver::on_saved`].
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SaveError {
    /// `on_saved` without a preceding [`StepAction::Save`] for that round.
    #[error("a save for the {0:?} round was reported, but none was asked for")]
    Unexpected(Round),
}

/// Where this worker's claim of `TERMINATED_WORKER` stands: the other half of
/// the diagram's states (Claiming, Leading), apart from [`Phase`] because a
/// leader stays the leader through both rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Claim {
    /// No notice of its own claimed (a follower, or no notice yet).
    Idle,
    /// Claiming: the write of `TERMINATED_WORKER` is in flight.
    Pending,
    /// Leading: this worker publishes the first round.
    Won,
    /// A peer held the key: this worker follows the peer's rounds.
    Lost,
}

/// The phase of one worker's saves, the diagram's states as one value
/// ([`Resolver::phase`]). Which moves between them exist is
/// [`PHASE_MOVES`]; the transition table in `tests.rs` checks every row's move
/// against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Training: the first round's step is not agreed (a claim may be under
    /// way, see `Claim`; a final round's step may be known already).
    Training,
    /// Agreed(k): the round's step is agreed, and its save is due when the run
    /// count reaches it.
    Agreed(Round),
    /// Save: the round's save was handed out ([`StepAction::Save`]) and is
    /// not yet reported.
    Saving(Round),
    /// Countdown: the first save is made and the grace period runs; the final
    /// round's step is not agreed yet.
    Countdown,
    /// Exit: [`SaveAction::Exit`] was returned after the save of this round
    /// (the first round with no grace period, else the final one).
    Exited(Round),
}

impl Phase {
    /// The round this phase belongs to.
    #[must_use]
    pub fn round(self) -> Round {
        match self {
            Phase::Training => Round::Initial,
            Phase::Countdown => Round::Final,
            Phase::Agreed(r) | Phase::Saving(r) | Phase::Exited(r) => r,
        }
    }

    /// Whether `round`'s save was made.
    fn saved(self, round: Round) -> bool {
        match round {
            Round::Initial => self.round() == Round::Final || self == Phase::Exited(Round::Initial),
            Round::Final => self == Phase::Exited(Round::Final),
        }
    }
}

/// Every move between two phases, with the event that makes it: the
/// diagram's arrows. No other move happens (`tests.rs` checks each row of the
/// transition table against it, `src/protocol/tests/cluster.rs` every step of the
/// simulated clusters).
pub const PHASE_MOVES: &[(Phase, &str, Phase)] = &[
    (
        Phase::Training,
        "step key or publish of the first round",
        Phase::Agreed(Round::Initial),
    ),
    (
        Phase::Agreed(Round::Initial),
        "before_step at the agreed step",
        Phase::Saving(Round::Initial),
    ),
    (Phase::Saving(Round::Initial), "save failed", Phase::Agreed(Round::Initial)),
    (
        Phase::Saving(Round::Initial),
        "saved: no grace period",
        Phase::Exited(Round::Initial),
    ),
    (
        Phase::Saving(Round::Initial),
        "saved: the final round agreed at the same step",
        Phase::Exited(Round::Final),
    ),
    (Phase::Saving(Round::Initial), "saved: grace period", Phase::Countdown),
    (
        Phase::Saving(Round::Initial),
        "saved: grace period, the final round's step known",
        Phase::Agreed(Round::Final),
    ),
    (
        Phase::Countdown,
        "step key or publish of the final round",
        Phase::Agreed(Round::Final),
    ),
    (
        Phase::Agreed(Round::Final),
        "before_step at the agreed step",
        Phase::Saving(Round::Final),
    ),
    (Phase::Saving(Round::Final), "save failed", Phase::Agreed(Round::Final)),
    (Phase::Saving(Round::Final), "saved", Phase::Exited(Round::Final)),
];

/// The per-worker state machine; see the module documentation.
#[derive(Debug)]
pub struct Resolver {
    membership: Membership,
    id: String,
    grace_period: f64,
    phase: Phase,
    claim: Claim,
    /// This worker's own notice with the earliest deadline (its first, until a
    /// tighter one arrives): what it claims with and plans the final round for.
    notice: Option<Notice>,
    /// Agreed step per round, as received from the leader (or set by it).
    agreed: [Option<u64>; 2],
    published: [bool; 2],
    /// The agreed step is the run count at the check, not the next one: the
    /// coordinator of a ParameterServerStrategy cluster, whose `run()` only
    /// schedules (no step of its is in progress on other tasks), saves at once.
    save_at_current_run: bool,
}

impl Resolver {
    /// A resolver for `membership` with a grace period in seconds (`<= 0`
    /// or NaN: save once and exit).
    #[must_use]
    pub fn new(membership: Membership, grace_period: f64) -> Self {
        let id = membership.id();
        // Decide once whether there is a grace period, so that every later
        // comparison agrees (NaN would otherwise fail both `> 0` and `<= 0`).
        let grace_period = if grace_period > 0.0 { grace_period } else { 0.0 };
        Resolver {
            membership,
            id,
            grace_period,
            phase: Phase::Training,
            claim: Claim::Idle,
            notice: None,
            agreed: [None, None],
            published: [false, false],
            save_at_current_run: false,
        }
    }

    /// Local mode only: the leader's agreed step is the run count at the check
    /// that publishes it, so the same check saves ([`Resolver::before_step`]
    /// asked again returns [`StepAction::Save`]). For the coordinator of a
    /// ParameterServerStrategy cluster, whose runs only schedule closures.
    pub fn save_at_current_run(&mut self) {
        if self.membership == Membership::Local {
            self.save_at_current_run = true;
        }
    }

    /// This worker's id as used in keys.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The membership this resolver was built with.
    #[must_use]
    pub fn membership(&self) -> &Membership {
        &self.membership
    }

    /// The grace period in seconds.
    #[must_use]
    pub fn grace_period(&self) -> f64 {
        self.grace_period
    }

    /// The round in progress (after the exit, the round of the last save).
    #[must_use]
    pub fn round(&self) -> Round {
        self.phase.round()
    }

    /// The phase this worker is in.
    #[must_use]
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The step of `round` became known: the phase waiting for it moves on.
    fn agree(&mut self, round: Round, step: u64) {
        self.agreed[round.index()] = Some(step);
        let waiting = match round {
            Round::Initial => Phase::Training,
            Round::Final => Phase::Countdown,
        };
        if self.phase == waiting {
            self.phase = Phase::Agreed(round);
        }
    }

    /// The notice this worker leads with, once its claim was won (its earliest
    /// deadline, when a tighter notice followed the first).
    #[must_use]
    pub fn leading_notice(&self) -> Option<Notice> {
        (self.claim == Claim::Won).then_some(self.notice).flatten()
    }

    /// This worker's own notice with the earliest deadline, leading or not.
    #[must_use]
    pub fn planned_notice(&self) -> Option<Notice> {
        self.notice
    }

    /// Whether `notice` ends earlier than every notice this worker knows.
    fn tighter(&self, notice: Notice) -> bool {
        self.notice.map_or(true, |known| {
            GracePlanner::deadline(notice, self.grace_period) < GracePlanner::deadline(known, self.grace_period)
        })
    }

    /// Whether this worker may still publish the final round for its own
    /// notice: a grace period, the first round agreed, the final one not, and
    /// (before the countdown) the first save not yet made.
    fn may_publish_final(&self) -> bool {
        let (i, f) = (Round::Initial.index(), Round::Final.index());
        self.grace_period > 0.0
            && self.notice.is_some()
            && self.agreed[i].is_some()
            && self.agreed[f].is_none()
            && !self.published[f]
            && !self.exited()
    }

    /// Whether this worker published `round` itself (its write may have lost
    /// to a peer's at the same time; its own plan was due either way).
    #[must_use]
    pub fn published(&self, round: Round) -> bool {
        self.published[round.index()]
    }

    /// The agreed step of the round in progress, if known.
    #[must_use]
    pub fn agreed_step(&self) -> Option<u64> {
        self.agreed[self.round().index()]
    }

    /// True once [`SaveAction::Exit`] was returned.
    #[must_use]
    pub fn exited(&self) -> bool {
        matches!(self.phase, Phase::Exited(_))
    }

    /// True in the grace-period countdown (after the first save).
    #[must_use]
    pub fn counting_down(&self) -> bool {
        self.round() == Round::Final
    }

    /// Whether [`Resolver::before_step`] can return anything but `Proceed`.
    /// The binding mirrors this in one atomic flag: with no notice anywhere,
    /// the check before a step is a single load.
    #[must_use]
    pub fn needs_attention(&self) -> bool {
        if self.exited() {
            return false;
        }
        let round = self.round();
        let r = round.index();
        (self.agreed[r].is_some() && !self.phase.saved(round))
            || (self.claim == Claim::Won && !self.published[r])
            || self.may_publish_final()
    }

    /// A termination source reported a notice for this worker.
    pub fn on_notice(&mut self, notice: Notice) -> NoticeAction {
        if self.exited() {
            return NoticeAction::Absorb;
        }
        if self.claim != Claim::Idle || self.round() == Round::Final || self.agreed[Round::Initial.index()].is_some() {
            // Under way: only an earlier deadline changes anything, and only
            // the final round can still move.
            if self.grace_period > 0.0 && self.tighter(notice) {
                self.notice = Some(notice);
                return NoticeAction::Replan;
            }
            return NoticeAction::Absorb;
        }
        self.notice = Some(notice);
        match self.membership {
            Membership::Local => {
                self.claim = Claim::Won;
                NoticeAction::Lead
            }
            Membership::Worker { .. } => {
                self.claim = Claim::Pending;
                NoticeAction::Claim {
                    key: TERMINATED_WORKER,
                    value: self.id.clone(),
                }
            }
        }
    }

    /// The outcome of writing `TERMINATED_WORKER`: `won` when the write
    /// succeeded, false when a peer held it (AlreadyExists). Ignored unless a
    /// claim is pending.
    pub fn on_claim(&mut self, won: bool) {
        if self.claim != Claim::Pending {
            return;
        }
        self.claim = if won { Claim::Won } else { Claim::Lost };
    }

    /// The peer watcher read `value` from `round.key()`.
    ///
    /// # Errors
    ///
    /// [`StepKeyError::Malformed`] when the value is neither a run count nor
    /// `STOP_WATCHER`; the state is unchanged.
    pub fn on_step_key(&mut self, round: Round, value: &str) -> Result<KeyAction, StepKeyError> {
        if value == STOP_WATCHER {
            return Ok(KeyAction::Stop);
        }
        let step: u64 = value.trim().parse().map_err(|_| StepKeyError::Malformed {
            key: round.key(),
            value: value.to_owned(),
        })?;
        if self.agreed[round.index()].is_none() {
            self.agree(round, step);
        }
        let next_round = self.round_after(round);
        Ok(KeyAction::Acknowledge {
            ack_key: round.ack_key(&self.id),
            next_round,
        })
    }

    /// Called before every step with the number of completed runs. The
    /// leader publishes the first round; any worker with a notice of its own
    /// publishes the final round when `planner` says its deadline leaves no
    /// later chance (the leader in the countdown, as before; a worker whose
    /// notice is tighter than the leader's, earlier). Before the first save,
    /// a final round that is due already is published at the first round's
    /// step: the first save is then the last (one save, not two) -- only under a
    /// platform deadline tighter than the grace period; when the user's grace
    /// period binds, both saves are made, as TensorFlow makes them.
    ///
    /// Why one step still holds: a publisher publishes before it starts its
    /// next step and waits for every acknowledgement; no worker can finish
    /// that step before the publisher joins it, so every worker learns the
    /// step before it can pass it. The first round's step is reused only
    /// while `run_count` is below it: at it, a peer may have saved the first
    /// round already and be inside the next step.
    pub fn before_step(&mut self, run_count: u64, now: f64, planner: &GracePlanner) -> StepAction {
        if matches!(self.phase, Phase::Exited(_) | Phase::Saving(_)) {
            return StepAction::Proceed;
        }
        let round = self.round();
        let r = round.index();
        if let Some(step) = self.agreed[r] {
            if run_count == step && !self.phase.saved(round) {
                self.phase = Phase::Saving(round);
                return StepAction::Save { round, step };
            }
            // Would the final round be due by the time the first save ends?
            // Then the first save is the last (the first round's steps and save
            // cost time too).
            if round == Round::Initial
                && run_count < step
                && !self.grace_binds()
                && self.final_due(planner, now + planner.first_round_cost(step - run_count))
            {
                return self.publish(Round::Final, step);
            }
            return StepAction::Proceed;
        }
        if round == Round::Initial {
            if self.claim != Claim::Won || self.published[r] {
                return StepAction::Proceed;
            }
        } else if !self.final_due(planner, now) {
            return StepAction::Proceed;
        }
        let step = if self.save_at_current_run { run_count } else { run_count + 1 };
        self.publish(round, step)
    }

    /// Whether the user's grace period ends the countdown (no tighter platform
    /// deadline): then the first save is never the last ([`GracePlanner::grace_binds`]).
    fn grace_binds(&self) -> bool {
        self.notice.is_some_and(|n| GracePlanner::grace_binds(n, self.grace_period))
    }

    fn final_due(&self, planner: &GracePlanner, now: f64) -> bool {
        self.may_publish_final() && self.notice.is_some_and(|n| planner.final_round_due(n, self.grace_period, now))
    }

    fn publish(&mut self, round: Round, step: u64) -> StepAction {
        self.published[round.index()] = true;
        // The publisher knows the value it publishes; recording it here rather
        // than waiting for its own peer watcher removes a race and keeps
        // local mode identical.
        self.agree(round, step);
        let (ack_keys, own_ack_key) = match self.membership {
            Membership::Local => (Vec::new(), None),
            Membership::Worker { num_workers, .. } => (
                (0..num_workers).map(|i| round.ack_key(&i.to_string())).collect(),
                Some(round.ack_key(&self.id)),
            ),
        };
        StepAction::Publish {
            round,
            step,
            ack_keys,
            own_ack_key,
        }
    }

    /// This worker's publish of `round` found the key set by another worker
    /// (the first writer wins): `value` is what the key holds. A run count
    /// becomes the agreed step in place of this worker's own (which nobody
    /// read); `STOP_WATCHER` (a peer shut down) leaves the state as it is.
    ///
    /// # Errors
    ///
    /// [`StepKeyError::Malformed`] when the value is neither; the state is
    /// unchanged.
    pub fn on_publish_lost(&mut self, round: Round, value: &str) -> Result<(), StepKeyError> {
        if value == STOP_WATCHER {
            return Ok(());
        }
        let step: u64 = value.trim().parse().map_err(|_| StepKeyError::Malformed {
            key: round.key(),
            value: value.to_owned(),
        })?;
        if self.published[round.index()] && !self.phase.saved(round) && self.phase != Phase::Saving(round) {
            self.agreed[round.index()] = Some(step);
        }
        Ok(())
    }

    /// The save asked for by [`StepAction::Save`] finished.
    ///
    /// # Errors
    ///
    /// [`SaveError::Unexpected`] when no save for `round` was asked for.
    pub fn on_saved(&mut self, round: Round) -> Result<SaveAction, SaveError> {
        if self.phase != Phase::Saving(round) {
            return Err(SaveError::Unexpected(round));
        }
        let (i, f) = (Round::Initial.index(), Round::Final.index());
        if round == Round::Initial && self.agreed[f].is_some() && self.agreed[f] == self.agreed[i] {
            // The final round was agreed at the same step: this save was both.
            self.phase = Phase::Exited(Round::Final);
            return Ok(SaveAction::Exit);
        }
        if self.grace_period <= 0.0 || round == Round::Final {
            self.phase = Phase::Exited(round);
            Ok(SaveAction::Exit)
        } else {
            // The final round's step may be known already (its key came first).
            self.phase = if self.agreed[f].is_some() {
                Phase::Agreed(Round::Final)
            } else {
                Phase::Countdown
            };
            Ok(SaveAction::Countdown)
        }
    }

    /// The save asked for by [`StepAction::Save`] failed; the next
    /// `before_step` at the same run count asks again.
    pub fn on_save_failed(&mut self) {
        if let Phase::Saving(round) = self.phase {
            self.phase = Phase::Agreed(round);
        }
    }

    /// The rounds a preemption takes, in order: the first, then the final one
    /// when there is a grace period (decided once, at construction). A
    /// follower's reader watches these keys; a leader publishes them.
    #[must_use]
    pub fn rounds(&self) -> &'static [Round] {
        if self.grace_period > 0.0 {
            &[Round::Initial, Round::Final]
        } else {
            &[Round::Initial]
        }
    }

    /// The round after `round`, if this preemption has one.
    #[must_use]
    pub fn round_after(&self, round: Round) -> Option<Round> {
        let rounds = self.rounds();
        rounds.iter().position(|r| *r == round).and_then(|i| rounds.get(i + 1)).copied()
    }

    /// Keys to write `STOP_WATCHER` to at shutdown (none in local mode).
    #[must_use]
    pub fn shutdown_keys(&self) -> &'static [&'static str] {
        match self.membership {
            Membership::Local => &[],
            Membership::Worker { .. } => &[RUN_TO_CHECKPOINT, LAST_RUN_TO_CHECKPOINT],
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
