//! The leader's round, as events in and actions out: publish the agreed step,
//! write its own acknowledgement, wait for everyone else's, name who is
//! missing. The training thread (`_protocol/agreement.py`) performs each call
//! the protocol asks for ([`Action::Set`], [`Action::Get`]),
//! reports its outcome ([`Protocol::leader_called`],
//! [`Protocol::leader_call_failed`]), waits the pauses it is given
//! ([`Action::Pause`]) and raises what the round ends with.
//!
//! Every decision is here: each call's timeout, the retry rule over a failing
//! call (the bound from the leading notice's deadline, the pauses, when to
//! give up), what a publish that another worker made first comes to (its
//! value, read back, is the agreed step), the wait for the acknowledgements
//! ([`crate::acks`], bounded by the peer timeout) and its last look at the
//! keys still missing.
//!
//! | phase | outcome | next |
//! | --- | --- | --- |
//! | publish | written | own acknowledgement (a cluster), else recorded |
//! | publish | the key was set already | read it back ([`READ_BACK_TIMEOUT`]); its value is the agreed step: [`Action::Lost`] |
//! | publish, read back, own acknowledgement | failed | a pause by the retry rule, or [`Action::GaveUp`] |
//! | own acknowledgement | written | [`Action::Published`] (recorded), then the wait |
//! | wait | every key read | [`Action::Agreed {}`] (its duration goes to the planner) |
//! | wait | a read failed | a pause (never past the wait's end), or given up |
//! | wait | the peer timeout passed while reads fail | [`Action::GaveUp`]: the service's error, not a silent peer |
//! | wait | the peer timeout passed | one last read of each missing key ([`LAST_LOOK_TIMEOUT`]), then [`Action::Missing`], or agreed when none is |

use std::collections::VecDeque;

use super::{Action, ConfigError, Protocol};
use crate::acks::AckStep;
use crate::failure::lost_peer::Detection;
use crate::retry::{Retry, Verdict};
use crate::step_resolution::{write_timeout, Round, StepKeyError, WriteBound, ACK_VALUE};

/// Seconds the read of a step key another worker published first may take.
pub const READ_BACK_TIMEOUT: f64 = 1.0;
/// Seconds each last read of a missing acknowledgement may take: the key is
/// written or not by now, nothing is waited for.
pub const LAST_LOOK_TIMEOUT: f64 = 0.001;

#[derive(Debug)]
enum Phase {
    /// The round is to be published: its retry run starts at the first call.
    Start,
    /// Local mode: the round is recorded, nobody is written to or waited for.
    Record,
    /// Local mode, recorded: agreed.
    LocalDone,
    /// Publishing the round's key (its retry run).
    Publish(Retry),
    /// Reading the key another worker published first.
    ReadBack(Retry),
    /// Writing this worker's own acknowledgement.
    OwnAck(Retry),
    /// Recorded; the wait starts at the next resume.
    Published,
    /// Waiting for the acknowledgements (`Protocol::acks`).
    Acks,
    /// The last read of each key still missing.
    LastLook { pending: VecDeque<String>, missing: Vec<String> },
}

/// One leader's round in progress.
#[derive(Debug)]
pub(super) struct Agreeing {
    round: Round,
    step: u64,
    ack_keys: Vec<String>,
    own_ack_key: Option<String>,
    /// When the round started, on the protocol's clock: its duration is an
    /// agreement's for the planner.
    started: f64,
    phase: Phase,
    /// The acknowledgement being read.
    reading: String,
}

impl Agreeing {
    pub(super) fn new(round: Round, step: u64, ack_keys: Vec<String>, own_ack_key: Option<String>, started: f64) -> Self {
        Agreeing {
            round,
            step,
            ack_keys,
            own_ack_key,
            started,
            phase: Phase::Start,
            reading: String::new(),
        }
    }
}

impl Protocol {
    fn write_call_timeout(&self) -> f64 {
        write_timeout(self.peer_timeout, WriteBound::Protocol)
    }

    /// A retry run for one blocking call, started at `at`, retried for the
    /// retry bound at `now`.
    fn blocking_retry(&self, now: f64, at: f64) -> Retry {
        Retry::new(self.retry_bound(now)).started(at)
    }

