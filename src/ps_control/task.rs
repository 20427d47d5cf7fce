//! The PS (or worker) task's protocol object: what a served task of a
//! ParameterServerStrategy cluster answers the coordinator, and how long it serves
//! after its notice. `serving.py` and `_coordinator/task_calls.py` perform it: they
//! watch the notice sources, answer the coordinator's calls, wait as told and exit.
//!
//! ```text
//!  WaitNotice(slice) ... ─notice─▶ Serving(own bound, from, at most) ─▶ Serve(until the
//!  release, the deadline, or the bound and the coordinator's silence) ... ─▶ Leave(why)
//! ```
//!
//! A release counts only for this incarnation's notice ([`super::release_refused`]);
//! when to leave is [`super::serving`]'s. Times: the caller's `now`, Unix seconds (a
//! notice's deadline and its time, which the coordinator's release names, are Unix
//! times).

use super::{
    release_refused, serve_bound, serving, Leave, Refusal, ServeBound, Serving, COORDINATOR_SILENCE, DEFAULT_DRAIN_BOUND, SERVE_CAP_FACTOR,
    SERVE_SLICE,
};

crate::wire! {
    /// What the task's threads report.
    pub enum TaskEvent via task_event {
        /// The task's termination notice, from `source`, naming `deadline` (Unix seconds);
        /// `grace_period` is the task's then (the platform's is known once probed; None:
        /// none).
        Notice {
            source: String,
            deadline: Option<f64>,
            grace_period: Option<f64>,
        },
        /// The coordinator called (a poll or a release).
        Asked {},
    }
}

crate::wire! {
    /// What the serving thread does next.
    pub enum TaskAction via task_action {
        /// Wait for a notice from the sources, at most `timeout` seconds.
        WaitNotice { timeout: f64 },
        /// Say how long the task serves: `own` seconds (from `source`), at most `at_most`.
        Serving { own: f64, source: ServeBound, at_most: f64 },
        /// Serve (wait for the release) at most `timeout` seconds, then poll again.
        Serve { timeout: f64 },
        /// Leave now: released (`reason`), or not (`why`), `after` seconds after the notice.
        /// `silence` and `cap_factor` are the bounds the reasons name.
        Leave {
            why: Leave,
            reason: Option<String>,
            after: f64,
            silence: f64,
            cap_factor: f64,
        },
    }
}

/// A call of the coordinator to the task (its JSON object, as the binding read it).
#[derive(Clone, Debug, PartialEq)]
pub enum TaskRequest {
    /// `{"op": "poll"}`: the task's incarnation and notice.
    Poll,
    /// `{"op": "release", ...}`: exit, for the incarnation and the notice's time the
    /// coordinator saw, for `reason` (None: "released").
    Release {
        incarnation: Option<String>,
        notice_at: Option<f64>,
        reason: Option<String>,
    },
    /// Another op (this one, as Python writes it), or none.
    Unknown(String),
    /// Not a JSON object.
    NotAnObject,
}

/// What the task answers a call.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskReply {
    /// Its incarnation and its notice (source, time, deadline), if any.
    Poll {
        incarnation: String,
        notice: Option<(String, f64, Option<f64>)>,
    },
    /// The release was accepted (None) or refused, and why.
    Release(Option<Refusal>),
    /// The request is no call of the coordinator's.
    Error(String),
}

#[derive(Clone, Debug)]
struct Notice {
    source: String,
    at: f64,
    deadline: Option<f64>,
}

/// One served task (module docs).
#[derive(Debug)]
pub struct Task {
    incarnation: String,
    grace_period: f64,
    peer_timeout: f64,
    notice: Option<Notice>,
    /// The own bound and where it comes from, once said.
    own: Option<(f64, ServeBound)>,
    said: bool,
    last_asked: Option<f64>,
    released: Option<String>,
}

impl Task {
    /// A served task of `incarnation` whose bound after a notice with no deadline is
    /// its grace period (when positive) or `peer_timeout` (None: [`DEFAULT_DRAIN_BOUND`]).
    #[must_use]
    pub fn new(incarnation: String, peer_timeout: Option<f64>) -> Self {
        Task {
            incarnation,
            grace_period: 0.0,
            peer_timeout: peer_timeout.unwrap_or(DEFAULT_DRAIN_BOUND),
            notice: None,
            own: None,
            said: false,
            last_asked: None,
            released: None,
        }
    }

    /// The incarnation the task answers with.
    #[must_use]
    pub fn incarnation(&self) -> &str {
        &self.incarnation
    }

    /// `(source, at, deadline)` of the notice, once there is one.
    #[must_use]
    pub fn notice(&self) -> Option<(&str, f64, Option<f64>)> {
        self.notice.as_ref().map(|n| (n.source.as_str(), n.at, n.deadline))
    }

