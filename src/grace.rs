//! The grace-period planner: when the leader must call the final round.
//!
//! With a grace period, the cluster saves once right after the notice, keeps
//! training, and saves a second time as late as it safely can. Only the
//! leader (the worker that won `TERMINATED_WORKER`) plans; it checks before
//! each of its steps whether to publish `LAST_RUN_TO_CHECKPOINT` now.
//!
//! # What a final round costs
//!
//! If the leader publishes before step `k` at time `t`, the final save ends at
//! about `t + agreement + step + save`: the acknowledgements, the step `k`
//! that everyone still runs, and the save before step `k + 1`. If it does not
//! publish now, its next chance comes one step later. So it must publish when
//!
//! ```text
//! now + 2 × step + agreement + save ≥ deadline
//! ```
//!
//! with `step` a high percentile (p95) of this process's recent step
//! durations, `save` the longest save measured (the first round always
//! measures one) times a safety factor, and `agreement` the longest measured
//! publish-to-last-acknowledgement time. Before this process has saved, a
//! restore of the same checkpoint at start stands in for the save (the same
//! tensors, read rather than written): a first estimate, so that a notice that
//! comes before any save is still told whether a save fits.
//!
//! TensorFlow instead publishes at `notice + grace − 6 × mean step`: it
//! ignores the save time, so a save longer than a few steps ends after the
//! deadline, and its mean divides by the total run count including the runs
//! restored from a checkpoint, so after a restart the estimate is near zero.
//! Here only steps timed in this process count, and only the last
//! [`WINDOW`] of them, so a slowdown shows at once.

use crate::notice::Notice;

/// How many recent step durations the planner keeps.
pub const WINDOW: usize = 128;
/// The percentile of step durations planned for.
pub const STEP_PERCENTILE: f64 = 0.95;
/// The final save is planned as this many times the longest save measured:
/// it writes the same tensors, but file-system latency varies.
pub const SAVE_SAFETY: f64 = 1.5;
/// Steps between a decision not to publish and the end of the final save
/// (one until the next check, one more that every worker runs after the
/// final round is published).
pub const STEPS_AHEAD: f64 = 2.0;
/// Fixed allowance, in seconds, for scheduling jitter and for a deadline that is an
/// estimate: a platform's timer starts before the signal or the answer that
/// announces it reaches the worker (under SLURM, a SIGTERM came about 0.3 s after
/// the `KillWait` it starts had begun, on a loaded machine).
pub const SLACK: f64 = 1.0;

/// Seconds kept, by default, between the end of the last save and the deadline for
/// the process's own exit: the exit code's `SystemExit` unwinds the training loop,
/// TensorFlow tears down (its collective and coordination-service clients under
/// MultiWorkerMirroredStrategy), the interpreter ends. A single worker's teardown took
/// more than a second on a GCE VM; a Kubernetes pod whose process is still in its exit
/// at the deadline is killed with 137, not the exit code. Configured with
/// `TF_FAILURE_HANDLING_EXIT_RESERVE` (docs/how-it-works.md, the variables' table of
/// "Where notices come from").
pub const EXIT_RESERVE: f64 = 5.0;

/// Seconds before the deadline at which a process still in its exit after the last
/// save is ended by the exit guard, with the exit code the records already hold
/// ([`exit_guard_delay`]): the same allowance as [`SLACK`], for a deadline that is
/// an estimate (the platform's timer started before the notice reached the worker).
pub const EXIT_GUARD_LEAD: f64 = 1.0;

/// How long from `now` the exit guard waits before it ends a process that is still
/// in its exit: until [`EXIT_GUARD_LEAD`] before `deadline`, the moment the platform
/// stated it kills the process ([`crate::notice::Notice::kill`],
/// `Protocol::kill_deadline`). None when it stated none (a grace period alone, an
/// assumed deadline such as Kubernetes' default grace period, SLURM without a known
/// `KillWait`: nothing is known to kill the process then, and `_exit` would cut short
/// an exit, its `atexit` handlers and logging's flush, for a guess) or when that moment
/// has passed (the guard would decide at once, before the exit has begun, which it
/// cannot tell from a process that caught the `SystemExit` and trains on).
///
/// The reserve ([`EXIT_RESERVE`]) plans the exit; the guard is for the exit that runs
/// past the plan: on a loaded host TensorFlow's teardown under
/// MultiWorkerMirroredStrategy (its collective and coordination-service clients, which
/// wait for each other) ran past the reserve after the last save (14 s, by hand, at load 8), and a
/// Kubernetes pod still in it at the deadline ends with 137, not the exit code its
/// `podFailurePolicy` matches.
#[must_use]
pub fn exit_guard_delay(deadline: Option<f64>, now: f64) -> Option<f64> {
    let delay = deadline? - EXIT_GUARD_LEAD - now;
    (delay > 0.0).then_some(delay)
}

