//! Which worker writes which tensor when the workers of a MultiWorkerMirroredStrategy
//! cluster write one checkpoint together (`TF_FAILURE_HANDLING_NON_CHIEF_SAVES=shares`).
//!
//! Every worker holds the same tensors and asks the same question with the same sizes,
//! so every worker gets the same answer without talking to the others. The answer is
//! TensorFlow's sharded layout: part `i` of `n` (`<prefix>_temp/part-0000i-of-0000n`)
//! is written by the `i`-th worker that has a tensor at all, and the chief merges the
//! parts into `<prefix>.index` and `<prefix>.data-0000i-of-0000n`.
//!
//! The part paths carry a token of the save (the chief's random token, published at
//! the handler's construction, and the save's number), so a part left by an earlier
//! attempt is never one of this save's. Each non-chief's "ok" names the size of its
//! part's data and the digest of its index (which holds every tensor's checksum); the
//! chief merges only the parts it sees with those, then publishes the merge's result,
//! and a non-chief exits with the restart code only once it reads "merged". Every wait
//! is bounded by [`wait_bound_at`]: the rule below, and the notice's deadline less the
//! exit's reserve. At construction the chief writes a probe file with the token, every
//! other worker reads it and answers, so a folder the workers do not share is an
//! error before any notice can come ([`PROBE_WAIT`]).

use thiserror::Error;

/// The chief's shortest wait for the other workers' parts, in seconds.
pub const MIN_WAIT: f64 = 60.0;
/// The chief waits this many times as long as its own part took, when that is longer.
pub const WAIT_FACTOR: f64 = 4.0;

/// How long the chief waits for the other parts after its own took `own` seconds:
/// `WAIT_FACTOR` × `own`, and at least `min_wait` ([`MIN_WAIT`] in production). The
/// parts are about even and started together, so a part this late is not coming.
#[must_use]
pub fn wait_bound(own: f64, min_wait: f64) -> f64 {
    (WAIT_FACTOR * own.max(0.0)).max(min_wait)
}

/// Seconds every worker waits, at the handler's construction, for the others' part of
/// the probe of the checkpoint folder: the chief's token, then each worker's answer.
/// The workers build their handlers together (right after the strategy), so a worker
/// this late is not coming.
pub const PROBE_WAIT: f64 = 60.0;
/// The exit code of a worker whose share was written but that the chief did
/// not report merged: not the restart code, which says "checkpoint saved"
/// (75, `EX_TEMPFAIL`: try again later, from the checkpoint before).
pub const UNMERGED_EXIT_CODE: i32 = 75;
/// Seconds a worker looks for the chief's probe file before it says it cannot see
/// it: a shared file system may show another host's new file a little later.
pub const PROBE_LOOK: f64 = 10.0;
/// Seconds between two looks for the probe file.
pub const PROBE_LOOK_EVERY: f64 = 0.2;

/// Who waits, in a save the workers write together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiter {
    /// The chief, for the other workers' parts.
    Chief,
    /// A non-chief, for the chief's report of the merge: the chief's wait for the parts
    /// and then its merge, so twice the chief's bound when no deadline binds.
    NonChief,
}

/// How long `waiter` waits, from `now` (the handler's clock), after its own part took
/// `own` seconds: [`wait_bound`] (twice that for a non-chief), and never past
/// `deadline - exit_reserve`, when the notice set a `deadline`: a wait that runs into
/// the exit's reserve leaves the process in its exit when the machine goes. A
/// deadline already that close gives 0 (the waiter gives up at once, and says so).
#[must_use]
pub fn wait_bound_at(own: f64, min_wait: f64, deadline: Option<f64>, now: f64, exit_reserve: f64, waiter: Waiter) -> f64 {
    let rule = match waiter {
        Waiter::Chief => wait_bound(own, min_wait),
        Waiter::NonChief => 2.0 * wait_bound(own, min_wait),
    };
    match deadline {
        Some(d) if !d.is_nan() => rule.min((d - now - exit_reserve.max(0.0)).max(0.0)),
        _ => rule,
    }
}