    /// When the coordinator last called (None: never).
    #[must_use]
    pub fn last_asked(&self) -> Option<f64> {
        self.last_asked
    }

    /// The reason of the release accepted, if one was.
    #[must_use]
    pub fn released(&self) -> Option<&str> {
        self.released.as_deref()
    }

    /// An event at `now`. The first notice counts; a later one is ignored.
    pub fn handle(&mut self, event: TaskEvent, now: f64) {
        match event {
            TaskEvent::Notice {
                source,
                deadline,
                grace_period,
            } => {
                if self.notice.is_none() {
                    self.notice = Some(Notice { source, at: now, deadline });
                    self.grace_period = grace_period.unwrap_or(0.0);
                }
            }
            TaskEvent::Asked {} => self.last_asked = Some(now),
        }
    }

    /// The coordinator asks this task to exit, naming the incarnation and the notice's
    /// time it saw, for `reason`: accepted (None) or refused, and why.
    fn release(&mut self, incarnation: Option<&str>, notice_at: Option<f64>, reason: String) -> Option<Refusal> {
        let refused = release_refused(&self.incarnation, self.notice.as_ref().map(|n| n.at), incarnation, notice_at);
        if refused.is_none() {
            self.released = Some(reason);
        }
        refused
    }

    /// The answer to the coordinator's `request` at `now`. Any request object counts
    /// as the coordinator asking.
    pub fn answer(&mut self, request: TaskRequest, now: f64) -> TaskReply {
        if request != TaskRequest::NotAnObject {
            self.handle(TaskEvent::Asked {}, now);
        }
        match request {
            TaskRequest::Poll => TaskReply::Poll {
                incarnation: self.incarnation.clone(),
                notice: self.notice.as_ref().map(|n| (n.source.clone(), n.at, n.deadline)),
            },
            TaskRequest::Release {
                incarnation,
                notice_at,
                reason,
            } => TaskReply::Release(self.release(incarnation.as_deref(), notice_at, reason.unwrap_or_else(|| "released".to_owned()))),
            TaskRequest::Unknown(op) => TaskReply::Error(format!("unknown op {op}")),
            TaskRequest::NotAnObject => TaskReply::Error("not a JSON object".to_owned()),
        }
    }

    /// The next action of the serving thread at `now`.
    pub fn poll(&mut self, now: f64) -> TaskAction {
        let Some(notice) = self.notice.clone() else {
            return TaskAction::WaitNotice { timeout: SERVE_SLICE };
        };
        let (own, from) = *self
            .own
            .get_or_insert_with(|| serve_bound(notice.at, notice.deadline, self.grace_period, self.peer_timeout));
        if !self.said {
            self.said = true;
            let at_most = if notice.deadline.is_some() { own } else { own * SERVE_CAP_FACTOR };
            return TaskAction::Serving {
                own,
                source: from,
                at_most,
            };
        }
        // The core decides: released, the deadline, or this task's own bound and then
        // the coordinator's asks (its save may still be under way).
        match serving(notice.at, notice.deadline, own, self.last_asked, self.released.is_some(), now) {
            Serving::Until(t) => TaskAction::Serve {
                timeout: (t - now).clamp(0.0, SERVE_SLICE),
            },
            Serving::Leave(why) => TaskAction::Leave {
                why,
                reason: self.released.clone(),
                after: now - notice.at,
                silence: COORDINATOR_SILENCE,
                cap_factor: SERVE_CAP_FACTOR,
            },
        }
    }

