//! The driver's writes as events in and actions out, in the shape of
//! quinn-proto's `Connection`: the driver thread (`_protocol/driver.py`) hands
//! each input to the protocol ([`Protocol::notice`], [`Protocol::step_key`],
//! [`Protocol::written`], [`Protocol::write_failed`], [`Protocol::write_raised`],
//! [`Protocol::close`]), performs what [`Protocol::poll`] returns, and waits
//! for its next input until [`Protocol::poll_timeout`].
//!
//! What a write sets, how long its call may take, when it is attempted and
//! retried, what follows it (the announce of a won claim) and what it came to
//! are decided here, over [`crate::writes`] (the schedule) and
//! [`crate::retry`] (the rule); the driver holds no copy of a pending write.
//!
//! Two clocks, as everywhere in the protocol: `now` is the protocol's (a
//! notice's deadline bounds the retries from it), `at` the driver's, on which
//! each write is scheduled. They are one clock except in a simulation, whose
//! protocol runs on a virtual clock its steps move while the driver still
//! waits out each pause in real time.

use super::{Action, ConfigError, Protocol};
use crate::notice::Notice;
use crate::retry::Verdict;
use crate::step_resolution::{
    write_timeout, KeyAction, Membership, NoticeAction, Round, StepKeyError, WriteBound, ACK_VALUE, PREEMPTION_NOTICE_KEY,
};
use crate::writes::{Busy, Kind, WriteId};

/// What one of the driver's writes sets in the coordination service: `key` =
/// `value`, the call bounded by `timeout` seconds ([`write_timeout`] of its kind).
/// The driver performs it as it is (`coordination.set`); a claim is lost when
/// the key exists already.
#[derive(Clone, Debug, PartialEq)]
pub struct SetCall {
    pub kind: Kind,
    pub key: String,
    pub value: String,
    pub timeout: f64,
    /// What the write is about: the notice's source (a claim, an announce), or
    /// the step key read, `key=value` (an acknowledgement).
    pub subject: String,
    /// A claim's follow-up: the message a won claim announces to the
    /// `PreemptionWatcher`s ([`Protocol::written`]).
    pub announce: Option<String>,
}

impl SetCall {
    /// The write of `kind` setting `key` to `value` about `subject`, bounded as
    /// its kind is with `peer_timeout`.
    #[must_use]
    pub fn new(kind: Kind, key: &str, value: &str, subject: &str, peer_timeout: f64) -> Self {
        let bound = if matches!(kind, Kind::Announce {}) {
            WriteBound::Announce
        } else {
            WriteBound::Protocol
        };
        SetCall {
            kind,
            key: key.to_owned(),
            value: value.to_owned(),
            timeout: write_timeout(peer_timeout, bound),
            subject: subject.to_owned(),
            announce: None,
        }
    }

    /// The claim of `key` = `value` after the notice from `source`, which, when
    /// won, announces `message` under [`PREEMPTION_NOTICE_KEY`].
    #[must_use]
    pub fn claim(key: &str, value: &str, source: &str, message: &str, peer_timeout: f64) -> Self {
        SetCall {
            announce: Some(message.to_owned()),
            ..SetCall::new(Kind::Claim {}, key, value, source, peer_timeout)
        }
    }

    /// What the write does, as the logs and a named error say it.
    #[must_use]
    pub fn what(&self) -> String {
        match self.kind {
            Kind::Claim {} => format!("claiming {} after the notice from {}", self.key, self.subject),
            Kind::Announce {} => format!("publishing {}", self.key),
            Kind::Acknowledge {} => format!("acknowledging {} with {}", self.subject, self.key),
        }
    }
}

/// What a write came to ([`DriverAction::Finished`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum WriteEnd {
    /// Written; `won` for a claim when this worker wrote the key first (true
    /// for the other kinds).
    Written { won: bool },
    /// The retry rule gave up after `attempts` failed attempts over `seconds`:
    /// the driver raises the last error, named ([`SetCall::what`]).
    GaveUp { attempts: u32, seconds: f64 },
    /// The attempt raised something that is not a coordination-service error
    /// (a bug): the driver hands it on as it is.
    Raised,
}

/// What the driver does next ([`Protocol::poll`]).
#[derive(Clone, Debug, PartialEq)]
pub enum DriverAction {
    /// Attempt the write `id`: `call` as it is; report the outcome.
    Write { id: WriteId, call: SetCall },
    /// The write `id` failed and is attempted again in `pause` seconds
    /// (`left` of its bound remained; `attempts` failed so far): for the log.
    Retrying {
        id: WriteId,
        call: SetCall,
        attempts: u32,
        pause: f64,
        left: f64,
    },
    /// The write ended. `ends_notice`: the notice it was written for is done
    /// with (a claim that no announce follows, an announce).
    Finished { call: SetCall, end: WriteEnd, ends_notice: bool },
    /// A claim dropped at close: a claim now would make the other workers
    /// stand down for a leader that is closing.
    Dropped { call: SetCall },
}