/// Whether the chief starts the merge of the parts ([`merge_start`]). A merge cannot be
/// cancelled once started (TensorFlow's `MergeV2Checkpoints` renames the parts' data
/// files into the checkpoint), so it starts only when it is expected to end, with
/// `CheckpointManager.save`'s state file, before the deadline less the exit's reserve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MergeStart {
    /// Start it, and wait for it (the merge, then the state file) at most `bound`
    /// seconds.
    Start { bound: f64 },
    /// Do not start it: the previous checkpoint stays. `needed`: the seconds the
    /// merge is expected to take ([`merge_estimate`]); `left`: the seconds left before
    /// the deadline less the exit's reserve.
    Keep { needed: f64, left: f64 },
}

/// The seconds a merge is expected to take: the longest merge this handler measured
/// (from its start to the state file naming the checkpoint), else the chief's own
/// part's write, `own`: a merge rewrites the index and renames every part's data file,
/// which an object store (`gs://`, `s3://`) does by copying it.
#[must_use]
pub fn merge_estimate(measured: Option<f64>, own: f64) -> f64 {
    measured.filter(|m| !m.is_nan()).unwrap_or(own).max(0.0)
}

/// Whether the chief starts a merge expected to take `needed` seconds, at `now` (the
/// handler's clock), after its own part took `own` seconds: always when the notice set
/// no `deadline`, else only when `needed` fits in what is left before `deadline -
/// exit_reserve`. A started merge is waited for [`wait_bound`] of the longer of `own`
/// and `needed`, never past `deadline - exit_reserve`.
#[must_use]
pub fn merge_start(needed: f64, own: f64, min_wait: f64, deadline: Option<f64>, now: f64, exit_reserve: f64) -> MergeStart {
    let rule = wait_bound(own.max(needed), min_wait);
    match deadline {
        Some(d) if !d.is_nan() => {
            let left = d - now - exit_reserve.max(0.0);
            if needed <= left {
                MergeStart::Start { bound: rule.min(left) }
            } else {
                MergeStart::Keep {
                    needed,
                    left: left.max(0.0),
                }
            }
        }
        _ => MergeStart::Start { bound: rule },
    }
}

/// The shortest wait a shares' wait hands out: one whose time is up still asks
/// once (a coordination-service get of 0 ms would wait for ever).
pub const MIN_TIMEOUT: f64 = 0.001;

/// The probe of the checkpoint folder at the handler's construction, as one worker
/// waits in it: the chief for every other worker's answer, the others for the
/// chief's token ([`PROBE_WAIT`] in all, from its start), then for the probe file
/// ([`PROBE_LOOK`], looked for every [`PROBE_LOOK_EVERY`]). Never reads a clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    end: f64,
    looking_until: Option<f64>,
}

impl Probe {
    /// A probe starting at `now`.
    #[must_use]
    pub fn new(now: f64) -> Self {
        Probe {
            end: now + PROBE_WAIT,
            looking_until: None,
        }
    }

    /// Seconds the next wait for an answer (or the token) lasts from `now`: what is
    /// left of [`PROBE_WAIT`], at least [`MIN_TIMEOUT`].
    #[must_use]
    pub fn left(&self, now: f64) -> f64 {
        (self.end - now).max(MIN_TIMEOUT)
    }

    /// The probe file was looked for at `now` and `seen` (or not): None, stop looking
    /// (it was seen, or [`PROBE_LOOK`] passed since the first look); else when to
    /// look again.
    pub fn look(&mut self, now: f64, seen: bool) -> Option<f64> {
        let until = *self.looking_until.get_or_insert(now + PROBE_LOOK);
        (!seen && now < until).then(|| (now + PROBE_LOOK_EVERY).min(until))
    }
}

/// The waits of one save the workers write together, as one worker sees them:
/// its own part (timed), then the chief's wait for the other parts or a
/// non-chief's for the merge (until an end the caller's bound set, from
/// [`wait_bound_at`]), then the chief's merge (until the end [`merge_start`]'s
/// bound sets). Never reads a clock: each event comes with `now`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SaveWaits {
    part_began: Option<f64>,
    own: f64,
    end: Option<f64>,
    merge_began: Option<f64>,
}

impl SaveWaits {
    /// This worker starts writing its part at `now`.
    pub fn part_started(&mut self, now: f64) {
        self.part_began = Some(now);
    }

    /// Its part is written at `now`: how long it took (0 if its start was not told).
    pub fn part_written(&mut self, now: f64) -> f64 {
        self.own = self.part_began.map_or(0.0, |began| (now - began).max(0.0));
        self.own
    }

