//! The driver's inbox: every input of a handler's protocol arrives here.
//!
//! A `PreemptionCheckpointHandler` reacts to four kinds of input, which come
//! from different threads at moments nobody chooses. They all end in one
//! [`Inbox`], and one loop (the driver, `python/tf_failure_handling/_protocol/driver.py`)
//! takes them out, asks the sans-IO resolver ([`crate::step_resolution`]) what
//! to do, and does it. The inbox decides nothing: it is plumbing, built on
//! `crossbeam-channel`.
//!
//! # Who posts what
//!
//! | input | posted by | thread |
//! | --- | --- | --- |
//! | [`Input::Notice`] (a signal) | the signal dispatcher ([`crate::sources::signals`]) | `tfh-signal-dispatch`, right after the self-pipe wakes it |
//! | [`Input::Notice`] (a cloud's announcement) | the metadata pollers ([`crate::sources`]) | `tfh-gce-*`, `tfh-aws-imds`, `tfh-azure-events`, on their first notice and on each that ends earlier |
//! | [`Input::Notice`] (a user's `termination_watcher_fn`, a test) | the watcher-fn poller and `testing` | Python threads, through the binding |
//! | [`Input::StepKey`] | the step-key reader: it blocks on the coordination service for `RUN_TO_CHECKPOINT` (then `LAST_RUN_TO_CHECKPOINT`) and posts each value it reads | `PeerTerminationWatcher-<id>` |
//! | [`Input::KeyReadFailed`] | the same reader, when reads of a step key failed for longer than the bound | `PeerTerminationWatcher-<id>` |
//! | [`Input::Stop`] | `close()` ([`Inbox::stop`], or a poster posting `Stop`) | whichever thread closes the handler |
//! | a deadline | the receiver itself: [`Inbox::recv_deadline`] ends at the deadline it is given (the next retry of a failed write is due) | the driver |
//!
//! Posting never blocks and never calls Python (a signal dispatcher or a
//! poller must not wait for the GIL), so it is safe from any thread, with or
//! without the GIL.
//!
//! # Order
//!
//! One receive takes the most urgent input: [`Input::Stop`] first (sticky:
//! once stopped, every receive returns it at once, whatever is still queued;
//! [`Inbox::drain`] then hands over what arrived before the stop), then step
//! keys and key-read failures, then notices, each kind first in, first out. Step keys come before notices because a step key is a leader
//! waiting, bounded by its peer timeout, for this worker's acknowledgement,
//! while a notice that arrives after a step key changes nothing (the resolver
//! absorbs it: the cluster is already going down at the leader's pace).
//!
//! # Bounds
//!
//! Step keys and key-read failures are at most a handful per handler (one
//! value per round and a failure that ends the reader), so their queue is
//! unbounded. Notices are bounded by [`NOTICE_CAPACITY`]: a storm of signals
//! while the driver is inside one call fills it, and a notice beyond it is
//! dropped and counted ([`Inbox::dropped_notices`]): a storm is of one
//! signal, whose notices end together, and the resolver absorbs all but the
//! first and any that ends earlier, so a dropped one changes nothing. The
//! signal dispatcher coalesces too: one wake-up posts at most one notice per
//! signal per inbox, however many deliveries it saw.
//!
//! When every [`Poster`] is gone and the queues are empty, a receive reports
//! [`RecvError::Disconnected`]: nothing can arrive any more. The Python
//! binding keeps a poster until [`Inbox::stop`], so its receiver sees `Stop`.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{at, bounded, never, select_biased, unbounded, Receiver, Sender, TrySendError};
use parking_lot::Mutex;
use thiserror::Error;

use crate::step_resolution::Round;

/// Notices that can wait in an inbox; see "Bounds".
pub const NOTICE_CAPACITY: usize = 1024;
/// Bound, in seconds, at interpreter exit, on the wait for every thread to leave the
/// wait of an inbox or a watcher-fn poll ([`InWait`]; the binding's exit hook, after
/// `_platforms/notice_sources.py` closed every open notice sources): closing wakes
/// them at once; the bound only keeps a stuck one from delaying the exit.
pub const EXIT_JOIN_TIMEOUT: f64 = 2.0;

/// Threads inside a wait of an inbox or a watcher-fn poll, as the binding counts them:
/// the interpreter's exit waits for none to be left (`src/python/sources.rs`,
/// `at_exit`), since a daemon thread still in one when the interpreter finalizes would
/// abort the process.
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// Counts its thread in [`WAITING`] while it lives (the binding drops it once the
/// thread holds the GIL again, so the thread is back in Python when the count says it
/// left).
pub struct InWait;