    /// What the leader's training thread does now (`now` on the protocol's
    /// clock, `at` on the driver's): the first call of the round published by
    /// the last [`before_step`](Self::before_step), or the one after a pause or
    /// a record. [`Action::Agreed {}`] with no round in progress.
    pub fn leader_next(&mut self, now: f64, at: f64) -> Action {
        let Some(mut agreeing) = self.agreeing.take() else {
            return Action::Agreed {};
        };
        let action = match &mut agreeing.phase {
            Phase::Start => {
                let mut retry = self.blocking_retry(now, at);
                retry.attempt(at);
                agreeing.phase = Phase::Publish(retry);
                self.call_of(&agreeing)
            }
            Phase::Record => {
                agreeing.phase = Phase::LocalDone;
                Action::Published {
                    round: agreeing.round,
                    step: agreeing.step,
                }
            }
            Phase::LocalDone => return Action::Agreed {},
            Phase::Publish(retry) | Phase::OwnAck(retry) | Phase::ReadBack(retry) => {
                retry.attempt(at);
                self.call_of(&agreeing)
            }
            Phase::Published => {
                if self.acks.is_none() {
                    self.start_ack_wait(agreeing.ack_keys.clone(), at);
                }
                agreeing.phase = Phase::Acks;
                return self.ack_step(agreeing, now, at);
            }
            Phase::Acks => return self.ack_step(agreeing, now, at),
            Phase::LastLook { .. } => return self.last_look(agreeing, now),
        };
        self.agreeing = Some(agreeing);
        action
    }

    /// The call of a publishing phase.
    fn call_of(&self, agreeing: &Agreeing) -> Action {
        let key = agreeing.round.key();
        match &agreeing.phase {
            Phase::Publish(_) => Action::Set {
                key: key.to_owned(),
                value: agreeing.step.to_string(),
                timeout: self.write_call_timeout(),
                what: format!("publishing {key}={}", agreeing.step),
            },
            Phase::ReadBack(_) => Action::Get {
                key: key.to_owned(),
                timeout: READ_BACK_TIMEOUT,
                what: format!("reading {key}"),
                ack: false,
            },
            _ => {
                let own = agreeing.own_ack_key.clone().unwrap_or_default();
                Action::Set {
                    what: format!("acknowledging {key}={} with {own}", agreeing.step),
                    key: own,
                    value: ACK_VALUE.to_owned(),
                    timeout: self.write_call_timeout(),
                }
            }
        }
    }

    /// The wait for the acknowledgements, at `at`.
    fn ack_step(&mut self, mut agreeing: Agreeing, now: f64, at: f64) -> Action {
        match self.ack_next(at) {
            AckStep::Read { key, timeout } => {
                agreeing.reading.clone_from(&key);
                let action = Action::Get {
                    what: format!("reading {key}"),
                    key,
                    timeout,
                    ack: true,
                };
                self.agreeing = Some(agreeing);
                action
            }
            AckStep::Done => self.agreed(&agreeing, now),
            AckStep::Over { missing } => {
                if let Some((attempts, seconds)) = self.ack_failing(at) {
                    // The wait ended while reads were failing: the service's
                    // error, not a silent peer, is what to report.
                    self.acks = None;
                    self.unanswered(Detection::ProtocolUnanswered);
                    return Action::GaveUp {
                        what: format!("reading {}", missing[0]),
                        attempts,
                        seconds,
                    };
                }
                agreeing.phase = Phase::LastLook {
                    pending: missing.into(),
                    missing: Vec::new(),
                };
                self.last_look(agreeing, now)
            }
        }
    }

    /// The last look at the keys still missing: the next read, or the end.
    fn last_look(&mut self, mut agreeing: Agreeing, now: f64) -> Action {
        let Phase::LastLook { pending, missing } = &mut agreeing.phase else {
            unreachable!("only in the last look")
        };
        if let Some(key) = pending.front() {
            let action = Action::Get {
                what: format!("reading {key}"),
                key: key.clone(),
                timeout: LAST_LOOK_TIMEOUT,
                ack: false,
            };
            self.agreeing = Some(agreeing);
            return action;
        }
        if missing.is_empty() {
            return self.agreed(&agreeing, now);
        }
        self.acks = None;
        self.unanswered(Detection::Unacknowledged);
        Action::Missing {
            round: agreeing.round,
            step: agreeing.step,
            missing: std::mem::take(missing),
        }
    }

    fn agreed(&mut self, agreeing: &Agreeing, now: f64) -> Action {
        self.acks = None;
        self.handle_agreement((now - agreeing.started).max(0.0));
        Action::Agreed {}
    }

