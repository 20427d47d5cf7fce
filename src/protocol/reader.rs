//! The follower's reader of the step keys, as events in and actions out: the
//! reader thread (`_protocol/step_keys.py`) reads the key the protocol names
//! for as long as it says ([`Action::Read`]), posts each value it is
//! told to ([`Action::Post`]) into the driver's inbox, waits the pauses
//! of the retry rule ([`Action::Pause`]) and raises what it ends with.
//!
//! | state | event | next |
//! | --- | --- | --- |
//! | a round's key to read | [`Protocol::reader_next`] | read it for at most [`PEER_WATCH_SLICE`] |
//! | reading | nothing set yet | read it again; a run of failures ends |
//! | reading | a value | post it; then the next round's key, none after `STOP_WATCHER` or the last round |
//! | reading | a failed read | a pause by the retry rule (its run starts at the first failure), or given up |
//! | reading | a failed read while closing | done |
//! | every round read | [`Protocol::reader_next`] | done |

use super::{Action, Protocol};
use crate::retry::{Retry, Verdict};
use crate::step_resolution::{Round, PEER_WATCH_SLICE, STOP_WATCHER};

/// The reader's place: which round's key it reads, and its run of failures.
#[derive(Debug, Default)]
pub(super) struct Reader {
    round: usize,
    failing: Option<Retry>,
    stopped: bool,
}

impl Protocol {
    fn reader_key(&self) -> Option<Round> {
        if self.reader.stopped {
            return None;
        }
        self.resolver.as_ref()?.rounds().get(self.reader.round).copied()
    }

    /// What the reader does now: read the key of the round it is at, or done.
    pub fn reader_next(&mut self) -> Action {
        match self.reader_key() {
            Some(round) => Action::Read {
                key: round.key().to_owned(),
                timeout: PEER_WATCH_SLICE,
            },
            None => Action::Done {},
        }
    }

    /// The read answered: `value`, or None while the key is not set.
    pub fn reader_read(&mut self, value: Option<&str>) -> Action {
        self.reader.failing = None;
        let Some(round) = self.reader_key() else {
            return Action::Done {};
        };
        let Some(value) = value else {
            return self.reader_next();
        };
        self.reader.round += 1;
        self.reader.stopped = value == STOP_WATCHER;
        Action::Post {
            round,
            value: value.to_owned(),
        }
    }

    /// The read failed at `at` (`closing`: done); a run of failures starting
    /// now is retried for the retry bound at `now`.
    pub fn reader_failed(&mut self, now: f64, at: f64, closing: bool) -> Action {
        let Some(round) = self.reader_key() else {
            return Action::Done {};
        };
        if closing {
            self.reader.stopped = true;
            return Action::Done {};
        }
        let bound = self.retry_bound(now);
        let retry = self.reader.failing.get_or_insert_with(|| Retry::new(bound).started(at));
        let what = format!("reading {}", round.key());
        match retry.failed(at, false) {
            Verdict::Again { at: next, left } => Action::Pause {
                seconds: (next - at).max(0.0),
                what,
                attempts: retry.attempts(),
                left,
            },
            Verdict::GiveUp { attempts, seconds } => {
                self.reader.stopped = true;
                self.unanswered(crate::failure::lost_peer::Detection::ProtocolUnanswered);
                Action::GaveUp { what, attempts, seconds }
            }
        }
    }
}
