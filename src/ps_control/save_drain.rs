//! The coordinator's wait for its closures before its save, as a state machine:
//! [`SaveDrain`] says each step, `_coordinator/closure_drain.py` performs it (holds the
//! worker threads, waits, moves runs to the queue's head) and reports what it saw.
//!
//! ```text
//!  start ──threads cannot be held (TF's coordinator)──▶ WaitAll(bound) ──▶ over
//!    │held
//!    ▼
//!  WaitIdle(until the bound) ──left: no run count, not indexed, no gap, bound passed──▶ Done(filled)
//!    ▲                         │gaps: queued runs below a finished one
//!    │                         ▼
//!    │                      Promote(gaps) ──none still queued, or no worker to take them──▶ Done(filled)
//!    │                         │found
//!    └──────── granted ─── Grant(found, wait: what is left of the bound)
//! ```
//!
//! A gap is a run a lost worker put back in the queue after later runs had finished
//! ([`super::gap_runs`]): run first, the finished runs are a prefix of the runs and the
//! save's run count says which ran. Every round shares the one bound the save gave.
//!
//! Times are seconds on the caller's clock (the handler's), passed in as `now`.

use super::gap_runs;

/// What the coordinator's save does next.
#[derive(Clone, Debug, PartialEq)]
pub enum SaveStep {
    /// The worker threads cannot be held (TensorFlow's own coordinator): wait for every
    /// scheduled closure, at most `bound` seconds. The drain is over after it.
    WaitAll { bound: f64 },
    /// Wait for every held worker to be idle until `until` (each wait is given
    /// [`SaveDrain::left`]); report what is unfinished with [`SaveDrain::unfinished`].
    WaitIdle { until: f64 },
    /// Find which of these runs are still in the queue and how many workers can take
    /// them; report with [`SaveDrain::promotable`].
    Promote { runs: Vec<u64> },
    /// Move these runs (still queued, sorted) to the queue's head, let the held workers
    /// take that many closures, and wait at most `wait` seconds until they have; report
    /// with [`SaveDrain::granted`].
    Grant { runs: Vec<u64>, wait: f64 },
    /// Over: what the save lets run is known ([`SaveDrain::filled`]).
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    Start,
    Waiting,
    Promoting,
    Granting,
    Over,
}

/// One save's wait for the closures (module docs).
#[derive(Clone, Debug)]
pub struct SaveDrain {
    bound: f64,
    scheduled: Option<u64>,
    end: f64,
    phase: Phase,
    filled: Vec<u64>,
}

impl SaveDrain {
    /// The wait of a save that gives the closures `bound` seconds; `scheduled` is the
    /// handler's run count (None: the gaps are not looked for).
    #[must_use]
    pub fn new(bound: f64, scheduled: Option<u64>) -> Self {
        SaveDrain {
            bound: bound.max(0.0),
            scheduled,
            end: 0.0,
            phase: Phase::Start,
            filled: Vec::new(),
        }
    }

    /// The first step: `held` when every worker thread was held.
    pub fn start(&mut self, held: bool, now: f64) -> SaveStep {
        if self.phase != Phase::Start {
            return self.over();
        }
        self.end = now + self.bound;
        if !held {
            self.phase = Phase::Over;
            return SaveStep::WaitAll { bound: self.bound };
        }
        self.phase = Phase::Waiting;
        SaveStep::WaitIdle { until: self.end }
    }

    /// Seconds left of the bound at `now` (never below 0): each wait's timeout.
    #[must_use]
    pub fn left(&self, now: f64) -> f64 {
        (self.end - now).max(0.0)
    }

    /// What the wait left: the handler's runs still queued and in flight, each by its
    /// index, or None when they are not all known by their index (a queue that cannot
    /// list its closures, a worker whose closure has no run index).
    pub fn unfinished(&mut self, runs: Option<(&[u64], &[u64])>, now: f64) -> SaveStep {
        if self.phase != Phase::Waiting {
            return self.over();
        }
        let (Some(scheduled), Some((queued, in_flight))) = (self.scheduled, runs) else {
            return self.over();
        };
        let gaps = gap_runs(scheduled, queued, in_flight);
        if gaps.is_empty() || now >= self.end {
            return self.over();
        }
        self.phase = Phase::Promoting;
        SaveStep::Promote { runs: gaps }
    }

    /// Of the gaps, `found` are still queued and `takers` workers are not lost.
    pub fn promotable(&mut self, found: &[u64], takers: usize, now: f64) -> SaveStep {
        if self.phase != Phase::Promoting {
            return self.over();
        }
        if found.is_empty() || takers == 0 {
            return self.over();
        }
        let mut runs = found.to_vec();
        runs.sort_unstable();
        runs.dedup();
        self.filled.extend(&runs);
        self.phase = Phase::Granting;
        SaveStep::Grant {
            runs,
            wait: self.left(now),
        }
    }

    /// The wait for the granted runs to be taken ended: the workers are waited for
    /// again, until the same bound.
    pub fn granted(&mut self) -> SaveStep {
        if self.phase != Phase::Granting {
            return self.over();
        }
        self.phase = Phase::Waiting;
        SaveStep::WaitIdle { until: self.end }
    }

    /// The runs the save let run first, sorted in each round, in the order granted.
    #[must_use]
    pub fn filled(&self) -> &[u64] {
        &self.filled
    }

    /// The drain is over (also for a report out of turn: a caller's bug ends it,
    /// and the save goes on with what it has).
    fn over(&mut self) -> SaveStep {
        self.phase = Phase::Over;
        SaveStep::Done
    }
}

