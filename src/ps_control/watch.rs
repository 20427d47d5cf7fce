//! What the coordinator's poll makes of each task's answer (`ClusterPoller`
//! in `_coordinator/cluster_poller.py`).
//!
//! Every task is asked every round, whatever it answered before. Per task
//! this keeps the incarnation and notice of its last answer (a release names
//! both), the incarnation whose notice was handed on (each incarnation's
//! first notice is handed on once: a restarted task preempted again is
//! handed on again), and what its log says:
//!
//! | the poll | logged ([`PollLog`]) |
//! | --- | --- |
//! | the task does not run `serve()` (yet) | [`PollLog::NotServed`], once until it answers |
//! | the call failed otherwise | [`PollLog::DoesNotAnswer`], once a streak, and again when the reason (the error's type) changes |
//! | an answer that is no task's answer | nothing; the task counts as unanswered (`"bad answer"`) |
//! | an answer of another incarnation than the last | [`PollLog::NewIncarnation`] |
//! | an answer after unanswered polls | [`PollLog::AnswersAgain`] |
//!
//! A task whose `serve()` is not registered yet is not "unanswered": it is
//! handled as a failure when it goes, and watched once it serves.

use std::collections::BTreeMap;

use super::TOKEN;

/// What TensorFlow's error says when a task has no `PyFunc` of that key.
const NOT_FOUND: &str = "Could not find callback";

/// What TensorFlow's eager service answers an op sent under a context the task does
/// not hold: the task restarted since this coordinator last connected to it.
pub const STALE_CONTEXT: &str = "Unable to find a context_id";

/// Whether the coordinator reconnects to `task` (a device name, `/job:worker/...`)
/// after its poll failed with `message`: a worker whose op failed with
/// [`STALE_CONTEXT`] restarted, and this coordinator has not reconnected to it.
/// TensorFlow reconnects (its worker recovery, `update_server_def`) only when a
/// closure fails on that worker; a restarted worker that no closure goes to (the
/// queue empty, the training loop elsewhere) is then never asked again, and its
/// termination notice is not heard until it leaves on its own bound, unreleased. The
/// coordinator asks for the reconnection itself.
///
/// Never a PS: a restarted PS has lost its variables, and TensorFlow's coordinator
/// treats the loss of a PS as fatal (the job restarts from its checkpoint); a
/// reconnection would hide that.
#[must_use]
pub fn reconnect(task: &str, message: &str) -> bool {
    task.contains("/job:worker/") && message.contains(STALE_CONTEXT)
}

/// A line the poll's log gets (the Python layer holds the texts).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PollLog {
    /// The task does not run `serve()` (yet): its notices are watched once it
    /// does.
    NotServed,
    /// The task does not answer: asked again next round.
    DoesNotAnswer,
    /// The task answers again after unanswered polls.
    AnswersAgain,
    /// The task answers as a new incarnation: watched like the first.
    NewIncarnation,
}

// The words of the log lines and records (the binding's `str`s).
crate::words!(PollLog {
    PollLog::NotServed => "not served",
    PollLog::DoesNotAnswer => "does not answer",
    PollLog::AnswersAgain => "answers again",
    PollLog::NewIncarnation => "new incarnation",
});

#[derive(Debug, Default)]
struct Task {
    /// The incarnation of the last answer.
    incarnation: Option<String>,
    /// The last answer had a notice, taken at this time (None: not a number).
    notice: Option<Option<f64>>,
    /// The incarnation whose notice was handed on.
    noticed: Option<String>,
    /// The last failed poll said the task does not run `serve()`.
    not_served: bool,
    /// Why the last polls went unanswered (an error's type, `"bad answer"`).
    unanswered: Option<String>,
}

/// The poll's view of every task; see the module documentation.
#[derive(Debug, Default)]
pub struct Watch {
    tasks: BTreeMap<String, Task>,
}

impl Watch {
    /// No task has answered yet.
    #[must_use]
    pub fn new() -> Self {
        Watch::default()
    }

    fn task(&mut self, task: &str) -> &mut Task {
        self.tasks.entry(task.to_owned()).or_default()
    }

    /// The poll of `task` failed with an error of type `kind` whose text is
    /// `message`: the task does not run `serve()` (yet) when the text names
    /// the control's callback (TensorFlow's "Could not find callback", or
    /// [`TOKEN`]), else it does not answer.
    pub fn failed(&mut self, task: &str, kind: &str, message: &str) -> Option<PollLog> {
        let state = self.task(task);
        if message.contains(NOT_FOUND) || message.contains(TOKEN) {
            let first = !state.not_served;
            state.not_served = true;
            return first.then_some(PollLog::NotServed);
        }
        // Logged once a streak, and again when the reason changes (a task
        // that went from "unknown device" to "does not return" is worth a
        // line).
        let first = state.unanswered.as_deref() != Some(kind);
        state.unanswered = Some(kind.to_owned());
        first.then_some(PollLog::DoesNotAnswer)
    }

    /// The poll of `task` got an answer that is no task's answer.
    pub fn bad_answer(&mut self, task: &str) {
        self.task(task).unanswered = Some("bad answer".to_owned());
    }