impl InWait {
    /// Counts this thread until the guard is dropped.
    #[must_use]
    pub fn enter() -> Self {
        WAITING.fetch_add(1, Ordering::SeqCst);
        InWait
    }

    /// Whether no thread is inside a native wait of an inbox or poll.
    #[must_use]
    pub fn none() -> bool {
        WAITING.load(Ordering::SeqCst) == 0
    }
}

impl Drop for InWait {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Where a notice came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// This signal was delivered to the process.
    Signal(i32),
    /// Any other source, as it describes itself (a metadata service's
    /// announcement, `termination_watcher_fn`, a test).
    Source(String),
}

crate::wire! {
    /// One input of the driver. A key-read failure names its round; the error
    /// itself stays with whoever read (the Python side keeps TF's exception).
    pub enum Input via input {
        /// The machine is going away: a notice from `signal` (its number) for a
        /// signal, else from `source` (as the source describes itself); `at` when
        /// the source saw it, `deadline` when the platform takes the machine away,
        /// `kill` when the platform stated it ends this process
        /// (`crate::notice::Notice::kill`: a cloud's announced end, a notice
        /// handed on with its own; None for a signal, whose platform says when
        /// it is taken), all Unix seconds.
        Notice {
            source: Option<String> = None,
            signal: Option<i32> = None,
            at: f64 = 0.0,
            deadline: Option<f64> = None,
            kill: Option<f64> = None,
        },
        /// The reader read `value` (a run count, or `STOP_WATCHER`) from
        /// `round`'s step key.
        StepKey { round: Round, value: String },
        /// Reading `round`'s step key failed for longer than the bound; the
        /// reader has ended.
        KeyReadFailed { round: Round },
        /// `close()`: the driver ends.
        Stop {},
    }
}

/// Why a [`Poster::post`] did not queue its input.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PostError {
    /// The inbox was stopped: nothing posted from now on is received.
    #[error("the inbox is stopped")]
    Stopped,
    /// [`NOTICE_CAPACITY`] notices are waiting; this one was dropped.
    #[error("{NOTICE_CAPACITY} notices are already waiting; this one was dropped")]
    Full,
    /// The inbox itself is gone.
    #[error("the inbox is gone")]
    Disconnected,
}

/// Why an [`Inbox::recv_deadline`] returned no input.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
pub enum RecvError {
    /// The deadline passed first.
    #[error("no input before the deadline")]
    Timeout,
    /// Every poster is gone and nothing is queued: no input can arrive.
    #[error("every poster is gone")]
    Disconnected,
}

/// What posters and the inbox share.
#[derive(Debug)]
struct Shared {
    stopped: AtomicBool,
    dropped: AtomicU64,
    /// The only sender of the inbox's stop channel; dropping it (on stop)
    /// wakes every receive blocked in a `select` at once. Nothing is ever
    /// sent on it.
    stopper: Mutex<Option<Sender<()>>>,
}

impl Shared {
    fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Dropped outside the lock (the drop wakes the receivers).
        let stopper = self.stopper.lock().take();
        drop(stopper);
    }
}

/// A handle to post into an [`Inbox`]; cheap to clone, one per source.
#[derive(Debug)]
pub struct Poster {
    keys: Sender<Input>,
    notices: Sender<Input>,
    shared: Arc<Shared>,
}