/// Seconds between a notice and the machine's end, before the handler has been
/// told: none, TensorFlow's default (`TerminationConfig(grace_period=None)` on
/// Borg and every platform that announces no lead time: save at once, then exit).
pub const DEFAULT_GRACE_PERIOD: f64 = 0.0;

/// What still fits before a deadline, as measured (see [`GracePlanner::fit`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fit {
    /// The first save and, with a grace period, a final one.
    Both,
    /// One save only: with a grace period, the first save is the last.
    OneSave,
    /// Not even one save ends before the deadline: the fastest path (one save,
    /// at once) is taken all the same, and the worker says so at the notice.
    Neither,
    /// Nothing has been timed that a save's time could be judged from (no save in
    /// this process, no restore timed at start): the worker says so at the notice
    /// rather than report a fit from an estimate of 0.
    Unknown,
}

/// Recent step, save and agreement durations of one worker.
#[derive(Debug, Clone)]
pub struct GracePlanner {
    steps: [f64; WINDOW],
    len: usize,
    next: usize,
    longest_save: Option<f64>,
    restore: Option<f64>,
    longest_agreement: f64,
    exit_reserve: f64,
}

impl Default for GracePlanner {
    fn default() -> Self {
        Self::new()
    }
}

impl GracePlanner {
    /// A planner with no measurements.
    #[must_use]
    pub fn new() -> Self {
        GracePlanner {
            steps: [0.0; WINDOW],
            len: 0,
            next: 0,
            longest_save: None,
            restore: None,
            longest_agreement: 0.0,
            exit_reserve: EXIT_RESERVE,
        }
    }

    /// A planner that keeps nothing for the exit: the tests of everything else.
    #[cfg(test)]
    pub(crate) fn without_exit_reserve() -> Self {
        let mut planner = Self::new();
        planner.exit_reserve = 0.0;
        planner
    }

    /// Sets the seconds kept for the process's exit after the last save
    /// ([`EXIT_RESERVE`] by default; negative or NaN values are ignored).
    pub fn set_exit_reserve(&mut self, secs: f64) {
        if secs.is_finite() && secs >= 0.0 {
            self.exit_reserve = secs;
        }
    }

    /// The seconds kept for the process's exit after the last save.
    #[must_use]
    pub fn exit_reserve(&self) -> f64 {
        self.exit_reserve
    }

    /// Records one step's duration in seconds (negative or NaN values, from a
    /// clock step, are ignored).
    pub fn record_step(&mut self, secs: f64) {
        if secs.is_nan() || secs < 0.0 {
            return;
        }
        self.steps[self.next] = secs;
        self.next = (self.next + 1) % WINDOW;
        self.len = (self.len + 1).min(WINDOW);
    }

    /// Records one checkpoint save's duration in seconds.
    pub fn record_save(&mut self, secs: f64) {
        if secs >= 0.0 {
            self.longest_save = Some(self.longest_save.map_or(secs, |s| s.max(secs)));
        }
    }

    /// Records how long the restore of the checkpoint at start took: the save
    /// estimate until a save is measured.
    pub fn record_restore(&mut self, secs: f64) {
        if secs >= 0.0 {
            self.restore = Some(secs);
        }
    }

    /// The save time planned for: the longest save measured, else the restore's
    /// time, else 0.
    #[must_use]
    pub fn save_estimate(&self) -> f64 {
        self.longest_save.or(self.restore).unwrap_or(0.0)
    }

    /// Whether a save's time is known (a save measured, or a restore at start).
    #[must_use]
    pub fn save_timed(&self) -> bool {
        self.longest_save.is_some() || self.restore.is_some()
    }

