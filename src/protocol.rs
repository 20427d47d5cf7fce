//! The handler's protocol as one object: the [`Resolver`] (who saves at which
//! step), the [`GracePlanner`] (when the final round must start) and the step
//! timing that feeds it, with every bound the handler's parts ask for worked
//! out here, from one `now` passed in.
//!
//! Before this object the binding combined them (`CoreState` in
//! `src/python/handler.rs`): which notice a retry bound reads, what a deadline
//! is without a grace period, when a step-time sample is a warm-up. Those rules
//! are the protocol's, so they live here, with their table tests; the binding
//! only turns Python values into these calls and back.
//!
//! Every time is seconds on the caller's one monotonic clock (the binding's
//! `clock::now_secs`, the same clock as Python's `time.monotonic`).

use std::collections::BTreeMap;

use thiserror::Error;

use crate::acks::{AckStep, AckWait};
use crate::grace::{Fit, GracePlanner};
use crate::notice::Notice;
use crate::retry::Verdict;
use crate::shares::{self, Waiter};
use crate::step_resolution::{KeyAction, Membership, NoticeAction, Resolver, Round, SaveAction, SaveError, StepAction, StepKeyError};
use crate::writes::{WriteId, Writes};

/// The driver's writes as events in and actions out (`driver.rs`).
mod driver;
pub use driver::{DriverAction, SetCall, WriteEnd};
/// The leader's round as events in and actions out (`agree.rs`).
mod agree;
pub use agree::{LAST_LOOK_TIMEOUT, READ_BACK_TIMEOUT};
/// What the protocol answers its events with: one `Action`, declared once (`answer.rs`).
pub mod answer;
/// The follower's reader of the step keys as events in and actions out (`reader.rs`).
mod reader;
#[allow(unused_imports)]
pub(crate) use answer::action;
pub use answer::Action;
/// The protocol's inputs, declared once (`event.rs`).
mod event;
/// A step that failed: whether a peer is gone (`lost.rs`).
mod lost;

/// The step watch: a step blocked on a peer that is gone (issue 62).
pub mod watch;
#[allow(unused_imports)]
pub(crate) use event::event;
pub use event::Event;

/// The handler's configuration, set at construction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Config {
    /// This worker's id, or None in local mode (no cluster).
    pub worker_id: Option<u32>,
    /// How many workers the cluster has (ignored in local mode).
    pub num_workers: u32,
    /// `TerminationConfig.grace_period`, seconds.
    pub grace_period: f64,
    /// Save at the run the notice arrives in, not one later (TF's
    /// `_save_at_current_run` hook).
    pub save_at_current_run: bool,
    /// Seconds a leader waits for the acknowledgements, and the longest a
    /// failing coordination-service call is retried (`TerminationConfig.peer_timeout`).
    pub peer_timeout: f64,
}

/// A configuration or a value the protocol cannot work with.
#[derive(Debug, Error, PartialEq)]
pub enum ConfigError {
    #[error("grace_period must be a non-negative number of seconds, got {0}")]
    GracePeriod(f64),
    #[error("worker id {id} is not below the worker count {num_workers}")]
    WorkerId { id: u32, num_workers: u32 },
    #[error("the exit reserve must be a non-negative number of seconds, got {0}")]
    ExitReserve(f64),
    #[error("peer_timeout must be a non-negative number of seconds, got {0}")]
    PeerTimeout(f64),
    /// A step key's value the protocol cannot read (another worker's publish).
    #[error("{0}")]
    StepKey(String),
    #[error("the handler core is not configured (call configure first)")]
    NotConfigured,
}

impl Config {
    /// The membership this configuration names, or why it names none.
    pub fn membership(&self) -> Result<Membership, ConfigError> {
        if !self.grace_period.is_finite() || self.grace_period < 0.0 {
            return Err(ConfigError::GracePeriod(self.grace_period));
        }
        if !self.peer_timeout.is_finite() || self.peer_timeout < 0.0 {
            return Err(ConfigError::PeerTimeout(self.peer_timeout));
        }
        match self.worker_id {
            None => Ok(Membership::Local),
            Some(id) if id < self.num_workers => Ok(Membership::Worker {
                id,
                num_workers: self.num_workers,
            }),
            Some(id) => Err(ConfigError::WorkerId {
                id,
                num_workers: self.num_workers,
            }),
        }
    }
}