impl Clone for Poster {
    fn clone(&self) -> Self {
        Poster {
            keys: self.keys.clone(),
            notices: self.notices.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Poster {
    /// Queues `input` without blocking. Posting [`Input::Stop`] is
    /// [`Inbox::stop`].
    ///
    /// # Errors
    ///
    /// [`PostError::Stopped`] once the inbox is stopped,
    /// [`PostError::Full`] when [`NOTICE_CAPACITY`] notices are waiting
    /// (counted, see [`Inbox::dropped_notices`]), and
    /// [`PostError::Disconnected`] when the inbox is gone.
    pub fn post(&self, input: Input) -> Result<(), PostError> {
        if self.shared.stopped.load(Ordering::SeqCst) {
            return Err(PostError::Stopped);
        }
        let channel = match input {
            Input::Notice { .. } => &self.notices,
            Input::StepKey { .. } | Input::KeyReadFailed { .. } => &self.keys,
            Input::Stop {} => {
                self.shared.stop();
                return Ok(());
            }
        };
        match channel.try_send(input) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.shared.dropped.fetch_add(1, Ordering::SeqCst);
                Err(PostError::Full)
            }
            Err(TrySendError::Disconnected(_)) => Err(PostError::Disconnected),
        }
    }

    /// Posts a notice seen now (`at`, Unix seconds).
    ///
    /// # Errors
    ///
    /// As [`Poster::post`].
    pub fn notice(&self, origin: Origin, at: f64, deadline: Option<f64>, kill: Option<f64>) -> Result<(), PostError> {
        let (source, signal) = match origin {
            Origin::Signal(signal) => (None, Some(signal)),
            Origin::Source(source) => (Some(source), None),
        };
        self.post(Input::Notice {
            source,
            signal,
            at,
            deadline,
            kill,
        })
    }
}

/// The receiving end: one per handler (or watcher), read by one driver.
#[derive(Debug)]
pub struct Inbox {
    keys: Receiver<Input>,
    notices: Receiver<Input>,
    /// Disconnected by [`Inbox::stop`] (see [`Shared`]).
    stop: Receiver<()>,
    shared: Arc<Shared>,
}

impl Inbox {
    /// An empty inbox and the first poster (clone it for every source).
    #[must_use]
    pub fn new() -> (Self, Poster) {
        let (keys_tx, keys) = unbounded();
        let (notices_tx, notices) = bounded(NOTICE_CAPACITY);
        let (stopper, stop) = bounded(0);
        let shared = Arc::new(Shared {
            stopped: AtomicBool::new(false),
            dropped: AtomicU64::new(0),
            stopper: Mutex::new(Some(stopper)),
        });
        let inbox = Inbox {
            keys,
            notices,
            stop,
            shared: Arc::clone(&shared),
        };
        (
            inbox,
            Poster {
                keys: keys_tx,
                notices: notices_tx,
                shared,
            },
        )
    }

    /// Stops the inbox: every receive, blocked or later, returns
    /// [`Input::Stop`], and posts fail with [`PostError::Stopped`].
    /// Idempotent; never blocks.
    pub fn stop(&self) {
        self.shared.stop();
    }

    /// Whether [`Inbox::stop`] was called.
    #[must_use]
    pub fn stopped(&self) -> bool {
        self.shared.stopped.load(Ordering::SeqCst)
    }

    /// Notices dropped because [`NOTICE_CAPACITY`] were waiting.
    #[must_use]
    pub fn dropped_notices(&self) -> u64 {
        self.shared.dropped.load(Ordering::SeqCst)
    }

    /// The most urgent input (see "Order"), waiting until `deadline` (None:
    /// as long as it takes).
    ///
    /// # Errors
    ///
    /// [`RecvError::Timeout`] when `deadline` passes first (at once when it
    /// has passed and nothing is queued); [`RecvError::Disconnected`] when
    /// every poster is gone and nothing is queued.
    pub fn recv_deadline(&self, deadline: Option<Instant>) -> Result<Input, RecvError> {
        if self.stopped() {
            return Ok(Input::Stop {});
        }
        // The deadline is one more channel: it fires last, so an input that
        // is already queued wins over a deadline that has already passed.
        let timer = deadline.map_or_else(never, at);
        select_biased! {
            recv(self.stop) -> _ => Ok(Input::Stop {}),
            recv(self.keys) -> key => match key {
                Ok(input) => Ok(input),
                // Every poster is gone; a notice may still be queued.
                Err(_) => self.notices.try_recv().map_err(|_| RecvError::Disconnected),
            },
            recv(self.notices) -> notice => match notice {
                Ok(input) => Ok(input),
                Err(_) => self.keys.try_recv().map_err(|_| RecvError::Disconnected),
            },
            recv(timer) -> _ => Err(RecvError::Timeout),
        }
    }

    /// Takes every input still queued, without waiting, in the order a
    /// receive would (step keys and key-read failures, then notices), even
    /// once stopped: what arrived before a stop can still be dealt with
    /// (the driver acknowledges a step key on its way out).
    #[must_use]
    pub fn drain(&self) -> Vec<Input> {
        let mut out: Vec<Input> = self.keys.try_iter().collect();
        out.extend(self.notices.try_iter());
        out
    }

    /// [`Inbox::recv_deadline`] with a deadline `timeout` from now.
    ///
    /// # Errors
    ///
    /// As [`Inbox::recv_deadline`].
    pub fn recv_timeout(&self, timeout: std::time::Duration) -> Result<Input, RecvError> {
        // A timeout too long to represent waits as long as it takes.
        self.recv_deadline(Instant::now().checked_add(timeout))
    }
}

#[cfg(test)]
mod tests;
