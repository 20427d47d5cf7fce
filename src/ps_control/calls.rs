//! Which call to a task may start now: the bookkeeping of the coordinator's
//! bounded calls (`_Caller` in `_coordinator/task_calls.py`).
//!
//! Each call runs on a thread of its own and the caller stops waiting at the
//! call's timeout; a call that outlives it stays its task's *outstanding*
//! call. While it is outstanding a new call to that task is refused at once
//! ([`Refused::Outstanding`]: the task counts as unanswered, and no thread
//! piles up behind a stopped task), for at most `abandon_after` seconds: then
//! it is *abandoned* and the new call starts, so that one call that never
//! returns cannot hide the task's notices for good. At most `max_abandoned`
//! abandoned calls per task may be outstanding at once; past them new calls
//! are refused ([`Refused::Saturated`]) until one returns.
//!
//! The caller reports every call's end ([`Calls::returned`]), from the call's
//! thread, whether it answered or raised.

use std::collections::HashMap;

/// The handle of one call, unique for the lifetime of its [`Calls`].
pub type CallId = u64;

/// Why a call to a task may not start now: the caller raises `CallTimeout`
/// with this message.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Refused {
    /// The task's earlier call, `age` seconds old, has not returned and is
    /// not old enough to be abandoned.
    #[error("{task}: an earlier call has not returned yet ({age:.0}s)")]
    Outstanding {
        /// The task.
        task: String,
        /// Seconds since the earlier call started.
        age: f64,
    },
    /// The earlier call is old enough to be abandoned, but `abandoned` calls
    /// of the task are abandoned already and have not returned either.
    #[error(
        "{task}: an earlier call has not returned for {age:.0}s, and {abandoned} abandoned \
         call(s) have not either"
    )]
    Saturated {
        /// The task.
        task: String,
        /// Seconds since the earlier call started.
        age: f64,
        /// Abandoned calls of the task still outstanding.
        abandoned: usize,
    },
}

/// A call abandoned so that a new one could start (logged as a warning).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Abandoned {
    /// Seconds since the abandoned call started.
    pub age: f64,
    /// Abandoned calls of the task now outstanding, this one included.
    pub count: usize,
    /// The most that may be (`max_abandoned`).
    pub max: usize,
}

#[derive(Debug, Default)]
struct Task {
    /// The last call started, and when, until it returns or is abandoned.
    outstanding: Option<(CallId, f64)>,
    /// Abandoned calls that have not returned.
    abandoned: Vec<CallId>,
}

/// The outstanding and abandoned calls of every task; see the module
/// documentation.
#[derive(Debug)]
pub struct Calls {
    abandon_after: f64,
    max_abandoned: usize,
    next: CallId,
    tasks: HashMap<String, Task>,
}

impl Calls {
    /// No call outstanding; an unreturned call is abandoned after
    /// `abandon_after` seconds, at most `max_abandoned` per task.
    #[must_use]
    pub fn new(abandon_after: f64, max_abandoned: usize) -> Self {
        Calls {
            abandon_after,
            max_abandoned,
            next: 0,
            tasks: HashMap::new(),
        }
    }

    /// A call to `task` is to start at `now`: its handle, and the earlier
    /// call it abandons, if any.
    ///
    /// # Errors
    ///
    /// [`Refused`] while the task's earlier call holds up the next ones.
    pub fn start(&mut self, task: &str, now: f64) -> Result<(CallId, Option<Abandoned>), Refused> {
        let state = self.tasks.entry(task.to_owned()).or_default();
        let mut abandoned = None;
        if let Some((previous, started)) = state.outstanding {
            let age = now - started;
            if age < self.abandon_after {
                return Err(Refused::Outstanding {
                    task: task.to_owned(),
                    age,
                });
            }
            if state.abandoned.len() >= self.max_abandoned {
                return Err(Refused::Saturated {
                    task: task.to_owned(),
                    age,
                    abandoned: state.abandoned.len(),
                });
            }
            state.abandoned.push(previous);
            abandoned = Some(Abandoned {
                age,
                count: state.abandoned.len(),
                max: self.max_abandoned,
            });
        }
        let id = self.next;
        self.next += 1;
        state.outstanding = Some((id, now));
        Ok((id, abandoned))
    }

    /// Call `id` to `task` returned (an answer or an error); false for a
    /// handle this does not know (reported twice).
    pub fn returned(&mut self, task: &str, id: CallId) -> bool {
        let Some(state) = self.tasks.get_mut(task) else {
            return false;
        };
        if state.outstanding.is_some_and(|(o, _)| o == id) {
            state.outstanding = None;
            return true;
        }
        let before = state.abandoned.len();
        state.abandoned.retain(|&a| a != id);
        state.abandoned.len() != before
    }