impl From<DriverAction> for Action {
    fn from(a: DriverAction) -> Self {
        match a {
            DriverAction::Write { id, call } => Action::Write {
                id,
                kind: call.kind.clone(),
                what: call.what(),
                key: call.key,
                value: call.value,
                timeout: call.timeout,
                subject: call.subject,
            },
            DriverAction::Retrying {
                id,
                call,
                attempts,
                pause,
                left,
            } => Action::Retrying {
                id,
                what: call.what(),
                attempts,
                pause,
                left,
            },
            DriverAction::Finished { call, end, ends_notice } => {
                let (kind, what) = (call.kind.clone(), call.what());
                let (key, value, subject) = (call.key, call.value, call.subject);
                match end {
                    WriteEnd::Written { won } => Action::Written {
                        kind,
                        key,
                        value,
                        what,
                        subject,
                        won,
                        ends_notice,
                    },
                    WriteEnd::GaveUp { attempts, seconds } => Action::WriteGaveUp {
                        kind,
                        key,
                        value,
                        what,
                        subject,
                        attempts,
                        seconds,
                        ends_notice,
                    },
                    WriteEnd::Raised => Action::Raised {
                        kind,
                        key,
                        value,
                        what,
                        subject,
                        ends_notice,
                    },
                }
            }
            DriverAction::Dropped { call } => Action::Dropped { what: call.what() },
        }
    }
}

impl Protocol {
    /// Queues `call`, due at once, retried for the retry bound at `now` (the
    /// leading notice's deadline may shorten it), scheduled on `at`.
    fn queue(&mut self, call: SetCall, now: f64, at: f64) -> Result<WriteId, Busy> {
        let bound = self.retry_bound(now);
        let id = self.writes.push(call.kind.clone(), bound, at)?;
        self.calls.insert(id, call);
        Ok(id)
    }

    /// A notice from `source` (`message`: what its announce says to the
    /// `PreemptionWatcher`s): the resolver's answer, and the write it starts,
    /// queued: the claim, or the announce of a notice this worker leads in a
    /// cluster. A notice's write is queued only when none is pending
    /// ([`Protocol::writes_busy`]: the driver keeps later notices waiting).
    ///
    /// # Errors
    ///
    /// [`ConfigError::NotConfigured`] before [`configure`](Self::configure).
    pub fn notice(&mut self, notice: Notice, source: &str, message: &str, now: f64, at: f64) -> Result<NoticeAction, ConfigError> {
        let action = self.handle_notice(notice)?;
        let local = self.resolver.as_ref().is_some_and(|r| *r.membership() == Membership::Local);
        let call = match &action {
            NoticeAction::Claim { key, value } => Some(SetCall::claim(key, value, source, message, self.peer_timeout)),
            NoticeAction::Lead if !local => Some(SetCall::new(
                Kind::Announce {},
                PREEMPTION_NOTICE_KEY,
                message,
                source,
                self.peer_timeout,
            )),
            _ => None,
        };
        if let Some(call) = call {
            // Refused only while another notice's write is pending, which the
            // driver does not let happen: the notice is then answered unwritten.
            let _ = self.queue(call, now, at);
        }
        Ok(action)
    }

    /// A notice taken at `now` (`at` on the driver's clock), as the protocol answers
    /// it ([`notice`](Self::notice)): `Wait` while the write of the notice before it
    /// is pending (the notice is not taken), else the resolver's answer with whether
    /// the preemption has a final round and whether a write was queued.
    ///
    /// # Errors
    ///
    /// [`ConfigError::NotConfigured`] before [`configure`](Self::configure).
    pub fn take_notice(&mut self, notice: Notice, source: &str, message: &str, now: f64, at: f64) -> Result<Action, ConfigError> {
        if self.writes_busy() {
            return Ok(Action::Wait {});
        }
        let action = self.notice(notice, source, message, now, at)?;
        let final_round = self.has_final_round()?;
        Ok(Action::notice(action, final_round, self.writes_busy()))
    }

    /// A step key a leader published, read: the resolver's answer, and, for an
    /// acknowledgement, its write queued (unless `superseded`: a newer handler
    /// of this worker acknowledges).
    ///
    /// # Errors
    ///
    /// [`ConfigError::NotConfigured`] before [`configure`](Self::configure).
    pub fn step_key(
        &mut self,
        round: Round,
        value: &str,
        superseded: bool,
        now: f64,
        at: f64,
    ) -> Result<Result<KeyAction, StepKeyError>, ConfigError> {
        let action = self.handle_step_key(round, value)?;
        if let Ok(KeyAction::Acknowledge { ack_key, .. }) = &action {
            if !superseded {
                let subject = format!("{}={value}", round.key());
                let call = SetCall::new(Kind::Acknowledge {}, ack_key, ACK_VALUE, &subject, self.peer_timeout);
                // An acknowledgement is never refused.
                let _ = self.queue(call, now, at);
            }
        }
        Ok(action)
    }