/// What follows a failed save ([`Protocol::handle_save_failed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveFailed {
    /// Raise the save's error (reported to every worker); the next step saves
    /// at the same agreed step again.
    Raise,
    /// A save in shares that did not become the checkpoint: the worker exits
    /// with the unmerged code (not the restart code, which says "saved").
    ExitUnmerged,
}

/// How a planned notice fits the time it leaves (`Protocol::fit`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FitReport {
    pub fit: Fit,
    /// Seconds left to the deadline.
    pub left: f64,
    /// Seconds the saves and the steps between them need.
    pub needed: f64,
}

/// The protocol's state for logs and tests (`ProtocolCore.state()`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub step_estimate: f64,
    pub step_samples: usize,
    pub longest_save: Option<f64>,
    pub margin: f64,
    /// The peer timeout in force ([`Config::peer_timeout`]).
    pub peer_timeout: f64,
    /// Seconds kept between the last save and the deadline for the exit.
    pub exit_reserve: f64,
    /// None until configured.
    pub resolver: Option<ResolverView>,
}

/// The resolver's part of a [`Snapshot`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResolverView {
    pub id: String,
    pub round: &'static str,
    pub agreed_step: Option<u64>,
    pub leading: bool,
    pub counting_down: bool,
    pub exited: bool,
    pub published_final: bool,
    /// This worker's own earliest deadline and the final round planned for it.
    pub planned_deadline: Option<f64>,
    pub final_round_at: Option<f64>,
    /// The leading notice's deadline.
    pub deadline: Option<f64>,
}

/// One handler's protocol. Before [`Protocol::configure`] only the planner's
/// measures (a restore, the exit reserve) are taken; every question about a
/// notice answers "none".
#[derive(Debug)]
pub struct Protocol {
    resolver: Option<Resolver>,
    planner: GracePlanner,
    /// When the last step (or check) started; the interval to the next start is
    /// one step's duration.
    last_start: Option<f64>,
    /// False until the first interval (warm-up) has been discarded.
    warmed_up: bool,
    /// The driver's writes (acknowledge, claim, announce): which is due, when
    /// the next is, and each one's run of failures under the retry rule.
    writes: Writes,
    /// The leader's wait for the acknowledgements of the step it published.
    acks: Option<AckWait>,
    /// The leader's round in progress, from the `before_step` that published
    /// it to its end ([`Action`]).
    agreeing: Option<agree::Agreeing>,
    /// The reader of the step keys: the round it reads, its run of failures.
    reader: reader::Reader,
    /// What each pending write sets ([`SetCall`]), by its handle.
    calls: BTreeMap<WriteId, SetCall>,
    /// The peer timeout ([`Config::peer_timeout`]; the default until configured).
    peer_timeout: f64,
    /// What the driver reports next: the end of a write, a retry to log
    /// ([`Protocol::poll`]), oldest first.
    outbox: std::collections::VecDeque<DriverAction>,
    /// The longest merge of the shares this handler measured (its start to the state
    /// file naming the checkpoint): [`shares::merge_estimate`].
    longest_merge: Option<f64>,
    /// A later statement of when the platform ends this process than the notice's
    /// own (a SLURM job this handler requeued: [`Protocol::handle_platform_end`]).
    platform_end: Option<f64>,
    /// The configuration set last ([`Protocol::configure`]); None until then.
    config: Option<Config>,
    /// When the timed operation in progress (a save, a restore) started
    /// ([`Protocol::handle_timing`]).
    timing: Option<f64>,
    /// How long the last timed operation took ([`Protocol::handle_timed`]): a save's
    /// duration for [`Protocol::handle_saved`], a restore's for the estimate.
    timed: Option<f64>,
    /// When (Unix time) this handler took over its worker's notices
    /// ([`Protocol::handle_take_over`]); None until it did.
    took_over: Option<f64>,
    /// The failed step whose peers are being probed ([`Protocol::handle_step_failed`]).
    probing: Option<lost::Probing>,
    /// How a peer lost inside the preemption protocol showed itself: a call of the
    /// protocol that gave up (publish, acknowledgement, step-key read), or
    /// acknowledgements missing at the peer timeout. The error raised then names no
    /// peer; the next failed step suspects one ([`Protocol::unanswered`]).
    unanswered: Option<crate::failure::lost_peer::Detection>,
    /// A non-chief's wait for the chief's checkpoint of the round it saved
    /// ([`Protocol::handle_confirm`]).
    confirming: Option<lost::Confirming>,
    /// The step the step watch follows ([`Protocol::handle_watch`]).
    watching: Option<watch::Watching>,
    /// This worker's survivors' save, when it is the writer ([`Protocol::handle_claims`]).
    writing: Option<lost::Writing>,
    /// Whether the survivors of a lost worker save ([`Protocol::holds_steps`]; the
    /// configuration's `lost_worker_saves`, from `TF_FAILURE_HANDLING_LOST_WORKER`).
    lost_worker_saves: bool,
}

