//! The follower's reader of the step keys, as events in and actions out: the
//! reader thread (`_protocol/step_keys.py`) reads the key the protocol names
//! for as long as it says ([`ReaderAction::Get`]), posts each value it is
//! told to ([`ReaderAction::Post`]) into the driver's inbox, waits the pauses
//! of the retry rule ([`ReaderAction::Pause`]) and raises what it ends with.
//!
//! | state | event | next |
//! | --- | --- | --- |
//! | a round's key to read | [`Protocol::reader_next`] | read it for at most [`PEER_WATCH_SLICE`] |
//! | reading | nothing set yet | read it again; a run of failures ends |
//! | reading | a value | post it; then the next round's key, none after `STOP_WATCHER` or the last round |
//! | reading | a failed read | a pause by the retry rule (its run starts at the first failure), or given up |
//! | reading | a failed read while closing | done |
//! | every round read | [`Protocol::reader_next`] | done |

use super::Protocol;
use crate::retry::{Retry, Verdict};
use crate::step_resolution::{Round, PEER_WATCH_SLICE, STOP_WATCHER};

crate::wire! {
    /// What the step-key reader thread does next (`Event.Reading`, `Read`,
    /// `ReadFailed` in; this out).
    pub enum ReaderAction via reader_action {
        /// Read `key` for at most `timeout` seconds; report its value
        /// (`Event.Read`).
        Get { key: String, timeout: f64 },
        /// The last read failed: wait `seconds` (`attempts` failed so far,
        /// `left` seconds of the bound remain), then go on (`Event.Reading`).
        Pause { seconds: f64, what: String, attempts: u32, left: f64 },
        /// Post `value` of `round`'s key into the driver's inbox, then go on.
        Post { round: Round, value: String },
        /// The retry rule gave up on `what`: raise the last error, named.
        GaveUp { what: String, attempts: u32, seconds: f64 },
        /// Nothing more to read.
        Done {},
    }
}

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
    pub fn reader_next(&mut self) -> ReaderAction {
        match self.reader_key() {
            Some(round) => ReaderAction::Get {
                key: round.key().to_owned(),
                timeout: PEER_WATCH_SLICE,
            },
            None => ReaderAction::Done {},
        }
    }

    /// The read answered: `value`, or None while the key is not set.
    pub fn reader_read(&mut self, value: Option<&str>) -> ReaderAction {
        self.reader.failing = None;
        let Some(round) = self.reader_key() else {
            return ReaderAction::Done {};
        };
        let Some(value) = value else {
            return self.reader_next();
        };
        self.reader.round += 1;
        self.reader.stopped = value == STOP_WATCHER;
        ReaderAction::Post {
            round,
            value: value.to_owned(),
        }
    }

    /// The read failed at `at` (`closing`: done); a run of failures starting
    /// now is retried for the retry bound at `now`.
    pub fn reader_failed(&mut self, now: f64, at: f64, closing: bool) -> ReaderAction {
        let Some(round) = self.reader_key() else {
            return ReaderAction::Done {};
        };
        if closing {
            self.reader.stopped = true;
            return ReaderAction::Done {};
        }
        let bound = self.retry_bound(now);
        let retry = self.reader.failing.get_or_insert_with(|| Retry::new(bound).started(at));
        let what = format!("reading {}", round.key());
        match retry.failed(at, false) {
            Verdict::Again { at: next, left } => ReaderAction::Pause {
                seconds: (next - at).max(0.0),
                what,
                attempts: retry.attempts(),
                left,
            },
            Verdict::GiveUp { attempts, seconds } => {
                self.reader.stopped = true;
                ReaderAction::GaveUp { what, attempts, seconds }
            }
        }
    }
}