    /// Records how long one publish waited for every acknowledgement.
    pub fn record_agreement(&mut self, secs: f64) {
        if secs >= 0.0 {
            self.longest_agreement = self.longest_agreement.max(secs);
        }
    }

    /// Number of step durations held.
    #[must_use]
    pub fn samples(&self) -> usize {
        self.len
    }

    /// The longest save measured so far.
    #[must_use]
    pub fn longest_save(&self) -> Option<f64> {
        self.longest_save
    }

    /// The [`STEP_PERCENTILE`] of the recent step durations (0 with none).
    #[must_use]
    pub fn step_estimate(&self) -> f64 {
        if self.len == 0 {
            return 0.0;
        }
        let mut recent: Vec<f64> = self.steps[..self.len].to_vec();
        recent.sort_by(f64::total_cmp);
        // Nearest-rank percentile: the smallest sample with at least 95 % of
        // the samples at or below it.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, clippy::cast_precision_loss)]
        let rank = ((STEP_PERCENTILE * self.len as f64).ceil() as usize).clamp(1, self.len);
        recent[rank - 1]
    }

    /// Seconds the final round needs between the decision and the end of the
    /// process: the steps, the acknowledgements, the final save and the exit.
    #[must_use]
    pub fn margin(&self) -> f64 {
        STEPS_AHEAD * self.step_estimate() + self.longest_agreement + SAVE_SAFETY * self.save_estimate() + SLACK + self.exit_reserve
    }

    /// When the machine goes away: the notice's own deadline if it has one
    /// and it is earlier, else `notice.at + grace_period`.
    #[must_use]
    pub fn deadline(notice: Notice, grace_period: f64) -> f64 {
        let by_grace = notice.at + grace_period;
        notice.deadline.map_or(by_grace, |d| d.min(by_grace))
    }

    /// Whether the user's grace period is what ends the countdown: no platform
    /// deadline at or before `notice.at + grace_period` (a platform whose grace
    /// period is its own deadline, SLURM's `KillWait` say, binds by its deadline).
    /// Then the cluster saves twice,
    /// as TensorFlow does: the estimates may move the final round earlier, never
    /// merge it into the first. Only a platform deadline tighter than anything
    /// TensorFlow knows of lets the first save be the last.
    #[must_use]
    pub fn grace_binds(notice: Notice, grace_period: f64) -> bool {
        grace_period > 0.0 && notice.deadline.map_or(true, |d| d > notice.at + grace_period)
    }

    /// The latest moment at which publishing the final round still lets the
    /// final save end before the deadline.
    #[must_use]
    pub fn latest_publish(&self, notice: Notice, grace_period: f64) -> f64 {
        Self::deadline(notice, grace_period) - self.margin()
    }

    /// How long the coordinator of a ParameterServerStrategy cluster may let
    /// the closures in flight finish before its save: until the deadline, less
    /// the longest save measured (never below 0). None when the notice set no
    /// deadline (the platform named none and there is no grace period): the
    /// caller's peer timeout bounds the wait then.
    #[must_use]
    pub fn drain_bound(&self, notice: Notice, grace_period: f64, now: f64) -> Option<f64> {
        if notice.deadline.is_none() && grace_period <= 0.0 {
            return None;
        }
        Some((Self::deadline(notice, grace_period) - now - self.save_estimate() - self.exit_reserve).max(0.0))
    }

    /// Seconds the first round still takes from a check `steps` steps before
    /// its save: those steps and the save. A final round that would be due
    /// that much later is due now, at the first round's step (one save).
    #[must_use]
    pub fn first_round_cost(&self, steps: u64) -> f64 {
        #[allow(clippy::cast_precision_loss)]
        let steps = steps as f64;
        steps * self.step_estimate() + SAVE_SAFETY * self.save_estimate()
    }