    /// Seconds this worker's own part took.
    #[must_use]
    pub fn own(&self) -> f64 {
        self.own
    }

    /// The waits that follow end `bound` seconds after `now`.
    pub fn wait(&mut self, now: f64, bound: f64) {
        self.end = Some(now + bound.max(0.0));
    }

    /// The merge starts at `now`, waited for `bound` seconds.
    pub fn merge_started(&mut self, now: f64, bound: f64) {
        self.merge_began = Some(now);
        self.wait(now, bound);
    }

    /// Seconds the next wait lasts from `now`: what is left until the end, at least
    /// [`MIN_TIMEOUT`] (the minimum, too, before any end was set).
    #[must_use]
    pub fn left(&self, now: f64) -> f64 {
        self.end.map_or(MIN_TIMEOUT, |end| (end - now).max(MIN_TIMEOUT))
    }

    /// The merge ended at `now` (the state file names the checkpoint): how long it
    /// took, None when none started.
    #[must_use]
    pub fn merge_took(&self, now: f64) -> Option<f64> {
        self.merge_began.map(|began| (now - began).max(0.0))
    }
}

crate::wire! {
    /// What one worker does next in the waits of the checkpoint's shares
    /// ([`Waits::poll`]).
    pub enum SharesAction via shares_action {
        /// Wait (at the construction, for the chief's token or a worker's answer; in a
        /// save, for a part, a file, the merge's report or a removal) at most `timeout`
        /// seconds; `bound`: the whole wait's, which a message names.
        Wait { timeout: f64, bound: f64 },
        /// Look for the probe file (the pause since the last look is over).
        Look {},
        /// Stop looking for the probe file: it was `seen`, or not within `looked`
        /// seconds.
        Looked { seen: bool, looked: f64 },
        /// Start the merge of the parts; it and the state file are waited for at most
        /// `bound` seconds.
        Merge { bound: f64 },
        /// Do not start the merge: it is expected to take `needed` seconds and `left`
        /// are left before the notice's deadline less the exit's reserve (a merge cannot
        /// be cancelled once started). The checkpoint before it stays.
        Keep { needed: f64, left: f64 },
    }
}

/// What a worker tells its [`Waits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SharesEvent {
    /// The chief's token came (a non-chief's probe): it looks for the file next.
    Token,
    /// The probe file was looked for, and `seen` or not.
    Looked { seen: bool },
    /// This worker's part is written: the waits that follow (the chief's for the
    /// other parts, a non-chief's for the merge) end at the bound from now.
    PartWritten,
    /// The chief has every part, each the one its worker wrote: it decides the merge
    /// next.
    PartsChecked,
    /// The merge ended: the state file names the checkpoint.
    Merged,
    /// The chief's save failed: it removes the save's parts next, in a wait of its own.
    Failed,
}

/// Where a save's bounds come from: a handler's protocol (its notice's deadline less
/// the exit's reserve, and the merges it measured: `crate::protocol`), or the rule
/// alone ([`Rule`]).
pub trait Bounds {
    /// How long `waiter` waits from `now`, its own part having taken `own` seconds
    /// ([`wait_bound_at`]).
    fn wait_bound(&mut self, own: f64, now: f64, waiter: Waiter) -> f64;
    /// Whether the chief starts the merge at `now` ([`merge_start`]).
    fn merge_start(&mut self, own: f64, now: f64) -> MergeStart;
    /// A merge took `took` seconds, to the state file naming the checkpoint.
    fn merged(&mut self, took: f64);
}

/// The rule alone: no notice, no merge measured, no reserve.
pub struct Rule;

impl Bounds for Rule {
    fn wait_bound(&mut self, own: f64, now: f64, waiter: Waiter) -> f64 {
        wait_bound_at(own, MIN_WAIT, None, now, 0.0, waiter)
    }

    fn merge_start(&mut self, own: f64, now: f64) -> MergeStart {
        merge_start(merge_estimate(None, own), own, MIN_WAIT, None, now, 0.0)
    }

    fn merged(&mut self, _took: f64) {}
}