    /// `task` answered as `incarnation`, with a notice taken at `notice`'s
    /// time (`Some(None)`: a notice whose time is not a number), or none.
    pub fn answered(&mut self, task: &str, incarnation: &str, notice: Option<Option<f64>>) -> Option<PollLog> {
        let state = self.task(task);
        let was_unanswered = state.unanswered.take().is_some();
        state.not_served = false;
        let previous = state.incarnation.replace(incarnation.to_owned());
        state.notice = notice;
        if previous.is_some_and(|p| p != incarnation) {
            Some(PollLog::NewIncarnation)
        } else if was_unanswered {
            Some(PollLog::AnswersAgain)
        } else {
            None
        }
    }

    /// Whether the notice of `task`'s last answer is to be handed on now: the
    /// first notice of its incarnation (true once per incarnation).
    pub fn hand_on(&mut self, task: &str) -> bool {
        let state = self.task(task);
        if state.notice.is_none() || state.noticed == state.incarnation {
            return false;
        }
        state.noticed.clone_from(&state.incarnation);
        true
    }

    /// What a release of `task` names: the incarnation and the notice's time
    /// of its last answer.
    #[must_use]
    pub fn release_names(&self, task: &str) -> (Option<String>, Option<f64>) {
        self.tasks
            .get(task)
            .map_or((None, None), |s| (s.incarnation.clone(), s.notice.flatten()))
    }

    /// Task -> the incarnation of its last answer.
    #[must_use]
    pub fn incarnations(&self) -> Vec<(String, String)> {
        self.tasks
            .iter()
            .filter_map(|(t, s)| Some((t.clone(), s.incarnation.clone()?)))
            .collect()
    }