    /// What fits before `notice`'s deadline from `now`: one save needs a step and
    /// the save (the [`save_estimate`](Self::save_estimate), times
    /// [`SAVE_SAFETY`]) and the slack; two need the first round's step and save
    /// and the final round's [`margin`](Self::margin), which holds its own slack.
    /// That is the resolver's rule: with less left, it agrees both rounds at the
    /// first round's step (one save) -- unless the user's grace period binds
    /// ([`grace_binds`](Self::grace_binds)): both saves are then made, as TensorFlow
    /// makes them, and the fit is [`Fit::Both`] whatever is left. With no save's
    /// time known ([`save_timed`](Self::save_timed)) the fit is [`Fit::Unknown`].
    /// Returns the fit, the seconds left and the seconds the fit it falls short of
    /// would need.
    #[must_use]
    pub fn fit(&self, notice: Notice, grace_period: f64, now: f64) -> (Fit, f64, f64) {
        // Without a grace period only the platform's deadline bounds the one save.
        let deadline = if grace_period > 0.0 {
            Self::deadline(notice, grace_period)
        } else {
            notice.deadline.unwrap_or(f64::INFINITY)
        };
        let left = deadline - now;
        let one = self.first_round_cost(1) + SLACK + self.exit_reserve;
        let both = self.first_round_cost(1) + self.margin();
        if Self::grace_binds(notice, grace_period) {
            (Fit::Both, left, both)
        } else if !self.save_timed() {
            (Fit::Unknown, left, one)
        } else if left < one {
            (Fit::Neither, left, one)
        } else if grace_period > 0.0 && left < both {
            (Fit::OneSave, left, both)
        } else if grace_period > 0.0 {
            (Fit::Both, left, both)
        } else {
            (Fit::OneSave, left, one)
        }
    }