/// What [`Waits::poll`] answers next.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Next {
    /// The current wait (the probe's, or the save's until its end).
    Wait,
    /// Look for the probe file at `at`.
    Look { at: f64 },
    /// Stop looking: it was `seen` (or not).
    Looked { seen: bool },
    /// The chief decides the merge.
    Decide,
}

/// Every wait of one worker in the shares: the probe at the handler's construction
/// ([`Probe`]), or one save ([`SaveWaits`], its own part started at the
/// construction). Events go in ([`Waits::handle`]), actions come out
/// ([`Waits::poll`]), each with `now`; the bounds come from [`Bounds`]. Never reads a
/// clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Waits {
    chief: bool,
    probe: Option<Probe>,
    save: SaveWaits,
    /// The bound of the current wait, for messages.
    bound: f64,
    next: Next,
}

impl Waits {
    /// The probe of the checkpoint folder, from `now`.
    #[must_use]
    pub fn probe(now: f64) -> Self {
        Waits {
            chief: false,
            probe: Some(Probe::new(now)),
            save: SaveWaits::default(),
            bound: PROBE_WAIT,
            next: Next::Wait,
        }
    }

    /// One save, this worker's part (the `chief`'s or not) starting at `now`.
    #[must_use]
    pub fn save(chief: bool, now: f64) -> Self {
        let mut save = SaveWaits::default();
        save.part_started(now);
        Waits {
            chief,
            probe: None,
            save,
            bound: MIN_TIMEOUT,
            next: Next::Wait,
        }
    }

    /// `event` at `now`.
    pub fn handle(&mut self, event: SharesEvent, now: f64, bounds: &mut dyn Bounds) {
        match event {
            SharesEvent::Token => self.next = Next::Look { at: now },
            SharesEvent::Looked { seen } => {
                let again = self.probe.as_mut().and_then(|p| p.look(now, seen));
                self.next = again.map_or(Next::Looked { seen }, |at| Next::Look { at });
            }
            SharesEvent::PartWritten => {
                let own = self.save.part_written(now);
                let waiter = if self.chief { Waiter::Chief } else { Waiter::NonChief };
                self.wait(now, bounds.wait_bound(own, now, waiter));
            }
            SharesEvent::PartsChecked => self.next = Next::Decide,
            SharesEvent::Merged => {
                if let Some(took) = self.save.merge_took(now) {
                    bounds.merged(took);
                }
            }
            SharesEvent::Failed => self.wait(now, bounds.wait_bound(0.0, now, Waiter::Chief).max(MIN_TIMEOUT)),
        }
    }

    fn wait(&mut self, now: f64, bound: f64) {
        self.save.wait(now, bound);
        self.bound = bound;
        self.next = Next::Wait;
    }

    /// What to do at `now`; None when nothing is due before [`Waits::poll_timeout`]
    /// (the pause before the next look for the probe file).
    pub fn poll(&mut self, now: f64, bounds: &mut dyn Bounds) -> Option<SharesAction> {
        Some(match self.next {
            Next::Wait => SharesAction::Wait {
                timeout: self.poll_timeout(now),
                bound: self.bound,
            },
            Next::Look { at } if now < at => return None,
            Next::Look { .. } => SharesAction::Look {},
            Next::Looked { seen } => SharesAction::Looked { seen, looked: PROBE_LOOK },
            Next::Decide => match bounds.merge_start(self.save.own(), now) {
                MergeStart::Start { bound } => {
                    self.save.merge_started(now, bound);
                    self.bound = bound;
                    self.next = Next::Wait;
                    SharesAction::Merge { bound }
                }
                MergeStart::Keep { needed, left } => SharesAction::Keep { needed, left },
            },
        })
    }

    /// Seconds from `now` the current wait lasts (at least [`MIN_TIMEOUT`]), or until
    /// the next look for the probe file (0: one is due).
    #[must_use]
    pub fn poll_timeout(&self, now: f64) -> f64 {
        match (self.next, &self.probe) {
            (Next::Look { at }, _) => (at - now).max(0.0),
            (_, Some(probe)) => probe.left(now),
            _ => self.save.left(now),
        }
    }
}

/// A plan that cannot be made.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SharesError {
    #[error("a checkpoint is written by at least one worker, not 0")]
    NoWorkers,
    #[error("{sizes} tensor sizes but {pinned} pinned flags: one flag per tensor")]
    Mismatch { sizes: usize, pinned: usize },
}