    /// Task -> why its last polls went unanswered (none answered since).
    #[must_use]
    pub fn unanswered_tasks(&self) -> Vec<(String, String)> {
        self.tasks
            .iter()
            .filter_map(|(t, s)| Some((t.clone(), s.unanswered.clone()?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PollLog::*;

    #[test]
    fn a_restarted_worker_the_coordinator_has_no_context_on_is_reconnected_and_nothing_else() {
        const WORKER: &str = "/job:worker/replica:0/task:0";
        let restarted = "Failed copying input tensor from /job:chief/replica:0/task:0/device:CPU:0 to \
            /job:worker/replica:0/task:0/device:CPU:0 in order to run PyFunc: Unable to find a context_id \
            matching the specified one (5521992485756649495). Perhaps the worker was restarted, or the context was GC'd?";
        assert!(reconnect(WORKER, restarted));
        // A restarted PS: its loss stays TensorFlow's fatal failure.
        assert!(!reconnect("/job:ps/replica:0/task:0", restarted));
        for other in [
            "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:27762: Connection refused",
            "/job:worker/replica:0/task:0/device:CPU:0 unknown device.",
            "Could not find callback with key=tfh_ps_control in the registry.",
            "",
        ] {
            assert!(!reconnect(WORKER, other), "{other}");
        }
    }

    const NOT_SERVED: &str = "Could not find callback with key=tf_failure_handling/task_control";

    /// One poll of task "t" and what it leads to.
    #[derive(Debug, Clone, Copy)]
    enum Poll {
        /// "Could not find callback": no `serve()` yet.
        NotServed,
        /// An error of this type.
        Error(&'static str),
        /// An answer that is no task's.
        Bad,
        /// An answer: incarnation, and the notice's time if it has one.
        Answer(&'static str, Option<f64>),
    }

    /// (name, polls with what each logs and whether a notice is handed on,
    /// the unanswered reason afterwards)
    type Row = (&'static str, &'static [(Poll, Option<PollLog>, bool)], Option<&'static str>);

    const ROWS: &[Row] = &[
        (
            "a first answer without notice logs nothing",
            &[(Poll::Answer("a", None), None, false)],
            None,
        ),
        (
            "each incarnation's first notice is handed on once",
            &[
                (Poll::Answer("a", None), None, false),
                (Poll::Answer("a", Some(5.0)), None, true),
                (Poll::Answer("a", Some(5.0)), None, false),
                (Poll::Answer("b", Some(9.0)), Some(NewIncarnation), true),
                (Poll::Answer("b", Some(9.0)), None, false),
            ],
            None,
        ),
        (
            "not serving is logged once until the task answers",
            &[
                (Poll::NotServed, Some(NotServed), false),
                (Poll::NotServed, None, false),
                (Poll::Answer("a", Some(1.0)), None, true),
                (Poll::NotServed, Some(NotServed), false),
            ],
            None,
        ),
        (
            "an unanswered streak is logged once per reason, and its end",
            &[
                (Poll::Answer("a", None), None, false),
                (Poll::Error("UnavailableError"), Some(DoesNotAnswer), false),
                (Poll::Error("UnavailableError"), None, false),
                (Poll::Error("CallTimeout"), Some(DoesNotAnswer), false),
                (Poll::Error("CallTimeout"), None, false),
                (Poll::Answer("a", None), Some(AnswersAgain), false),
                (Poll::Error("CallTimeout"), Some(DoesNotAnswer), false),
            ],
            Some("CallTimeout"),
        ),
        (
            "a new incarnation is logged rather than its return",
            &[
                (Poll::Answer("a", None), None, false),
                (Poll::Error("UnavailableError"), Some(DoesNotAnswer), false),
                (Poll::Answer("b", None), Some(NewIncarnation), false),
            ],
            None,
        ),
        (
            "a bad answer is unanswered, silently, and its end logged",
            &[
                (Poll::Bad, None, false),
                (Poll::Bad, None, false),
                (Poll::Error("UnavailableError"), Some(DoesNotAnswer), false),
                (Poll::Bad, None, false),
                (Poll::Answer("a", None), Some(AnswersAgain), false),
            ],
            None,
        ),
        (
            "a bad answer keeps the streak's reason from repeating",
            &[(Poll::Bad, None, false)],
            Some("bad answer"),
        ),
        (
            "not serving does not end an unanswered streak",
            &[
                (Poll::Error("UnavailableError"), Some(DoesNotAnswer), false),
                (Poll::NotServed, Some(NotServed), false),
                (Poll::Error("UnavailableError"), None, false),
            ],
            Some("UnavailableError"),
        ),
        (
            "the first answer after not serving is no return",
            &[(Poll::NotServed, Some(NotServed), false), (Poll::Answer("a", None), None, false)],
            None,
        ),
        (
            "a failed poll keeps the last answer's notice, not handed on twice",
            &[
                (Poll::Answer("a", Some(1.0)), None, true),
                (Poll::Error("UnavailableError"), Some(DoesNotAnswer), false),
                (Poll::Answer("a", Some(1.0)), Some(AnswersAgain), false),
            ],
            None,
        ),
    ];

    #[test]
    fn every_transition_of_the_poll_bookkeeping() {
        for &(name, polls, unanswered) in ROWS {
            let mut watch = Watch::new();
            for (i, &(poll, log, hand_on)) in polls.iter().enumerate() {
                let (got, answered) = match poll {
                    Poll::NotServed => (watch.failed("t", "NotFoundError", NOT_SERVED), false),
                    Poll::Error(e) => (watch.failed("t", e, "gone"), false),
                    Poll::Bad => {
                        watch.bad_answer("t");
                        (None, false)
                    }
                    Poll::Answer(inc, at) => (watch.answered("t", inc, at.map(Some)), true),
                };
                assert_eq!(got, log, "{name}: poll {i} ({poll:?})");
                // poll_once asks only after an answer.
                if answered {
                    assert_eq!(watch.hand_on("t"), hand_on, "{name}: poll {i} ({poll:?})");
                } else {
                    assert!(!hand_on, "{name}: row error");
                }
            }
            let reasons = watch.unanswered_tasks();
            let want: Vec<(String, String)> = unanswered.map(|r| ("t".into(), r.into())).into_iter().collect();
            assert_eq!(reasons, want, "{name}");
        }
    }

    #[test]
    fn a_notice_without_a_time_is_handed_on_and_released_without_one() {
        let mut watch = Watch::new();
        watch.answered("t", "a", Some(None));
        assert!(watch.hand_on("t"));
        assert_eq!(watch.release_names("t"), (Some("a".into()), None));
    }

    #[test]
    fn a_release_names_the_last_answers_incarnation_and_notice() {
        let mut watch = Watch::new();
        assert_eq!(watch.release_names("t"), (None, None));
        watch.answered("t", "a", None);
        assert_eq!(watch.release_names("t"), (Some("a".into()), None));
        watch.answered("t", "a", Some(Some(7.5)));
        assert_eq!(watch.release_names("t"), (Some("a".into()), Some(7.5)));
        watch.failed("t", "UnavailableError", "connection refused");
        assert_eq!(watch.release_names("t"), (Some("a".into()), Some(7.5)));
        watch.answered("t", "b", None);
        assert_eq!(watch.release_names("t"), (Some("b".into()), None));
    }

    #[test]
    fn incarnations_are_those_of_tasks_that_answered() {
        let mut watch = Watch::new();
        watch.failed("p", "InvalidArgumentError", NOT_SERVED);
        watch.answered("w", "a", None);
        watch.failed("x", "UnavailableError", "connection refused");
        assert_eq!(watch.incarnations(), vec![("w".to_owned(), "a".to_owned())]);
        assert_eq!(watch.unanswered_tasks(), vec![("x".to_owned(), "UnavailableError".to_owned())]);
    }

    #[test]
    fn a_task_without_the_control_is_told_by_the_errors_text() {
        let rows = [
            ("Could not find callback with key=x", Some(NotServed)),
            ("InvalidArgument: no tf_failure_handling/task_control here", Some(NotServed)),
            ("connection refused", Some(DoesNotAnswer)),
        ];
        for (message, want) in rows {
            assert_eq!(Watch::new().failed("t", "E", message), want, "{message}");
        }
    }

    #[test]
    fn hand_on_before_any_answer_is_false() {
        assert!(!Watch::new().hand_on("t"));
    }
}