/// How many looks of [`super::DRAIN_SETTLE_LOOK`] seconds the save gives a worker that
/// was neither idle nor running a closure at the bound (between two closures, in the
/// queue's get): two of its get slices (`get_slice`), and one more.
#[must_use]
pub fn settle_looks(get_slice: f64) -> u32 {
    let looks = (2.0 * get_slice.max(0.0) / super::DRAIN_SETTLE_LOOK).floor();
    // A get slice is a fraction of a second: far below u32::MAX looks.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let looks = looks.min(f64::from(u32::MAX - 1)) as u32;
    looks + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: f64 = 100.0;

    #[test]
    fn a_coordinator_that_cannot_hold_waits_for_everything_once() {
        let mut d = SaveDrain::new(5.0, Some(10));
        assert_eq!(d.start(false, NOW), SaveStep::WaitAll { bound: 5.0 });
        assert_eq!(d.unfinished(Some((&[], &[])), NOW), SaveStep::Done);
        assert!(d.filled().is_empty());
    }

    #[test]
    fn no_gap_ends_the_drain_after_one_wait() {
        let mut d = SaveDrain::new(5.0, Some(10));
        assert_eq!(d.start(true, NOW), SaveStep::WaitIdle { until: NOW + 5.0 });
        // Runs 8 and 9 unfinished: the finished runs 0..8 are a prefix.
        assert_eq!(d.unfinished(Some((&[9], &[8])), NOW + 1.0), SaveStep::Done);
        assert!(d.filled().is_empty());
    }

    #[test]
    fn a_gap_is_promoted_granted_and_waited_for_within_the_same_bound() {
        let mut d = SaveDrain::new(5.0, Some(10));
        d.start(true, NOW);
        // Run 3 was put back by a lost worker after 4..9 finished.
        assert_eq!(d.unfinished(Some((&[3], &[])), NOW + 1.0), SaveStep::Promote { runs: vec![3] });
        assert_eq!(d.promotable(&[3], 2, NOW + 1.5), SaveStep::Grant { runs: vec![3], wait: 3.5 });
        assert_eq!(d.granted(), SaveStep::WaitIdle { until: NOW + 5.0 });
        assert_eq!(d.left(NOW + 2.0), 3.0);
        assert_eq!(d.unfinished(Some((&[], &[])), NOW + 2.0), SaveStep::Done);
        assert_eq!(d.filled(), &[3]);
    }

    /// One round: the report of what is unfinished (`runs` at `now`), then, if it
    /// asks, of what is promotable (`found`, `takers`); the steps returned.
    fn round(scheduled: Option<u64>, runs: Option<(&[u64], &[u64])>, now: f64, found: &[u64], takers: usize) -> (SaveStep, SaveStep) {
        let mut d = SaveDrain::new(5.0, scheduled);
        d.start(true, NOW);
        let first = d.unfinished(runs, now);
        let second = if first == SaveStep::Done {
            SaveStep::Done
        } else {
            d.promotable(found, takers, now)
        };
        (first, second)
    }

    /// Each way a round ends.
    #[test]
    fn the_round_table() {
        use SaveStep::Done;
        let promote = |runs: &[u64]| SaveStep::Promote { runs: runs.to_vec() };
        let grant = |runs: &[u64], wait: f64| SaveStep::Grant { runs: runs.to_vec(), wait };
        // No run count: gaps are not looked for.
        assert_eq!(round(None, Some((&[3], &[])), NOW, &[], 0), (Done, Done));
        // Runs not all known by index.
        assert_eq!(round(Some(10), None, NOW, &[], 0), (Done, Done));
        // The bound passed: no more rounds.
        assert_eq!(round(Some(10), Some((&[3], &[])), NOW + 5.0, &[], 0), (Done, Done));
        // The gap left the queue meanwhile.
        assert_eq!(round(Some(10), Some((&[3], &[])), NOW, &[], 2), (promote(&[3]), Done));
        // No worker left to take it.
        assert_eq!(round(Some(10), Some((&[3], &[])), NOW, &[3], 0), (promote(&[3]), Done));
        // Two gaps, one found: that one is granted, with what is left of the bound.
        let (q, f): (&[u64], &[u64]) = (&[5, 2], &[9]);
        assert_eq!(
            round(Some(10), Some((q, f)), NOW + 1.0, &[5], 1),
            (promote(&[2, 5]), grant(&[5], 4.0))
        );
        // Both found, reported out of order: granted sorted, once each.
        assert_eq!(
            round(Some(10), Some((q, f)), NOW, &[5, 2, 5], 3),
            (promote(&[2, 5]), grant(&[2, 5], 5.0))
        );
    }

    #[test]
    fn a_report_out_of_turn_ends_the_drain() {
        let mut d = SaveDrain::new(5.0, Some(10));
        assert_eq!(d.granted(), SaveStep::Done);
        let mut d = SaveDrain::new(5.0, Some(10));
        d.start(true, NOW);
        assert_eq!(d.promotable(&[3], 1, NOW), SaveStep::Done);
        assert_eq!(d.start(true, NOW), SaveStep::Done);
    }

    #[test]
    fn a_negative_bound_is_no_wait() {
        let mut d = SaveDrain::new(-1.0, Some(10));
        assert_eq!(d.start(false, NOW), SaveStep::WaitAll { bound: 0.0 });
        assert_eq!(d.left(NOW), 0.0);
    }

    #[test]
    fn a_settling_worker_gets_two_get_slices_of_looks_and_one_more() {
        assert_eq!(settle_looks(0.5), 21);
        assert_eq!(settle_looks(0.0), 1);
        assert_eq!(settle_looks(-1.0), 1);
    }
}