impl Default for Protocol {
    fn default() -> Self {
        Self::new()
    }
}

impl Protocol {
    #[must_use]
    pub fn new() -> Self {
        Protocol {
            resolver: None,
            planner: GracePlanner::new(),
            last_start: None,
            warmed_up: false,
            writes: Writes::new(),
            acks: None,
            agreeing: None,
            reader: reader::Reader::default(),
            calls: BTreeMap::new(),
            peer_timeout: crate::step_resolution::DEFAULT_PEER_TIMEOUT,
            outbox: std::collections::VecDeque::new(),
            longest_merge: None,
            platform_end: None,
            config: None,
            timing: None,
            timed: None,
            took_over: None,
            probing: None,
            unanswered: None,
            confirming: None,
            watching: None,
            writing: None,
            lost_worker_saves: true,
        }
    }

    /// Sets the configuration (checked first: nothing changes on an error). A
    /// new configuration starts a new resolver; the planner's measures stay.
    pub fn configure(&mut self, config: Config) -> Result<(), ConfigError> {
        let membership = config.membership()?;
        let mut resolver = Resolver::new(membership, config.grace_period);
        if config.save_at_current_run {
            resolver.save_at_current_run();
        }
        self.resolver = Some(resolver);
        self.peer_timeout = config.peer_timeout;
        self.config = Some(config);
        Ok(())
    }

    /// The configuration set last, or the one a handler starts from (local mode, no
    /// grace period, the peer timeout in force): what a partial reconfiguration
    /// (the handler's views) changes.
    #[must_use]
    pub fn config(&self) -> Config {
        self.config.map_or(
            Config {
                worker_id: None,
                num_workers: 1,
                grace_period: crate::grace::DEFAULT_GRACE_PERIOD,
                save_at_current_run: false,
                peer_timeout: self.peer_timeout,
            },
            |c| Config {
                peer_timeout: self.peer_timeout,
                ..c
            },
        )
    }

    // --- the handler's notices --------------------------------------------

    /// This handler takes over its worker's notices when the wall clock says
    /// `unix_now` (an older handler of the same worker still open hands it every
    /// notice it sees from now on).
    pub fn handle_take_over(&mut self, unix_now: f64) {
        self.took_over = Some(unix_now);
    }

    /// Whether a notice that arrived at `at` (Unix time; None: not known) came after
    /// this handler took over: one that came before reached the handlers open then,
    /// as TensorFlow's signal handlers, and is not this one's.
    #[must_use]
    pub fn came_after(&self, at: Option<f64>) -> bool {
        match (at, self.took_over) {
            (Some(at), Some(took_over)) => at >= took_over,
            _ => true,
        }
    }

    // --- timed operations ------------------------------------------------

    /// A timed operation (a save, a restore) starts at `now`.
    pub fn handle_timing(&mut self, now: f64) {
        self.timing = Some(now);
    }

    /// The timed operation ends at `now`: the seconds it took (0 with none started),
    /// kept as the duration [`handle_saved_timed`](Self::handle_saved_timed) and
    /// [`handle_restored_timed`](Self::handle_restored_timed) record.
    pub fn handle_timed(&mut self, now: f64) -> f64 {
        let took = self.timing.take().map_or(0.0, |start| (now - start).max(0.0));
        self.timed = Some(took);
        took
    }

    /// The save of `round` ended; its duration is the last timed operation's.
    pub fn handle_saved_timed(&mut self, round: Round) -> Result<Result<SaveAction, SaveError>, ConfigError> {
        let took = self.timed.unwrap_or(0.0);
        self.handle_saved(round, took)
    }