    /// The attempt of `id` succeeded (`won`: a claim written first). A claim's
    /// outcome goes to the resolver, and a won claim queues its announce, due at
    /// once and retried for the retry bound at `now`. A stale handle changes
    /// nothing.
    pub fn written(&mut self, id: WriteId, won: bool, now: f64, at: f64) {
        let Some(call) = self.calls.remove(&id) else {
            return; // a stale handle: its outcome was settled already
        };
        self.writes.done(id);
        let mut ends_notice = !matches!(call.kind, Kind::Acknowledge {});
        if matches!(call.kind, Kind::Claim {}) {
            if let Some(r) = self.resolver.as_mut() {
                r.on_claim(won);
            }
            if let (true, Some(message)) = (won, &call.announce) {
                let announce = SetCall::new(Kind::Announce {}, PREEMPTION_NOTICE_KEY, message, &call.subject, self.peer_timeout);
                // The claim was the one notice write pending, and is done.
                ends_notice = self.queue(announce, now, at).is_err();
            }
        }
        let won = won || !matches!(call.kind, Kind::Claim {});
        self.outbox.push_back(DriverAction::Finished {
            call,
            end: WriteEnd::Written { won },
            ends_notice,
        });
    }

    /// The attempt of `id` failed at `at` with a coordination-service error
    /// (`closing`: the handler closes, nothing is retried): due again after
    /// the rule's pause, or given up (forgotten; a claim given up leaves this
    /// worker not leading). Either way [`poll`](Self::poll) reports it.
    pub fn write_failed(&mut self, id: WriteId, at: f64, closing: bool) {
        let Some(verdict) = self.writes.failed(id, at, closing) else {
            return; // a stale handle
        };
        match verdict {
            Verdict::Again { at: due, left } => {
                if let Some(call) = self.calls.get(&id) {
                    self.outbox.push_back(DriverAction::Retrying {
                        id,
                        call: call.clone(),
                        attempts: self.writes.attempts(id),
                        pause: (due - at).max(0.0),
                        left,
                    });
                }
            }
            Verdict::GiveUp { attempts, seconds } => {
                self.unanswered(crate::failure::lost_peer::Detection::ProtocolUnanswered);
                self.end_unwritten(id, WriteEnd::GaveUp { attempts, seconds });
            }
        }
    }

    /// The attempt of `id` raised something that is not a coordination-service
    /// error: the write ends without its outcome being known (a claim leaves
    /// this worker not leading).
    pub fn write_raised(&mut self, id: WriteId) {
        if self.writes.done(id).is_some() {
            self.end_unwritten(id, WriteEnd::Raised);
        }
    }

    fn end_unwritten(&mut self, id: WriteId, end: WriteEnd) {
        let Some(call) = self.calls.remove(&id) else { return };
        if matches!(call.kind, Kind::Claim {}) {
            if let Some(r) = self.resolver.as_mut() {
                r.on_claim(false);
            }
        }
        let ends_notice = !matches!(call.kind, Kind::Acknowledge {});
        self.outbox.push_back(DriverAction::Finished { call, end, ends_notice });
    }

    /// The handler closes at `at`: every acknowledgement, then an announce, gets
    /// one last attempt, due at once; a claim is dropped ([`crate::writes::Writes::close`]).
    pub fn close(&mut self, at: f64) {
        let closing = self.writes.close(at);
        if let Some(call) = closing.dropped.and_then(|id| self.calls.remove(&id)) {
            self.outbox.push_back(DriverAction::Dropped { call });
        }
    }

    /// What the driver does at `at`: report what a write came to (oldest
    /// first), else attempt the most urgent write that is due
    /// (acknowledgements first); `None` when nothing is.
    pub fn poll(&mut self, at: f64) -> Option<DriverAction> {
        if let Some(report) = self.outbox.pop_front() {
            return Some(report);
        }
        let id = self.writes.poll_action(at)?;
        let call = self.calls.get(&id)?.clone();
        Some(DriverAction::Write { id, call })
    }

    /// When to poll next, on the driver's clock: at once with a report waiting,
    /// else when the next write is due; `None` with nothing pending (the
    /// driver then waits for an input).
    #[must_use]
    pub fn poll_timeout(&self) -> Option<f64> {
        if self.outbox.is_empty() {
            self.writes.poll_timeout()
        } else {
            Some(f64::NEG_INFINITY)
        }
    }

    /// A notice's write (claim or announce) is pending: the next notice waits.
    #[must_use]
    pub fn writes_busy(&self) -> bool {
        self.writes.busy()
    }

    /// What the pending write `id` sets, `None` once it ended.
    #[must_use]
    pub fn write_call(&self, id: WriteId) -> Option<&SetCall> {
        self.calls.get(&id)
    }

    /// The newest pending write's handle: what a test follows after an event
    /// queued one.
    #[cfg(test)]
    pub(super) fn newest_write(&self) -> Option<WriteId> {
        self.calls.keys().next_back().copied()
    }
}