    /// Calls of `task` that have not returned: `(outstanding, abandoned)`.
    #[must_use]
    pub fn unreturned(&self, task: &str) -> (bool, usize) {
        self.tasks
            .get(task)
            .map_or((false, 0), |s| (s.outstanding.is_some(), s.abandoned.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of a script: what happens, and what the bookkeeping says.
    #[derive(Debug)]
    enum Step {
        /// A call starts at this time: it is given a handle (named by its
        /// index in the script's started calls), abandoning `Some(count)`.
        Starts(f64, Option<usize>),
        /// A call at this time is refused as outstanding, of this age.
        Outstanding(f64, f64),
        /// A call at this time is refused: this many abandoned.
        Saturated(f64, usize),
        /// The n-th started call returns (`true`: it was known).
        Returns(usize, bool),
        /// The task's unreturned calls: (outstanding, abandoned).
        Unreturned(bool, usize),
    }
    use Step::*;

    /// (name, abandon_after, max_abandoned, script)
    type Row = (&'static str, f64, usize, &'static [Step]);

    const ROWS: &[Row] = &[
        (
            "a call that returned holds up nothing",
            30.0,
            4,
            &[Starts(0.0, None), Returns(0, true), Starts(0.1, None), Unreturned(true, 0)],
        ),
        (
            "an unreturned call refuses the next one until it returns",
            30.0,
            4,
            &[
                Starts(0.0, None),
                Outstanding(0.2, 0.2),
                Outstanding(29.0, 29.0),
                Returns(0, true),
                Starts(29.5, None),
            ],
        ),
        (
            "at abandon_after the call is abandoned and the task asked again",
            30.0,
            4,
            &[
                Starts(0.0, None),
                Outstanding(29.0, 29.0),
                Starts(30.0, Some(1)),
                Unreturned(true, 1),
                Returns(1, true),
                Starts(30.1, None),
                Unreturned(true, 1),
            ],
        ),
        (
            "an abandoned call that returns makes room for another",
            1.0,
            1,
            &[
                Starts(0.0, None),
                Starts(1.0, Some(1)),
                Saturated(2.0, 1),
                Returns(0, true),
                Unreturned(true, 0),
                Starts(2.0, Some(1)),
            ],
        ),
        (
            "abandoned calls are bounded per task, however long",
            1.0,
            2,
            &[
                Starts(0.0, None),
                Starts(1.0, Some(1)),
                Starts(2.0, Some(2)),
                Saturated(3.0, 2),
                Saturated(103.0, 2),
                Unreturned(true, 2),
            ],
        ),
        (
            "a call reported twice is known once",
            30.0,
            4,
            &[Starts(0.0, None), Returns(0, true), Returns(0, false), Unreturned(false, 0)],
        ),
        (
            "no abandoning at all with a bound of zero calls",
            1.0,
            0,
            &[Starts(0.0, None), Saturated(5.0, 0)],
        ),
    ];

    #[test]
    fn every_transition_of_the_calls_bookkeeping() {
        for &(name, abandon_after, max, script) in ROWS {
            let mut calls = Calls::new(abandon_after, max);
            let mut started: Vec<CallId> = Vec::new();
            for step in script {
                match *step {
                    Starts(now, count) => {
                        let (id, abandoned) = calls.start("t", now).unwrap_or_else(|e| panic!("{name}: {step:?}: {e}"));
                        assert_eq!(abandoned.map(|a| a.count), count, "{name}: {step:?}");
                        if let Some(a) = abandoned {
                            assert_eq!(a.max, max, "{name}");
                        }
                        started.push(id);
                    }
                    Outstanding(now, age) => match calls.start("t", now) {
                        Err(Refused::Outstanding { age: got, .. }) => {
                            assert!((got - age).abs() < 1e-9, "{name}: {step:?}: {got}");
                        }
                        other => panic!("{name}: {step:?}: {other:?}"),
                    },
                    Saturated(now, abandoned) => match calls.start("t", now) {
                        Err(Refused::Saturated { abandoned: got, .. }) => {
                            assert_eq!(got, abandoned, "{name}: {step:?}");
                        }
                        other => panic!("{name}: {step:?}: {other:?}"),
                    },
                    Returns(n, known) => {
                        assert_eq!(calls.returned("t", started[n]), known, "{name}: {step:?}");
                    }
                    Unreturned(outstanding, abandoned) => {
                        assert_eq!(calls.unreturned("t"), (outstanding, abandoned), "{name}");
                    }
                }
            }
        }
    }

    #[test]
    fn tasks_are_held_up_one_by_one() {
        let mut calls = Calls::new(30.0, 4);
        calls.start("stopped", 0.0).unwrap();
        assert!(calls.start("stopped", 1.0).is_err());
        assert!(calls.start("other", 1.0).is_ok());
        assert!(!calls.returned("unknown", 0));
    }

    #[test]
    fn refusals_read_as_before() {
        let outstanding = Refused::Outstanding {
            task: "w".into(),
            age: 29.0,
        };
        assert_eq!(outstanding.to_string(), "w: an earlier call has not returned yet (29s)");
        let saturated = Refused::Saturated {
            task: "w".into(),
            age: 101.4,
            abandoned: 2,
        };
        assert_eq!(
            saturated.to_string(),
            "w: an earlier call has not returned for 101s, and 2 abandoned call(s) have not either"
        );
    }
}