    /// The checkpoint read at start ended; its duration is the last timed operation's.
    pub fn handle_restored_timed(&mut self) {
        if let Some(took) = self.timed {
            self.handle_restored(took);
        }
    }

    /// The process exits at `now`; the platform stated, after the notice, that it ends
    /// the process `ends_in` seconds from now (a SLURM job this handler requeued), or
    /// nothing more. The seconds until the platform ends it ([`kill_deadline`](Self::kill_deadline)),
    /// None when it stated no moment: what the exit guard waits for.
    pub fn handle_exiting(&mut self, now: f64, ends_in: Option<f64>) -> Option<f64> {
        if let Some(left) = ends_in {
            self.handle_platform_end(now + left);
        }
        self.kill_deadline().map(|k| k - now)
    }

    /// The peer timeout configured ([`Config::peer_timeout`]).
    #[must_use]
    pub fn peer_timeout(&self) -> f64 {
        self.peer_timeout
    }

    /// Sets the peer timeout alone (the handler's `_peer_timeout`, a view).
    pub fn set_peer_timeout(&mut self, secs: f64) -> Result<(), ConfigError> {
        if !secs.is_finite() || secs < 0.0 {
            return Err(ConfigError::PeerTimeout(secs));
        }
        self.peer_timeout = secs;
        Ok(())
    }

    /// The resolver, once configured.
    pub fn resolver(&self) -> Option<&Resolver> {
        self.resolver.as_ref()
    }

    fn resolver_mut(&mut self) -> Result<&mut Resolver, ConfigError> {
        self.resolver.as_mut().ok_or(ConfigError::NotConfigured)
    }

    /// Whether the next step must stop for the protocol (what the hot path reads
    /// through an atomic mirror).
    pub fn needs_attention(&self) -> bool {
        self.resolver.as_ref().is_some_and(Resolver::needs_attention)
    }

    /// Whether the last whole step is held after each step that returned: in a
    /// cluster of several workers (MultiWorkerMirroredStrategy), where the survivors
    /// of a worker lost without notice save it (`lost.rs`), unless they were
    /// configured not to.
    #[must_use]
    pub fn holds_steps(&self) -> bool {
        self.lost_worker_saves && self.in_cluster()
    }

    /// Whether this worker is one of several (MultiWorkerMirroredStrategy).
    #[must_use]
    pub fn in_cluster(&self) -> bool {
        self.config.is_some_and(|c| c.worker_id.is_some() && c.num_workers > 1)
    }

    /// Whether the survivors of a worker lost without notice save the last whole step
    /// (the default), or only raise, as TensorFlow does.
    pub fn set_lost_worker_saves(&mut self, saves: bool) {
        self.lost_worker_saves = saves;
    }

    // --- step timing -----------------------------------------------------

    /// A step starts at `now`. The planner's step time is the interval between
    /// consecutive starts. The first interval of the handler's life is not
    /// recorded: it holds `tf.function` tracing and collective set-up, often
    /// seconds, and with few samples it would be the "p95" and swallow a short
    /// grace period.
    pub fn step_started(&mut self, now: f64) {
        if let Some(previous) = self.last_start.replace(now) {
            if self.warmed_up {
                self.planner.record_step((now - previous).max(0.0));
            } else {
                self.warmed_up = true;
            }
        }
    }

    /// The step's checks took their time: the step itself starts at `now`.
    pub fn checks_done(&mut self, now: f64) {
        self.last_start = Some(now);
    }

    /// A step raised: its interval is no step time.
    pub fn step_failed(&mut self) {
        self.last_start = None;
    }

    // --- events ----------------------------------------------------------

    pub fn handle_notice(&mut self, notice: Notice) -> Result<NoticeAction, ConfigError> {
        Ok(self.resolver_mut()?.on_notice(notice))
    }

    pub fn handle_claim(&mut self, won: bool) -> Result<(), ConfigError> {
        self.resolver_mut()?.on_claim(won);
        Ok(())
    }

    pub fn handle_step_key(&mut self, round: Round, value: &str) -> Result<Result<KeyAction, StepKeyError>, ConfigError> {
        Ok(self.resolver_mut()?.on_step_key(round, value))
    }