    /// Whether the leader must publish the final round before this step.
    #[must_use]
    pub fn final_round_due(&self, notice: Notice, grace_period: f64, now: f64) -> bool {
        now >= self.latest_publish(notice, grace_period)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(at: f64) -> Notice {
        Notice::stated(at, None)
    }

    #[test]
    fn a_fit_is_never_judged_from_an_estimate_of_zero() {
        let mut p = GracePlanner::without_exit_reserve();
        p.record_step(0.1);
        let n = Notice::stated(0.0, Some(30.0));
        assert_eq!(p.fit(n, 0.0, 0.0).0, Fit::Unknown, "nothing timed");
        assert_eq!(p.fit(n, 60.0, 0.0).0, Fit::Unknown, "nothing timed, a platform deadline");
        assert_eq!(p.fit(n, 20.0, 0.0).0, Fit::Both, "the user's grace period binds: both");
        p.record_restore(40.0);
        assert_eq!(p.fit(n, 0.0, 0.0).0, Fit::Neither, "a restore timed stands in for a save");
        let mut q = GracePlanner::without_exit_reserve();
        q.record_save(1.0);
        assert_eq!(q.fit(n, 0.0, 0.0).0, Fit::OneSave);
    }

    #[test]
    fn empty_planner_publishes_just_before_the_deadline() {
        let p = GracePlanner::without_exit_reserve();
        assert_eq!(p.step_estimate(), 0.0);
        assert!((p.latest_publish(notice(100.0), 10.0) - (110.0 - SLACK)).abs() < 1e-9);
        assert!(!p.final_round_due(notice(100.0), 10.0, 108.9));
        assert!(p.final_round_due(notice(100.0), 10.0, 109.0));
    }

    #[test]
    fn save_time_moves_the_final_round_earlier() {
        let mut p = GracePlanner::without_exit_reserve();
        for _ in 0..50 {
            p.record_step(0.05);
        }
        p.record_save(2.0);
        p.record_agreement(0.01);
        // margin = 2 × 0.05 + 0.01 + 1.5 × 2.0 + 1.0 = 4.11
        assert!((p.margin() - 4.11).abs() < 1e-9);
        assert!(!p.final_round_due(notice(0.0), 10.0, 5.8));
        assert!(p.final_round_due(notice(0.0), 10.0, 5.9));
    }

    #[test]
    fn fit_says_what_still_fits_before_the_deadline() {
        let mut p = GracePlanner::without_exit_reserve();
        for _ in 0..20 {
            p.record_step(0.1);
        }
        p.record_save(2.0);
        // One save: 0.1 + 1.5 × 2 + 1 = 4.1 s; both: 0.1 + 1.5 × 2 + margin (0.2 + 3 + 1)
        // = 7.3 s.
        let n = |deadline| Notice::stated(0.0, Some(deadline));
        assert_eq!(p.fit(n(100.0), 60.0, 0.0).0, Fit::Both);
        assert_eq!(p.fit(n(7.5), 60.0, 0.0).0, Fit::Both);
        let (fit, left, needed) = p.fit(n(7.0), 60.0, 0.0);
        assert_eq!(fit, Fit::OneSave);
        assert!((left - 7.0).abs() < 1e-9 && (needed - 7.3).abs() < 1e-9);
        let (fit, left, needed) = p.fit(n(4.0), 60.0, 0.0);
        assert_eq!(fit, Fit::Neither);
        assert!((left - 4.0).abs() < 1e-9 && (needed - 4.1).abs() < 1e-9);
        // Without a grace period one save is all there is.
        assert_eq!(p.fit(n(100.0), 0.0, 0.0).0, Fit::OneSave);
        assert_eq!(p.fit(n(4.0), 0.0, 0.0).0, Fit::Neither);
    }

    #[test]
    fn percentile_follows_the_slow_tail_not_the_mean() {
        let mut p = GracePlanner::without_exit_reserve();
        for i in 0..100 {
            p.record_step(if i % 10 == 0 { 1.0 } else { 0.1 });
        }
        // 10 % of steps take 1 s: the p95 is 1 s, the mean only 0.19 s.
        assert_eq!(p.step_estimate(), 1.0);
    }

    #[test]
    fn window_forgets_old_steps() {
        let mut p = GracePlanner::without_exit_reserve();
        for _ in 0..WINDOW {
            p.record_step(5.0);
        }
        for _ in 0..WINDOW {
            p.record_step(0.01);
        }
        assert_eq!(p.samples(), WINDOW);
        assert_eq!(p.step_estimate(), 0.01);
    }

    #[test]
    fn negative_and_nan_durations_are_ignored() {
        let mut p = GracePlanner::without_exit_reserve();
        p.record_step(-1.0);
        p.record_step(f64::NAN);
        p.record_save(-3.0);
        assert_eq!(p.samples(), 0);
        assert_eq!(p.longest_save(), None);
    }

    #[test]
    fn platform_deadline_wins_when_earlier() {
        let n = Notice::stated(0.0, Some(30.0));
        assert_eq!(GracePlanner::deadline(n, 3600.0), 30.0);
        assert_eq!(GracePlanner::deadline(n, 10.0), 10.0);
    }

    #[test]
    fn drain_bound_is_unset_without_a_deadline_or_a_grace_period() {
        assert_eq!(GracePlanner::without_exit_reserve().drain_bound(notice(5.0), 0.0, 6.0), None);
    }

    #[test]
    fn drain_bound_leaves_the_longest_save_before_the_deadline() {
        let mut p = GracePlanner::without_exit_reserve();
        let n = Notice::stated(0.0, Some(30.0));
        assert_eq!(p.drain_bound(n, 60.0, 10.0), Some(20.0));
        p.record_save(4.0);
        assert_eq!(p.drain_bound(n, 60.0, 10.0), Some(16.0));
        // A grace period shorter than the platform's deadline is the deadline.
        assert_eq!(p.drain_bound(n, 12.0, 2.0), Some(6.0));
        // Without a platform deadline, the grace period's end.
        assert_eq!(p.drain_bound(notice(0.0), 12.0, 2.0), Some(6.0));
    }

    #[test]
    fn drain_bound_without_a_grace_period_is_the_notice_itself() {
        // No grace period: the save is due at the notice, whatever the
        // platform's own deadline (`deadline`), so no closure is waited for.
        let n = Notice::stated(0.0, Some(30.0));
        assert_eq!(GracePlanner::without_exit_reserve().drain_bound(n, 0.0, 1.0), Some(0.0));
    }

    #[test]
    fn drain_bound_is_never_negative() {
        let mut p = GracePlanner::without_exit_reserve();
        p.record_save(50.0);
        let n = Notice::stated(0.0, Some(30.0));
        assert_eq!(p.drain_bound(n, 60.0, 10.0), Some(0.0));
        assert_eq!(p.drain_bound(n, 60.0, 40.0), Some(0.0));
    }

    #[test]
    fn longest_save_is_kept() {
        let mut p = GracePlanner::without_exit_reserve();
        p.record_save(1.0);
        p.record_save(0.5);
        assert_eq!(p.longest_save(), Some(1.0));
    }

    #[test]
    fn the_restore_stands_in_for_the_save_until_one_is_measured() {
        let mut p = GracePlanner::without_exit_reserve();
        for _ in 0..20 {
            p.record_step(0.1);
        }
        let n = Notice::stated(0.0, Some(10.0));
        // Nothing measured: not judged (an estimate of 0 would say too much fits).
        assert_eq!(p.fit(n, 0.0, 0.0).0, Fit::Unknown);
        p.record_restore(8.0);
        assert!((p.save_estimate() - 8.0).abs() < 1e-9);
        // 0.1 + 1.5 × 8 + 1 = 13.1 s needed, 10 s left: said at the notice.
        let (fit, left, needed) = p.fit(n, 0.0, 0.0);
        assert_eq!(fit, Fit::Neither);
        assert!((left - 10.0).abs() < 1e-9 && (needed - 13.1).abs() < 1e-9);
        assert!((p.drain_bound(n, 60.0, 0.0).unwrap() - 2.0).abs() < 1e-9);
        // A measured save replaces it, shorter or longer.
        p.record_save(2.0);
        assert!((p.save_estimate() - 2.0).abs() < 1e-9);
        assert_eq!(p.fit(n, 0.0, 0.0).0, Fit::OneSave);
        p.record_restore(-1.0);
        assert!((p.save_estimate() - 2.0).abs() < 1e-9);
    }
}

#[cfg(test)]
mod exit_reserve_tests {
    use super::*;