/// Who writes what: `owner[t]` is the worker that writes tensor `t`; `parts` lists the
/// workers that write a part, in part order (a worker with no tensor writes none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shares {
    pub owner: Vec<usize>,
    pub parts: Vec<usize>,
}

impl Shares {
    /// The part this worker writes (its index in `parts`), if it writes one.
    pub fn part_of(&self, worker: usize) -> Option<usize> {
        self.parts.iter().position(|&w| w == worker)
    }
}

/// Splits tensors of `sizes` bytes between `workers` workers.
///
/// A `pinned` tensor goes to worker 0, the chief (the object graph: the merged index
/// then describes the chief's objects). The others go largest first, each to the
/// worker with the fewest bytes so far, the lowest index on a tie; equal sizes keep
/// their order. The largest share is then at most the even share plus one tensor.
pub fn assign(sizes: &[u64], pinned: &[bool], workers: usize) -> Result<Shares, SharesError> {
    if workers == 0 {
        return Err(SharesError::NoWorkers);
    }
    if sizes.len() != pinned.len() {
        return Err(SharesError::Mismatch {
            sizes: sizes.len(),
            pinned: pinned.len(),
        });
    }
    let mut load = vec![0u64; workers];
    let mut owner = vec![0usize; sizes.len()];
    for (t, _) in pinned.iter().enumerate().filter(|(_, &p)| p) {
        load[0] = load[0].saturating_add(sizes[t]);
    }
    let mut order: Vec<usize> = (0..sizes.len()).filter(|&t| !pinned[t]).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    for t in order {
        let lightest = (0..workers).min_by_key(|&w| (load[w], w)).unwrap_or(0);
        owner[t] = lightest;
        load[lightest] = load[lightest].saturating_add(sizes[t]);
    }
    let mut parts: Vec<usize> = owner.clone();
    parts.sort_unstable();
    parts.dedup();
    Ok(Shares { owner, parts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shares(sizes: &[u64], pinned: &[bool], workers: usize) -> Shares {
        assign(sizes, pinned, workers).unwrap()
    }

    #[test]
    fn each_row_of_the_table() {
        // (sizes, pinned, workers, owners, parts)
        type Row = (&'static [u64], &'static [bool], usize, &'static [usize], &'static [usize]);
        let rows: &[Row] = &[
            // One worker writes everything: TensorFlow's one-part checkpoint.
            (&[5, 9, 1], &[false, false, false], 1, &[0, 0, 0], &[0]),
            // Largest first to the lightest worker.
            (&[4, 8, 4], &[false, false, false], 2, &[1, 0, 1], &[0, 1]),
            // Ties go to the lower index, equal sizes keep their order.
            (&[3, 3, 3, 3], &[false; 4], 2, &[0, 1, 0, 1], &[0, 1]),
            // The object graph stays with the chief and counts in its load.
            (&[10, 6, 6], &[true, false, false], 2, &[0, 1, 1], &[0, 1]),
            // More workers than tensors: the idle ones write no part.
            (&[7, 2], &[false, false], 4, &[0, 1], &[0, 1]),
            // Only pinned tensors: the chief writes the one part.
            (&[1], &[true], 3, &[0], &[0]),
            // Nothing to write: no part at all.
            (&[], &[], 2, &[], &[]),
            // Zero-byte tensors still get an owner.
            (&[0, 0, 5], &[false; 3], 2, &[1, 1, 0], &[0, 1]),
        ];
        for &(sizes, pinned, workers, owner, parts) in rows {
            let got = shares(sizes, pinned, workers);
            assert_eq!(got.owner, owner, "owners of {sizes:?} over {workers}");
            assert_eq!(got.parts, parts, "parts of {sizes:?} over {workers}");
        }
    }

    #[test]
    fn the_chief_waits_four_times_its_own_part_and_at_least_the_minimum() {
        assert_eq!(wait_bound(1.0, MIN_WAIT), MIN_WAIT);
        assert_eq!(wait_bound(20.0, MIN_WAIT), 80.0);
        assert_eq!(wait_bound(-1.0, 0.2), 0.2);
    }

    #[test]
    fn the_wait_ends_before_the_exit_s_reserve_when_the_notice_has_a_deadline() {
        use Waiter::{Chief, NonChief};
        // (own, deadline, now, exit reserve, waiter, bound)
        type Row = (f64, Option<f64>, f64, f64, Waiter, f64);
        let rows: &[Row] = &[
            // No deadline: the rule of wait_bound, twice it for a non-chief.
            (1.0, None, 100.0, 5.0, Chief, 60.0),
            (20.0, None, 100.0, 5.0, Chief, 80.0),
            (1.0, None, 100.0, 5.0, NonChief, 120.0),
            // A far deadline does not bind.
            (1.0, Some(1000.0), 100.0, 5.0, Chief, 60.0),
            // Kubernetes' 30 s: 30 - 3 s gone - 5 s reserve.
            (1.0, Some(130.0), 103.0, 5.0, Chief, 22.0),
            (1.0, Some(130.0), 103.0, 5.0, NonChief, 22.0),
            // Into the reserve, or past the deadline: no wait at all.
            (1.0, Some(104.0), 100.0, 5.0, Chief, 0.0),
            (1.0, Some(90.0), 100.0, 5.0, NonChief, 0.0),
            // A negative reserve counts as none; a NaN deadline as no deadline.
            (1.0, Some(130.0), 100.0, -1.0, Chief, 30.0),
            (1.0, Some(f64::NAN), 100.0, 5.0, Chief, 60.0),
        ];
        for &(own, deadline, now, reserve, waiter, bound) in rows {
            let got = wait_bound_at(own, MIN_WAIT, deadline, now, reserve, waiter);
            assert_eq!(got, bound, "{waiter:?} own {own} deadline {deadline:?} now {now} reserve {reserve}");
        }
    }

    #[test]
    fn a_merge_is_expected_to_take_the_longest_measured_else_the_chief_s_own_part() {
        assert_eq!(merge_estimate(None, 2.5), 2.5);
        assert_eq!(merge_estimate(Some(7.0), 2.5), 7.0);
        assert_eq!(merge_estimate(Some(0.1), 2.5), 0.1);
        assert_eq!(merge_estimate(Some(f64::NAN), 2.5), 2.5);
        assert_eq!(merge_estimate(None, -1.0), 0.0);
    }

    #[test]
    fn the_merge_starts_only_when_it_fits_before_the_deadline_less_the_exit_s_reserve() {
        use MergeStart::{Keep, Start};
        // (needed, own, deadline, now, exit reserve, decision)
        type Row = (f64, f64, Option<f64>, f64, f64, MergeStart);
        let rows: &[Row] = &[
            // No deadline: it starts, waited for as the chief waits for the parts.
            (2.0, 1.0, None, 100.0, 5.0, Start { bound: 60.0 }),
            (30.0, 1.0, None, 100.0, 5.0, Start { bound: 120.0 }),
            (2.0, 1.0, Some(f64::NAN), 100.0, 5.0, Start { bound: 60.0 }),
            // It fits: 30 - 3 s gone - 5 s reserve = 22 s left, waited for 22 s at most.
            (2.0, 1.0, Some(130.0), 103.0, 5.0, Start { bound: 22.0 }),
            // Exactly what is left still fits.
            (22.0, 1.0, Some(130.0), 103.0, 5.0, Start { bound: 22.0 }),
            // A far deadline does not shorten the wait.
            (2.0, 1.0, Some(1000.0), 100.0, 5.0, Start { bound: 60.0 }),
            // It does not fit: the previous checkpoint stays.
            (22.5, 1.0, Some(130.0), 103.0, 5.0, Keep { needed: 22.5, left: 22.0 }),
            (0.5, 0.5, Some(104.0), 100.0, 5.0, Keep { needed: 0.5, left: 0.0 }),
            // Past the deadline: nothing is left.
            (0.0, 0.0, Some(90.0), 100.0, 5.0, Keep { needed: 0.0, left: 0.0 }),
            // A negative reserve counts as none.
            (29.0, 1.0, Some(130.0), 100.0, -1.0, Start { bound: 30.0 }),
        ];
        for &(needed, own, deadline, now, reserve, want) in rows {
            let got = merge_start(needed, own, MIN_WAIT, deadline, now, reserve);
            assert_eq!(
                got, want,
                "needed {needed} own {own} deadline {deadline:?} now {now} reserve {reserve}"
            );
        }
    }

    #[test]
    fn the_probe_waits_what_is_left_of_its_bound_then_looks_for_the_file() {
        let mut probe = Probe::new(100.0);
        assert_eq!(probe.left(100.0), PROBE_WAIT);
        assert_eq!(probe.left(130.0), PROBE_WAIT - 30.0);
        assert_eq!(probe.left(100.0 + PROBE_WAIT + 5.0), MIN_TIMEOUT, "spent: still one quick ask");
        // Looks every PROBE_LOOK_EVERY until PROBE_LOOK passed since the first look.
        assert_eq!(probe.look(200.0, false), Some(200.0 + PROBE_LOOK_EVERY));
        assert_eq!(
            probe.look(200.0 + PROBE_LOOK - 0.1, false),
            Some(200.0 + PROBE_LOOK),
            "not past the end"
        );
        assert_eq!(probe.look(200.0 + PROBE_LOOK, false), None, "given up");
        let mut probe = Probe::new(0.0);
        assert_eq!(probe.look(1.0, true), None, "seen: done");
    }

    #[test]
    fn a_save_s_waits_end_where_the_bound_set_them() {
        let mut waits = SaveWaits::default();
        assert_eq!(waits.left(0.0), MIN_TIMEOUT, "no end set");
        assert_eq!(waits.part_written(5.0), 0.0, "start not told");
        waits.part_started(10.0);
        assert_eq!(waits.part_written(12.5), 2.5);
        assert_eq!(waits.own(), 2.5);
        waits.wait(12.5, wait_bound(waits.own(), MIN_WAIT));
        assert_eq!(waits.left(12.5), MIN_WAIT);
        assert_eq!(waits.left(42.5), MIN_WAIT - 30.0);
        assert_eq!(waits.left(100.0), MIN_TIMEOUT, "past the end: one quick ask");
        assert_eq!(waits.merge_took(50.0), None, "no merge started");
        waits.merge_started(50.0, 22.0);
        assert_eq!(waits.left(60.0), 12.0, "the merge's bound replaces the parts'");
        assert_eq!(waits.merge_took(53.5), Some(3.5));
        waits.wait(0.0, -1.0);
        assert_eq!(waits.left(0.0), MIN_TIMEOUT, "a negative bound is none");
    }

    /// Bounds that record what they were asked.
    #[derive(Default)]
    struct Fixed {
        merged: Vec<f64>,
    }

    impl Bounds for Fixed {
        fn wait_bound(&mut self, own: f64, _now: f64, waiter: Waiter) -> f64 {
            own + if waiter == Waiter::Chief { 10.0 } else { 20.0 }
        }

        fn merge_start(&mut self, own: f64, _now: f64) -> MergeStart {
            if own < 5.0 {
                MergeStart::Start { bound: 30.0 }
            } else {
                MergeStart::Keep { needed: own, left: 1.0 }
            }
        }

        fn merged(&mut self, took: f64) {
            self.merged.push(took);
        }
    }

    #[test]
    fn a_probe_waits_its_bound_then_looks_with_pauses_until_seen_or_too_long() {
        let b = &mut Fixed::default();
        let mut w = Waits::probe(100.0);
        assert_eq!(
            w.poll(100.0, b),
            Some(SharesAction::Wait {
                timeout: PROBE_WAIT,
                bound: PROBE_WAIT
            })
        );
        assert_eq!(
            w.poll(130.0, b),
            Some(SharesAction::Wait {
                timeout: 30.0,
                bound: PROBE_WAIT
            })
        );
        w.handle(SharesEvent::Token, 131.0, b);
        assert_eq!(w.poll(131.0, b), Some(SharesAction::Look {}));
        w.handle(SharesEvent::Looked { seen: false }, 131.0, b);
        assert_eq!(w.poll(131.1, b), None, "a pause before the next look");
        assert!((w.poll_timeout(131.1) - (PROBE_LOOK_EVERY - 0.1)).abs() < 1e-9);
        assert_eq!(w.poll(131.0 + PROBE_LOOK_EVERY, b), Some(SharesAction::Look {}));
        w.handle(SharesEvent::Looked { seen: true }, 131.5, b);
        assert_eq!(
            w.poll(131.5, b),
            Some(SharesAction::Looked {
                seen: true,
                looked: PROBE_LOOK
            })
        );
        let mut never = Waits::probe(0.0);
        never.handle(SharesEvent::Token, 1.0, b);
        never.handle(SharesEvent::Looked { seen: false }, 1.0, b);
        never.handle(SharesEvent::Looked { seen: false }, 1.0 + PROBE_LOOK, b);
        assert_eq!(
            never.poll(1.0 + PROBE_LOOK, b),
            Some(SharesAction::Looked {
                seen: false,
                looked: PROBE_LOOK
            })
        );
    }

    #[test]
    fn a_save_s_waits_end_at_the_bounds_and_the_merge_is_decided_once_the_parts_are_in() {
        let b = &mut Fixed::default();
        let mut chief = Waits::save(true, 0.0);
        assert_eq!(chief.poll_timeout(0.0), MIN_TIMEOUT, "no end before its part is written");
        chief.handle(SharesEvent::PartWritten, 2.0, b);
        assert_eq!(
            chief.poll(2.0, b),
            Some(SharesAction::Wait {
                timeout: 12.0,
                bound: 12.0
            })
        );
        assert_eq!(chief.poll_timeout(10.0), 4.0);
        chief.handle(SharesEvent::PartsChecked, 4.0, b);
        assert_eq!(chief.poll(4.0, b), Some(SharesAction::Merge { bound: 30.0 }));
        assert_eq!(
            chief.poll(4.0, b),
            Some(SharesAction::Wait {
                timeout: 30.0,
                bound: 30.0
            })
        );
        chief.handle(SharesEvent::Merged, 9.0, b);
        assert_eq!(b.merged, vec![5.0], "the merge's time goes to the bounds");
        chief.handle(SharesEvent::Failed, 9.0, b);
        assert_eq!(chief.poll_timeout(9.0), 10.0, "a removal's own wait");
        let mut slow = Waits::save(true, 0.0);
        slow.handle(SharesEvent::PartWritten, 6.0, b);
        slow.handle(SharesEvent::PartsChecked, 6.0, b);
        assert_eq!(slow.poll(6.0, b), Some(SharesAction::Keep { needed: 6.0, left: 1.0 }));
        let mut other = Waits::save(false, 0.0);
        other.handle(SharesEvent::PartWritten, 1.0, b);
        assert_eq!(other.poll_timeout(1.0), 21.0, "a non-chief's wait for the merge");
        assert_eq!(Rule.wait_bound(1.0, 0.0, Waiter::NonChief), 2.0 * MIN_WAIT);
    }

    #[test]
    fn a_worker_s_part_is_its_place_among_the_writers() {
        let got = shares(&[9, 1], &[false, false], 3);
        assert_eq!(got.part_of(0), Some(0));
        assert_eq!(got.part_of(1), Some(1));
        assert_eq!(got.part_of(2), None);
    }

    #[test]
    fn a_plan_that_cannot_be_made_says_why() {
        assert_eq!(assign(&[1], &[false], 0), Err(SharesError::NoWorkers));
        assert_eq!(assign(&[1, 2], &[false], 2), Err(SharesError::Mismatch { sizes: 2, pinned: 1 }));
    }

    proptest! {
        #[test]
        fn every_tensor_is_written_once_and_no_share_is_much_above_even(
            sizes in proptest::collection::vec(0u64..1_000_000, 0..60),
            workers in 1usize..9,
        ) {
            let pinned = vec![false; sizes.len()];
            let got = shares(&sizes, &pinned, workers);
            prop_assert_eq!(got.owner.len(), sizes.len());
            let mut load = vec![0u64; workers];
            for (t, &w) in got.owner.iter().enumerate() {
                prop_assert!(w < workers);
                load[w] += sizes[t];
            }
            let total: u64 = sizes.iter().sum();
            let largest = sizes.iter().copied().max().unwrap_or(0);
            let even = total.div_ceil(workers as u64);
            prop_assert!(load.iter().all(|&l| l <= even + largest));
            // The same question gets the same answer (every worker asks it).
            prop_assert_eq!(shares(&sizes, &pinned, workers), got.clone());
            // Parts are the writers, in order.
            for (i, &w) in got.parts.iter().enumerate() {
                prop_assert_eq!(got.part_of(w), Some(i));
                prop_assert!(got.owner.contains(&w));
            }
        }
    }
}