    pub fn handle_publish_lost(&mut self, round: Round, value: &str) -> Result<Result<(), StepKeyError>, ConfigError> {
        Ok(self.resolver_mut()?.on_publish_lost(round, value))
    }

    /// What to do before the step that follows `runs` completed runs.
    pub fn before_step(&mut self, runs: u64, now: f64) -> Result<StepAction, ConfigError> {
        let Protocol { resolver, planner, .. } = self;
        let resolver = resolver.as_mut().ok_or(ConfigError::NotConfigured)?;
        let action = resolver.before_step(runs, now, planner);
        if let StepAction::Publish {
            round,
            step,
            ack_keys,
            own_ack_key,
        } = &action
        {
            self.start_round(*round, *step, ack_keys.clone(), own_ack_key.clone(), now);
        }
        Ok(action)
    }

    /// The check before the step that follows `runs` completed runs, at `now`: the
    /// resolver's decision ([`before_step`](Self::before_step)), a save with the
    /// seconds the closures in flight get first ([`drain_bound`](Self::drain_bound)).
    pub fn step_check(&mut self, runs: u64, now: f64) -> Result<Action, ConfigError> {
        let action = self.before_step(runs, now)?;
        Ok(Action::step(action, self.drain_bound(now)))
    }

    /// The end of the save of `round`, timed last: exit, or count down.
    pub fn saved(&mut self, round: Round) -> Result<Result<Action, SaveError>, ConfigError> {
        Ok(self.handle_saved_timed(round)?.map(Action::from))
    }

    /// A save of `round` ended after `duration` seconds.
    pub fn handle_saved(&mut self, round: Round, duration: f64) -> Result<Result<SaveAction, SaveError>, ConfigError> {
        let after = self.resolver_mut()?.on_saved(round);
        if after.is_ok() {
            self.planner.record_save(duration);
        }
        Ok(after)
    }

    /// A save failed. `shares`: it was written in shares by several workers, so
    /// the checkpoint before it may be half replaced: the worker exits with the
    /// unmerged code rather than raise and train on ([`SaveFailed`]).
    pub fn handle_save_failed(&mut self, shares: bool) -> Result<SaveFailed, ConfigError> {
        self.resolver_mut()?.on_save_failed();
        Ok(if shares { SaveFailed::ExitUnmerged } else { SaveFailed::Raise })
    }

    /// An agreement (publish to every acknowledgement) took `duration` seconds.
    pub fn handle_agreement(&mut self, duration: f64) {
        self.planner.record_agreement(duration);
    }

    /// The checkpoint read at start took `duration` seconds: the save estimate
    /// until a save is measured.
    pub fn handle_restored(&mut self, duration: f64) {
        self.planner.record_restore(duration);
    }

    pub fn set_exit_reserve(&mut self, secs: f64) -> Result<(), ConfigError> {
        if !secs.is_finite() || secs < 0.0 {
            return Err(ConfigError::ExitReserve(secs));
        }
        self.planner.set_exit_reserve(secs);
        Ok(())
    }

    // --- the leader's wait for the acknowledgements -------------------------

    /// The leader published: it waits for `keys`, from `at` on the driver's
    /// clock, for at most the peer timeout ([`crate::acks`]).
    pub fn start_ack_wait(&mut self, keys: Vec<String>, at: f64) {
        self.acks = Some(AckWait::new(keys, self.peer_timeout, at));
    }

    /// What the leader does at `at`: read a key, or the wait is done or over.
    /// Done with no wait started.
    #[must_use]
    pub fn ack_next(&self, at: f64) -> AckStep {
        self.acks.as_ref().map_or(AckStep::Done, |w| w.next(at))
    }

    /// The read of the first missing key answered (`found`: written).
    pub fn handle_ack_read(&mut self, found: bool) {
        if let Some(w) = self.acks.as_mut() {
            w.answered(found);
        }
    }

    /// The read failed at `at`: when to read again (never past the wait's end),
    /// or give up. A run of failures starting now is retried for the retry bound
    /// at `now` on the protocol's clock ([`retry_bound`](Self::retry_bound)).
    /// `None` with no wait started.
    pub fn handle_ack_read_failed(&mut self, now: f64, at: f64, closing: bool) -> Option<Verdict> {
        let bound = self.retry_bound(now);
        Some(self.acks.as_mut()?.failed(bound, at, closing))
    }