    #[test]
    fn the_final_round_keeps_the_exit_reserve_before_the_deadline() {
        let mut p = GracePlanner::new();
        for _ in 0..20 {
            p.record_step(0.5);
        }
        p.record_save(2.0);
        // The GCE story: the VM goes 30 s after instance/preempted; a grace period of
        // an hour. The final round's process must have ended by then.
        let n = Notice::stated(0.0, Some(30.0));
        let publish = p.latest_publish(n, 3600.0);
        let save_ends = publish + STEPS_AHEAD * 0.5 + SAVE_SAFETY * 2.0;
        assert!((30.0 - save_ends - SLACK - EXIT_RESERVE).abs() < 1e-9, "{save_ends}");
        // Kubernetes' 30 s: one save at once fits only with its exit.
        assert_eq!(p.fit(n, 0.0, 24.0).0, Fit::Neither, "6 s left: save, slack and exit do not fit");
        assert_eq!(p.fit(n, 0.0, 20.0).0, Fit::OneSave);
        p.set_exit_reserve(0.0);
        assert_eq!(p.fit(n, 0.0, 24.0).0, Fit::OneSave, "configured away");
        p.set_exit_reserve(-1.0);
        assert_eq!(p.exit_reserve(), 0.0, "a negative reserve is ignored");
    }

    #[test]
    fn the_exit_guard_waits_until_its_lead_before_the_deadline() {
        // (deadline, now) -> delay
        let rows: [(Option<f64>, f64, Option<f64>); 6] = [
            (Some(30.0), 24.0, Some(30.0 - EXIT_GUARD_LEAD - 24.0)),
            (Some(30.0), 0.0, Some(30.0 - EXIT_GUARD_LEAD)),
            (Some(30.0), 30.0 - EXIT_GUARD_LEAD, None),
            (Some(30.0), 29.5, None),
            (Some(30.0), 31.0, None),
            (None, 0.0, None),
        ];
        for (deadline, now, want) in rows {
            let got = exit_guard_delay(deadline, now);
            match (got, want) {
                (Some(g), Some(w)) => assert!((g - w).abs() < 1e-9, "{deadline:?} {now}: {g} != {w}"),
                (g, w) => assert_eq!(g, w, "{deadline:?} {now}"),
            }
        }
        // The guard acts inside the reserve the plan keeps.
        const { assert!(EXIT_GUARD_LEAD < EXIT_RESERVE) };
    }

    #[test]
    fn the_ps_drain_leaves_the_save_and_the_exit() {
        let mut p = GracePlanner::new();
        p.record_save(2.0);
        let n = Notice::stated(0.0, Some(30.0));
        assert!((p.drain_bound(n, 60.0, 10.0).unwrap() - (30.0 - 10.0 - 2.0 - EXIT_RESERVE)).abs() < 1e-9);
    }
}