    /// The leader's call answered: `value` is what a read found, or for a write
    /// `Some` when it was written (`None`: the key existed already). What next.
    ///
    /// # Errors
    ///
    /// A malformed value another worker published first, or no configuration.
    pub fn leader_called(&mut self, value: Option<&str>, now: f64, at: f64) -> Result<Action, ConfigError> {
        let Some(mut agreeing) = self.agreeing.take() else {
            return Ok(Action::Agreed {});
        };
        match &mut agreeing.phase {
            Phase::Publish(_) if value.is_none() => {
                // Another worker published this round first (a tighter notice of
                // its own), or a peer shut down (STOP_WATCHER): the key's value
                // is the step.
                agreeing.phase = Phase::ReadBack(self.blocking_retry(now, at));
            }
            Phase::Publish(_) => match agreeing.own_ack_key {
                Some(_) => agreeing.phase = Phase::OwnAck(self.blocking_retry(now, at)),
                None => {
                    agreeing.phase = Phase::Published;
                    let action = Action::Published {
                        round: agreeing.round,
                        step: agreeing.step,
                    };
                    self.agreeing = Some(agreeing);
                    return Ok(action);
                }
            },
            Phase::ReadBack(_) => {
                let round = agreeing.round;
                if let Some(v) = value {
                    self.handle_publish_lost(round, v)?
                        .map_err(|e: StepKeyError| ConfigError::StepKey(e.to_string()))?;
                }
                self.agreeing = None;
                return Ok(Action::Lost {
                    round,
                    value: value.map(str::to_owned),
                });
            }
            Phase::OwnAck(_) => {
                agreeing.phase = Phase::Published;
                let action = Action::Published {
                    round: agreeing.round,
                    step: agreeing.step,
                };
                self.agreeing = Some(agreeing);
                return Ok(action);
            }
            Phase::Acks => {
                self.handle_ack_read(value.is_some());
                return Ok(self.ack_step(agreeing, now, at));
            }
            Phase::LastLook { pending, missing } => {
                if let Some(key) = pending.pop_front() {
                    if value.is_none() {
                        missing.push(key);
                    }
                }
                return Ok(self.last_look(agreeing, now));
            }
            Phase::Published | Phase::Start | Phase::Record | Phase::LocalDone => {}
        }
        self.agreeing = Some(agreeing);
        Ok(self.leader_next(now, at))
    }

    /// The leader's call failed with a coordination-service error at `at`
    /// (`closing`: nothing is retried): a pause, or given up.
    pub fn leader_call_failed(&mut self, now: f64, at: f64, closing: bool) -> Action {
        let Some(mut agreeing) = self.agreeing.take() else {
            return Action::Agreed {};
        };
        let what = match &mut agreeing.phase {
            Phase::Publish(_) | Phase::OwnAck(_) | Phase::ReadBack(_) => match self.call_of(&agreeing) {
                Action::Set { what, .. } | Action::Get { what, .. } => what,
                _ => String::new(),
            },
            Phase::Acks => {
                let key = agreeing.reading.clone();
                let verdict = self.handle_ack_read_failed(now, at, closing);
                let attempts = self.ack_failing(at).map_or(1, |(a, _)| a);
                return match verdict {
                    Some(Verdict::Again { at: next, left }) => {
                        self.agreeing = Some(agreeing);
                        Action::Pause {
                            seconds: (next - at).max(0.0),
                            what: format!("reading {key}"),
                            attempts,
                            left,
                        }
                    }
                    Some(Verdict::GiveUp { attempts, seconds }) => {
                        self.acks = None;
                        self.unanswered(Detection::ProtocolUnanswered);
                        Action::GaveUp {
                            what: format!("reading {key}"),
                            attempts,
                            seconds,
                        }
                    }
                    None => Action::Agreed {},
                };
            }
            Phase::LastLook { pending, missing } => {
                // A failed last read: that worker is named missing.
                if let Some(key) = pending.pop_front() {
                    missing.push(key);
                }
                return self.last_look(agreeing, now);
            }
            Phase::Published | Phase::Start | Phase::Record | Phase::LocalDone => {
                self.agreeing = Some(agreeing);
                return self.leader_next(now, at);
            }
        };
        let verdict = match &mut agreeing.phase {
            Phase::Publish(r) | Phase::OwnAck(r) | Phase::ReadBack(r) => r.failed(at, closing),
            _ => unreachable!("a call's phase"),
        };
        match verdict {
            Verdict::Again { at: next, left } => {
                let attempts = match &agreeing.phase {
                    Phase::Publish(r) | Phase::OwnAck(r) | Phase::ReadBack(r) => r.attempts(),
                    _ => 1,
                };
                self.agreeing = Some(agreeing);
                Action::Pause {
                    seconds: (next - at).max(0.0),
                    what,
                    attempts,
                    left,
                }
            }
            Verdict::GiveUp { attempts, seconds } => {
                self.unanswered(Detection::ProtocolUnanswered);
                Action::GaveUp { what, attempts, seconds }
            }
        }
    }

    /// Starts the leader's round `before_step` published at `now`; its first
    /// call comes out of [`leader_next`](Self::leader_next).
    pub(super) fn start_round(&mut self, round: Round, step: u64, ack_keys: Vec<String>, own_ack_key: Option<String>, now: f64) {
        let mut agreeing = Agreeing::new(round, step, ack_keys, own_ack_key, now);
        if agreeing.ack_keys.is_empty() && agreeing.own_ack_key.is_none() {
            agreeing.phase = Phase::Record;
        }
        self.acks = None;
        self.agreeing = Some(agreeing);
    }
}