    /// The run of failed reads still open at `at`: `(failed reads, seconds)`.
    #[must_use]
    pub fn ack_failing(&self, at: f64) -> Option<(u32, f64)> {
        self.acks.as_ref()?.failing(at)
    }

    // --- bounds ----------------------------------------------------------

    fn leading_deadline(&self) -> Option<f64> {
        let r = self.resolver.as_ref()?;
        r.leading_notice().map(|n| GracePlanner::deadline(n, r.grace_period()))
    }

    /// How long a failing coordination-service call is retried from `now`
    /// (`retry::bound`): the leading notice's deadline, if any, may shorten it.
    pub fn retry_bound(&self, now: f64) -> f64 {
        crate::retry::bound(self.peer_timeout, self.leading_deadline(), now)
    }

    /// When this worker's notice says the machine goes: with a grace period the
    /// planner's deadline, else the platform's; None with no notice or one that
    /// names no time. The planned notice (this worker's own) first, else the
    /// leading one.
    pub fn notice_deadline(&self) -> Option<f64> {
        let (n, grace) = self.own_notice()?;
        if grace > 0.0 {
            Some(GracePlanner::deadline(n, grace))
        } else {
            n.deadline
        }
    }

    /// This worker's notice (the planned one, its own, else the leading one) and
    /// the grace period, for the deadlines of [`notice_deadline`](Self::notice_deadline)
    /// and [`kill_deadline`](Self::kill_deadline).
    fn own_notice(&self) -> Option<(Notice, f64)> {
        let r = self.resolver.as_ref()?;
        Some((r.planned_notice().or_else(|| r.leading_notice())?, r.grace_period()))
    }

    /// When the platform ends this process, as the platform itself stated it: the
    /// planned notice's (else the leading notice's) [`Notice::kill`], or an earlier
    /// moment the platform stated since ([`handle_platform_end`](Self::handle_platform_end)).
    /// None when nothing was stated: a grace period alone says when the saves must
    /// be done, not that anything ends the process then (TensorFlow's tests set one
    /// with no kill behind it), and an assumed deadline (Kubernetes' default grace
    /// period) is a guess. The exit guard waits for this moment only.
    pub fn kill_deadline(&self) -> Option<f64> {
        let kill = self.own_notice()?.0.kill;
        match (kill, self.platform_end) {
            (Some(k), Some(e)) => Some(k.min(e)),
            (k, e) => k.or(e),
        }
    }

    /// The platform stated, after the notice, that it ends this process at `at`
    /// (monotonic): a SLURM job this handler requeued gets its SIGKILL `KillWait`
    /// after the requeue (`sources::slurm::kill_after_requeue`), whatever the
    /// notice said. The earliest statement counts.
    pub fn handle_platform_end(&mut self, at: f64) {
        if at.is_finite() {
            self.platform_end = Some(self.platform_end.map_or(at, |e| e.min(at)));
        }
    }

    /// How long the coordinator of a parameter-server cluster lets the closures
    /// in flight finish before its save, from `now`; the peer timeout when the
    /// notice set no deadline or this worker does not lead.
    pub fn drain_bound(&self, now: f64) -> f64 {
        self.resolver
            .as_ref()
            .and_then(|r| r.leading_notice().and_then(|n| self.planner.drain_bound(n, r.grace_period(), now)))
            .unwrap_or(self.peer_timeout)
    }

    /// Seconds a worker that writes a share of the save waits from `now`, after
    /// its own part took `own` seconds (`shares::wait_bound_at`, with this
    /// worker's notice's deadline and the exit's reserve).
    pub fn shares_wait_bound(&self, own: f64, now: f64, min_wait: f64, waiter: Waiter) -> f64 {
        shares::wait_bound_at(own, min_wait, self.notice_deadline(), now, self.planner.exit_reserve(), waiter)
    }

    /// Whether the chief starts the merge of the shares at `now`, after its own part
    /// took `own` seconds (`shares::merge_start`: the longest merge measured, else
    /// `own`, against this worker's notice's deadline less the exit's reserve).
    pub fn shares_merge_start(&self, own: f64, now: f64, min_wait: f64) -> shares::MergeStart {
        let needed = shares::merge_estimate(self.longest_merge, own);
        shares::merge_start(needed, own, min_wait, self.notice_deadline(), now, self.planner.exit_reserve())
    }