    /// Seconds the serving thread may wait from `now`: what its next action says.
    #[must_use]
    pub fn poll_timeout(&self, now: f64) -> f64 {
        let Some(notice) = &self.notice else {
            return SERVE_SLICE;
        };
        let (own, _) = self
            .own
            .unwrap_or_else(|| serve_bound(notice.at, notice.deadline, self.grace_period, self.peer_timeout));
        match serving(notice.at, notice.deadline, own, self.last_asked, self.released.is_some(), now) {
            Serving::Until(t) => (t - now).clamp(0.0, SERVE_SLICE),
            Serving::Leave(_) => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: f64 = 1_000.0;

    #[test]
    fn the_task_answers_the_coordinators_calls() {
        let mut t = Task::new("inc".into(), None);
        assert_eq!(t.answer(TaskRequest::NotAnObject, AT), TaskReply::Error("not a JSON object".into()));
        assert_eq!(t.last_asked(), None, "a request that is no object is no call");
        assert_eq!(
            t.answer(TaskRequest::Unknown("'exit'".into()), AT),
            TaskReply::Error("unknown op 'exit'".into())
        );
        assert_eq!(
            t.answer(TaskRequest::Poll, AT + 1.0),
            TaskReply::Poll {
                incarnation: "inc".into(),
                notice: None
            }
        );
        assert_eq!(t.last_asked(), Some(AT + 1.0));
        let release = |at| TaskRequest::Release {
            incarnation: Some("inc".into()),
            notice_at: at,
            reason: None,
        };
        assert_eq!(t.answer(release(None), AT), TaskReply::Release(Some(Refusal::NoNotice)));
        t.handle(
            TaskEvent::Notice {
                source: "signal SIGTERM".into(),
                deadline: None,
                grace_period: None,
            },
            AT + 2.0,
        );
        assert_eq!(t.answer(release(Some(AT + 2.0)), AT + 3.0), TaskReply::Release(None));
        assert_eq!(t.released(), Some("released"));
    }

    fn noticed(deadline: Option<f64>, grace: f64) -> Task {
        let mut t = Task::new("inc".into(), Some(30.0));
        assert_eq!(t.poll(AT - 1.0), TaskAction::WaitNotice { timeout: SERVE_SLICE });
        t.handle(
            TaskEvent::Notice {
                source: "signal SIGTERM".into(),
                deadline,
                grace_period: Some(grace),
            },
            AT,
        );
        t
    }

    #[test]
    fn a_task_says_its_bound_once_then_serves_in_slices_until_released() {
        let mut t = noticed(None, 0.0);
        assert_eq!(
            t.poll(AT),
            TaskAction::Serving {
                own: 30.0,
                source: ServeBound::PeerTimeout,
                at_most: 30.0 * SERVE_CAP_FACTOR
            }
        );
        assert_eq!(t.poll(AT + 1.0), TaskAction::Serve { timeout: SERVE_SLICE });
        assert_eq!(t.poll(AT + 29.5), TaskAction::Serve { timeout: 0.5 });
        assert_eq!(t.release(Some("inc"), Some(AT), "checkpoint saved".into()), None);
        assert_eq!(
            t.poll(AT + 29.75),
            TaskAction::Leave {
                why: Leave::Released,
                reason: Some("checkpoint saved".into()),
                after: 29.75,
                silence: COORDINATOR_SILENCE,
                cap_factor: SERVE_CAP_FACTOR
            }
        );
    }

    #[test]
    fn a_release_counts_only_for_this_incarnation_and_notice() {
        let mut t = Task::new("inc".into(), None);
        assert_eq!(t.release(Some("inc"), None, "r".into()), Some(Refusal::NoNotice));
        t.handle(
            TaskEvent::Notice {
                source: "s".into(),
                deadline: None,
                grace_period: None,
            },
            AT,
        );
        // A second notice does not move the first.
        t.handle(
            TaskEvent::Notice {
                source: "t".into(),
                deadline: Some(1.0),
                grace_period: Some(9.0),
            },
            AT + 5.0,
        );
        assert_eq!(t.notice(), Some(("s", AT, None)));
        assert!(matches!(t.poll(AT + 5.0), TaskAction::Serving { own, .. } if own == DEFAULT_DRAIN_BOUND));
        assert_eq!(t.release(Some("old"), Some(AT), "r".into()), Some(Refusal::NotThisIncarnation));
        assert_eq!(t.release(Some("inc"), Some(AT + 1.0), "r".into()), Some(Refusal::NotThisNotice));
        assert_eq!(t.released(), None);
    }

    #[test]
    fn past_its_bound_a_task_serves_while_the_coordinator_asks() {
        let mut t = noticed(None, 20.0);
        assert!(matches!(t.poll(AT), TaskAction::Serving { own, source: ServeBound::GracePeriod, .. } if own == 20.0));
        t.handle(TaskEvent::Asked {}, AT + 19.0);
        assert_eq!(t.last_asked(), Some(AT + 19.0));
        assert!(matches!(t.poll(AT + 21.0), TaskAction::Serve { .. }));
        assert_eq!(t.poll_timeout(AT + 21.0), SERVE_SLICE);
        assert!(matches!(
            t.poll(AT + 19.0 + COORDINATOR_SILENCE),
            TaskAction::Leave {
                why: Leave::CoordinatorSilent,
                reason: None,
                ..
            }
        ));
        // A deadline: served until it, said as such.
        let mut t = noticed(Some(AT + 10.0), 20.0);
        assert!(matches!(t.poll(AT), TaskAction::Serving { own, source: ServeBound::Deadline, at_most } if own == 10.0 && at_most == 10.0));
        assert!(matches!(t.poll(AT + 10.0), TaskAction::Leave { why: Leave::Deadline, .. }));
    }
}
