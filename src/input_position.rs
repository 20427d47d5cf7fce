//! Where an input resumes after a restart: the iterator and batch the interrupted run
//! would have trained from next.
//!
//! A position is saved as the iteration (the `n`-th iterator made of the input,
//! counted across restarts) in use at the agreed step and the batches it had given.
//! The restart makes iterators of the same input the way the loop does; [`resume`]
//! says which iteration and batch its first iterator used for training must be, and
//! how many earlier iterators must be made (unpulled) first, so that a seeded
//! shuffle's `n`-th order is the `n`-th iterator's again.
//!
//! The one judgement is whether the saved iterator was used up: a save at an epoch's
//! last step is followed, in a loop that makes an iterator per epoch, by a new
//! iterator, not by the rest of the saved one. The loop says so when it knows
//! (`fit`'s way of making iterators); otherwise the iterator's length decides: the
//! input's own, the loop's steps per epoch, or the previous iterator's.

/// Seconds between the lines logged while a resumed input replays to its
/// position.
pub const REPLAY_PROGRESS_EVERY: f64 = 5.0;
/// Seconds the making of earlier iterators (a resume's advance) must take to be
/// logged: a quick one says nothing.
pub const ADVANCE_LOGGED_AFTER: f64 = 1.0;

/// What a [`Timing`] times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timed {
    /// A resumed iterator replaying its skipped batches: a line every
    /// [`REPLAY_PROGRESS_EVERY`] until the first resumed step.
    Replay,
    /// The making of earlier iterators before the resumed one: one line at its end,
    /// when it took longer than [`ADVANCE_LOGGED_AFTER`].
    Advance,
}

/// The timing of a resume's slow parts, and when each is logged. Never reads a
/// clock: it started at the `now` given to [`Timing::new`], and each call takes `now`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    timed: Timed,
    started: f64,
    /// When the next line is due.
    next: f64,
}

impl Timing {
    /// `timed` starts at `now`.
    #[must_use]
    pub fn new(timed: Timed, now: f64) -> Self {
        let after = match timed {
            Timed::Replay => REPLAY_PROGRESS_EVERY,
            Timed::Advance => ADVANCE_LOGGED_AFTER,
        };
        Timing {
            timed,
            started: now,
            next: now + after,
        }
    }

    /// Seconds from `now` until the next line is due (0: it is).
    #[must_use]
    pub fn poll_timeout(&self, now: f64) -> f64 {
        (self.next - now).max(0.0)
    }

    /// The seconds since the start when a line is due at `now` (a replay's next
    /// line is then due [`REPLAY_PROGRESS_EVERY`] later); None when none is. An
    /// advance that ends at `now` is logged when it took longer than
    /// [`ADVANCE_LOGGED_AFTER`].
    pub fn poll(&mut self, now: f64) -> Option<f64> {
        let so_far = now - self.started;
        match self.timed {
            Timed::Replay if now >= self.next => {
                self.next = now + REPLAY_PROGRESS_EVERY;
                Some(so_far)
            }
            Timed::Advance if now > self.next => Some(so_far),
            _ => None,
        }
    }
}

/// The position a checkpoint holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Saved {
    /// The iteration in use (`-1`: none was made before the save).
    pub iteration: i64,
    /// Batches it had given.
    pub batches: u64,
    /// Batches the iterator before it gave (0: none, or unknown).
    pub previous: u64,
}

/// What the resuming loop is known to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resuming {
    /// Batches one iterator yields on this worker (None: unknown or infinite).
    pub per_iteration: Option<u64>,
    /// Steps the loop takes from one iterator before making the next (None: not said).
    pub steps_per_iteration: Option<u64>,
    /// Whether the loop goes on with a new iterator (None: the lengths above decide).
    pub new_iteration: Option<bool>,
    /// Which iterator of this process (from 0) is the first the loop trains from.
    pub first_used: u64,
}

crate::wire! {
    /// What the restart does with its input.
    pub enum InputResume via input_resume_decl {
        /// Nothing saved to resume: the input starts at its first element.
        Fresh {},
        /// The first iterator trained from is iteration `iteration` from batch
        /// `batches`; `advance` iterators are made and dropped before this process's
        /// first.
        At { iteration: u64, batches: u64, advance: u64 },
        /// This process makes more iterators before training than the interrupted run
        /// had made: the position cannot be reached (the input starts at its first
        /// element).
        Unreachable { iteration: u64, batches: u64 },
    }
}

/// Where the input resumes (module docs).
pub fn resume(saved: Saved, resuming: Resuming) -> InputResume {
    if saved.iteration < 0 {
        return InputResume::Fresh {};
    }
    let (mut iteration, mut batches) = (saved.iteration as u64, saved.batches);
    // An iterator that has given nothing is not used up, whatever the loop does next
    // (a save right after a restore, before the resumed iterator's first step).
    let used_up = batches > 0
        && resuming.new_iteration.unwrap_or_else(|| {
            let limits = [
                resuming.per_iteration,
                resuming.steps_per_iteration,
                (saved.previous > 0).then_some(saved.previous),
            ];
            limits.iter().flatten().any(|&limit| limit > 0 && batches >= limit)
        });
    if used_up {
        iteration += 1;
        batches = 0;
    }
    match iteration.checked_sub(resuming.first_used) {
        Some(advance) => InputResume::At {
            iteration,
            batches,
            advance,
        },
        None => InputResume::Unreachable { iteration, batches },
    }
}