    /// A merge of the shares took `secs` seconds, from its start to the state file
    /// naming the checkpoint: the next merge's estimate is the longest so far.
    pub fn handle_shares_merged(&mut self, secs: f64) {
        if secs.is_finite() && secs >= 0.0 {
            self.longest_merge = Some(self.longest_merge.map_or(secs, |m| m.max(secs)));
        }
    }

    /// True once this worker leads the response (won the claim, or local mode).
    pub fn leading(&self) -> bool {
        self.resolver.as_ref().is_some_and(|r| r.leading_notice().is_some())
    }

    /// Whether the planned notice leaves time for the saves, from `now`; None
    /// without one.
    pub fn fit(&self, now: f64) -> Option<FitReport> {
        let r = self.resolver.as_ref()?;
        let (fit, left, needed) = self.planner.fit(r.planned_notice()?, r.grace_period(), now);
        Some(FitReport { fit, left, needed })
    }

    pub fn exit_reserve(&self) -> f64 {
        self.planner.exit_reserve()
    }

    /// Seconds before the deadline the final round starts.
    pub fn margin(&self) -> f64 {
        self.planner.margin()
    }

    /// The rounds' keys in order: what a follower's reader watches (the
    /// final round's only with a grace period).
    pub fn round_keys(&self) -> Result<Vec<&'static str>, ConfigError> {
        Ok(self
            .resolver
            .as_ref()
            .ok_or(ConfigError::NotConfigured)?
            .rounds()
            .iter()
            .map(|r| r.key())
            .collect())
    }

    /// Whether a preemption has a final round (a grace period): training goes
    /// on after the first save, and a notice that leaves room for one save
    /// only is worth a warning.
    pub fn has_final_round(&self) -> Result<bool, ConfigError> {
        Ok(self.resolver.as_ref().ok_or(ConfigError::NotConfigured)?.rounds().len() > 1)
    }

    /// The step keys every worker writes `STOP_WATCHER` to at shutdown.
    pub fn shutdown_keys(&self) -> Result<&'static [&'static str], ConfigError> {
        Ok(self.resolver.as_ref().ok_or(ConfigError::NotConfigured)?.shutdown_keys())
    }

    /// The writes of `STOP_WATCHER` to the step keys at shutdown (which release
    /// the readers still blocked on them), as blocking writes.
    pub fn shutdown_writes(&self) -> Result<Vec<Action>, ConfigError> {
        Ok(self
            .shutdown_keys()?
            .iter()
            .map(|key| Action::Set {
                key: (*key).to_owned(),
                value: crate::step_resolution::STOP_WATCHER.to_owned(),
                timeout: crate::step_resolution::SHUTDOWN_WRITE_TIMEOUT,
                what: format!("releasing {key}"),
            })
            .collect())
    }

    /// The state for logs and tests.
    pub fn snapshot(&self) -> Snapshot {
        let planner = &self.planner;
        let resolver = self.resolver.as_ref().map(|r| {
            let grace = r.grace_period();
            let planned = r.planned_notice();
            ResolverView {
                id: r.id().to_string(),
                round: r.round().key(),
                agreed_step: r.agreed_step(),
                leading: r.leading_notice().is_some(),
                counting_down: r.counting_down(),
                exited: r.exited(),
                published_final: r.published(Round::Final),
                planned_deadline: planned.map(|n| GracePlanner::deadline(n, grace)),
                final_round_at: planned.map(|n| planner.latest_publish(n, grace)),
                deadline: r.leading_notice().map(|n| GracePlanner::deadline(n, grace)),
            }
        });
        Snapshot {
            step_estimate: planner.step_estimate(),
            step_samples: planner.samples(),
            longest_save: planner.longest_save(),
            margin: planner.margin(),
            peer_timeout: self.peer_timeout,
            exit_reserve: planner.exit_reserve(),
            resolver,
        }
    }
}

/// The protocol's tests, and the test-only simulators (`tests/cluster.rs`: an MWMS
/// cluster of protocols; `tests/failures.rs`: the "Failures" table run on it).
#[cfg(test)]
mod tests;