/// Batches the iterator in use has given: `start` (where it was positioned) plus
/// `per_run` for every run since it was made (`runs_now - runs_at_made`, never
/// negative).
pub fn batches_given(start: u64, runs_now: u64, runs_at_made: u64, per_run: u64) -> u64 {
    start.saturating_add(runs_now.saturating_sub(runs_at_made).saturating_mul(per_run))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(iteration: i64, batches: u64, previous: u64) -> Saved {
        Saved {
            iteration,
            batches,
            previous,
        }
    }

    /// (saved, resuming, expected), named by what the row shows.
    #[test]
    fn resume_table() {
        let none = Resuming::default();
        let rows: &[(&str, Saved, Resuming, InputResume)] = &[
            ("nothing was made before the save", saved(-1, 0, 0), none, InputResume::Fresh {}),
            (
                "mid-epoch: the same iterator, the next batch",
                saved(1, 5, 8),
                Resuming {
                    per_iteration: Some(8),
                    ..none
                },
                InputResume::At {
                    iteration: 1,
                    batches: 5,
                    advance: 1,
                },
            ),
            (
                "the input's end: the next iterator",
                saved(1, 8, 8),
                Resuming {
                    per_iteration: Some(8),
                    ..none
                },
                InputResume::At {
                    iteration: 2,
                    batches: 0,
                    advance: 2,
                },
            ),
            (
                "the loop's epoch ends before the input's",
                saved(0, 4, 0),
                Resuming {
                    per_iteration: Some(8),
                    steps_per_iteration: Some(4),
                    ..none
                },
                InputResume::At {
                    iteration: 1,
                    batches: 0,
                    advance: 1,
                },
            ),
            (
                "an unknown length, told by the previous iterator's",
                saved(3, 4, 4),
                none,
                InputResume::At {
                    iteration: 4,
                    batches: 0,
                    advance: 4,
                },
            ),
            (
                "an unknown length in the first epoch: the same iterator",
                saved(0, 4, 0),
                none,
                InputResume::At {
                    iteration: 0,
                    batches: 4,
                    advance: 0,
                },
            ),
            (
                "a repeated input in one iterator: fit says it goes on",
                saved(0, 13, 0),
                Resuming {
                    per_iteration: Some(8),
                    new_iteration: Some(false),
                    ..none
                },
                InputResume::At {
                    iteration: 0,
                    batches: 13,
                    advance: 0,
                },
            ),
            (
                "fit starts a new epoch at batch 0",
                saved(2, 8, 8),
                Resuming {
                    new_iteration: Some(true),
                    first_used: 1,
                    ..none
                },
                InputResume::At {
                    iteration: 3,
                    batches: 0,
                    advance: 2,
                },
            ),
            (
                "tf_keras trains from its second iterator",
                saved(2, 3, 8),
                Resuming {
                    new_iteration: Some(false),
                    first_used: 1,
                    ..none
                },
                InputResume::At {
                    iteration: 2,
                    batches: 3,
                    advance: 1,
                },
            ),
            (
                "more iterators before training than the interrupted run made",
                saved(0, 3, 0),
                Resuming { first_used: 1, ..none },
                InputResume::Unreachable { iteration: 0, batches: 3 },
            ),
            (
                "saved before the resumed iterator's first step: fit's new epoch is that one",
                saved(3, 0, 8),
                Resuming {
                    new_iteration: Some(true),
                    ..none
                },
                InputResume::At {
                    iteration: 3,
                    batches: 0,
                    advance: 3,
                },
            ),
            (
                "a save right after the iterator was made: batch 0, same iterator",
                saved(2, 0, 8),
                Resuming {
                    per_iteration: Some(8),
                    ..none
                },
                InputResume::At {
                    iteration: 2,
                    batches: 0,
                    advance: 2,
                },
            ),
        ];
        for (name, saved, resuming, expected) in rows {
            assert_eq!(resume(*saved, *resuming), *expected, "{name}");
        }
    }

    #[test]
    fn a_replay_logs_every_interval_and_an_advance_only_when_slow() {
        let mut replay = Timing::new(Timed::Replay, 100.0);
        assert_eq!(replay.poll_timeout(100.0), REPLAY_PROGRESS_EVERY);
        assert_eq!(replay.poll(104.0), None, "not yet due");
        assert_eq!(replay.poll(105.0), Some(5.0));
        assert_eq!(replay.poll_timeout(105.0), REPLAY_PROGRESS_EVERY, "the next from this line");
        assert_eq!(replay.poll(106.0), None);
        assert_eq!(replay.poll(111.5), Some(11.5));
        let mut quick = Timing::new(Timed::Advance, 10.0);
        assert_eq!(quick.poll(11.0), None, "exactly the bound: not logged");
        assert_eq!(quick.poll(11.5), Some(1.5));
        assert_eq!(quick.poll_timeout(12.0), 0.0);
    }

    #[test]
    fn batches_given_counts_runs_since_the_iterator_was_made() {
        assert_eq!(batches_given(0, 10, 7, 1), 3);
        assert_eq!(batches_given(5, 10, 7, 2), 11);
        assert_eq!(batches_given(5, 3, 7, 2), 5, "a run count below the one at making");
        assert_eq!(batches_given(1, u64::MAX, 0, 2), u64::MAX, "saturates");
    }
}
