//! The `ClusterCoordinator`'s closure queue: what is scheduled, what is
//! running, and the first error, with TensorFlow 2.21's semantics
//! (`_CoordinatedClosureQueue` in
//! `tensorflow/python/distribute/coordinator/cluster_coordinator.py`).
//!
//! # Actors
//!
//! * The **scheduler** (the user's thread, through `ClusterCoordinator.schedule`,
//!   `join` and `done`) calls [`ClosureQueue::put`], [`ClosureQueue::waiter`]
//!   and [`ClosureQueue::done`].
//! * One **worker** thread per remote worker loops on [`ClosureQueue::get`] with
//!   its own index as tag, runs the closure, then reports it with exactly one of
//!   [`ClosureQueue::mark_finished`], [`ClosureQueue::put_back`] (the worker
//!   was preempted: run it again elsewhere) or [`ClosureQueue::mark_failed`].
//!   Per-worker resource closures are put with the worker's tag.
//! * The coordinator's shutdown calls [`ClosureQueue::stop`].
//!
//! # State
//!
//! * the **main queue**, FIFO, bounded by the capacity given to
//!   [`ClosureQueue::new`] (TensorFlow: 256 × 1024; 0 = unbounded);
//! * one unbounded FIFO per **tag**, served before the main queue to the worker
//!   with that tag. Tagged closures are never counted in flight, never put back
//!   and never cancelled (as in TensorFlow);
//! * **in flight**: closures taken from the main queue and not yet reported.
//!   It cannot go negative: a report with nothing in flight is an
//!   [`CompletionError::NothingInFlight`] (TensorFlow's `AssertionError`);
//! * the pending **error**: the first one reported by `mark_failed` since the
//!   last cancellation (later ones are dropped);
//! * the **gate** (TensorFlow's `_put_wait_lock`): closed while a wait runs
//!   ([`Waiter`] alive) or a cancellation runs ([`Cancellation`] alive). An
//!   untagged put does not enqueue while the gate is closed, so a wait is never
//!   answerable for closures put after it started;
//! * **stopped**: set once by `stop`; every get then returns
//!   [`GetError::Stopped`].
//!
//! # Operations
//!
//! * `put(item)` (untagged) waits until the gate is open and the main queue
//!   has room, enqueues at the tail, and, if an error is pending, starts a
//!   cancellation and returns it: the caller must raise that error (after
//!   enqueuing, as TensorFlow does, so the new closure is cancelled too). With an
//!   error pending it does not wait for room: the closure is about to be
//!   cancelled anyway (TensorFlow waits).
//! * `put_tagged(item, tag)` never blocks.
//! * `get(tag)` serves the tag's queue, then the main queue (that one counts in
//!   flight). It waits while both are empty — and, for the main queue, while a
//!   cancellation runs, so closures about to be cancelled are not started.
//! * `put_back(item)` returns an in-flight closure to the **tail** of the main
//!   queue without waiting for room: it was admitted once already, so the main
//!   queue exceeds its capacity by at most the number in flight (TensorFlow
//!   waits for room, and can deadlock when every worker puts back into a full
//!   queue). With an error pending the closure is handed back to be cancelled
//!   instead, still counted in flight until its [`InFlightSlot`] is dropped
//!   (TensorFlow cancels it under its lock before the count drops).
//! * a wait ([`Waiter`]) returns when nothing is queued or in flight, or starts
//!   a cancellation when an error is pending. Timeouts are deadlines: TensorFlow
//!   restarts its timeout at every wake-up, so a steady stream of
//!   `mark_finished` calls keeps `wait(timeout)` blocked forever.
//! * `done()` starts a cancellation when an error is pending, else reports
//!   whether nothing is queued or in flight. While another thread cancels it
//!   answers false without blocking.
//!
//! # Cancellation: two phases
//!
//! TensorFlow's `_cancel_all_closures`, run under its queue lock, calls the
//! cancellation manager's `start_cancel()` (so running closures abort), waits
//! until nothing is in flight, calls `mark_cancelled()` on every queued
//! closure, and replaces the cancellation manager. Those are calls into
//! Python, which must not happen under a Rust lock, so here a cancellation is
//! a [`Cancellation`] value:
//!
//! 1. `put`, a wait or `done` that finds an error pending (and no
//!    cancellation running) closes the gate and returns a [`Cancellation`];
//! 2. the caller, holding no lock, starts cancelling running closures
//!    (`start_cancel()`);
//! 3. the caller calls [`Cancellation::finish_until`] (or
//!    [`Cancellation::finish_timeout`]) in slices until nothing is in flight; it then drains the main queue, takes the error, opens the
//!    gate and returns both as [`Cancelled`];
//! 4. the caller, holding no lock, marks the drained closures cancelled,
//!    replaces its cancellation manager and raises the error.
//!
//! Dropping an unfinished [`Cancellation`] (the caller was interrupted)
//! abandons it: the gate opens, the error stays pending and the next put, wait
//! or done starts over.
//!
//! # Blocking
//!
//! Every blocking operation takes a deadline (`None` = no limit) and has a
//! non-blocking `try_` form. Those the Python binding calls (`put`, `get`,
//! [`Waiter::wait_until`], [`Cancellation::finish_until`]) also have a
//! `_timeout` form, which takes a duration instead: the binding hands the core
//! durations, never instants. Nothing here reads the clock but the `_timeout`
//! forms, which read it once to turn their duration into a deadline. Callers that must stay
//! responsive (the Python binding answers Ctrl-C) call them in short slices. A wait that times out re-checks its condition before reporting the
//! timeout, so a notification is never lost to a timeout racing it; that is
//! why single-waiter notifications (`notify_one`) are safe.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use thiserror::Error;

/// TensorFlow's `_CLOSURE_QUEUE_MAX_SIZE`: the main queue's default capacity.
pub const DEFAULT_CAPACITY: usize = 256 * 1024;

/// The three ways a worker reports an in-flight closure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// [`ClosureQueue::mark_finished`].
    MarkFinished,
    /// [`ClosureQueue::put_back`].
    PutBack,
    /// [`ClosureQueue::mark_failed`].
    MarkFailed,
}

impl Completion {
    /// TensorFlow's name for the operation.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Completion::MarkFinished => "mark_finished",
            Completion::PutBack => "put_back",
            Completion::MarkFailed => "mark_failed",
        }
    }
}

/// Errors of reporting a closure (`mark_finished`, `put_back`, `mark_failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CompletionError {
    /// Nothing is in flight, so nothing can be reported. The message is
    /// TensorFlow's `AssertionError` message.
    #[error("There is no inflight closures to {}.", .0.name())]
    NothingInFlight(Completion),
}

/// Errors of [`ClosureQueue::put`] and [`ClosureQueue::try_put`].
#[derive(Clone, PartialEq, Eq, Error)]
pub enum PutError<T> {
    /// The deadline passed while the main queue was full or the gate was
    /// closed; the item is handed back.
    #[error("the closure queue did not accept the closure before the deadline")]
    Timeout(T),
}

impl<T> fmt::Debug for PutError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Timeout(..)")
    }
}

impl<T> PutError<T> {
    /// The item that was not enqueued.
    pub fn into_inner(self) -> T {
        match self {
            PutError::Timeout(item) => item,
        }
    }
}

/// Errors of [`ClosureQueue::get`] and [`ClosureQueue::try_get`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum GetError {
    /// Nothing to serve before the deadline.
    #[error("no closure before the deadline")]
    Timeout,
    /// The queue was stopped.
    #[error("the closure queue is stopped")]
    Stopped,
}

/// Errors of [`Waiter::wait_until`] and [`Waiter::try_wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum WaitError {
    /// Closures were still queued or in flight at the deadline.
    #[error("closures still queued or in flight at the deadline")]
    Timeout,
}

/// Errors of [`Cancellation::finish_until`] and [`Cancellation::try_finish`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum CancelError {
    /// Closures were still in flight at the deadline; call again.
    #[error("closures still in flight at the deadline")]
    InFlight,
}

/// What an untagged put did.
#[must_use]
pub enum Put<'q, T, E, K> {
    /// Enqueued.
    Queued,
    /// Enqueued, and an error was pending: finish this cancellation and raise
    /// its error.
    Failed(Cancellation<'q, T, E, K>),
}

/// What `put_back` did.
#[must_use]
pub enum PutBack<'q, T, E, K> {
    /// Back at the tail of the main queue.
    Queued,
    /// An error is pending: cancel `item`, then drop `slot` (until then it
    /// is still counted in flight, so a cancellation waits for it).
    Cancel {
        /// The closure to cancel.
        item: T,
        /// Its place in the in-flight count.
        slot: InFlightSlot<'q, T, E, K>,
    },
}

/// How a worker reports a closure it took: the one event
/// [`ClosureQueue::finish`] takes (TensorFlow's `mark_finished`,
/// `mark_failed` and `put_back`, and the error of a worker thread that
/// stopped outside a closure).
pub enum Outcome<T, E> {
    /// The in-flight closure finished ([`ClosureQueue::mark_finished`]).
    Finished,
    /// The in-flight closure failed with this error ([`ClosureQueue::mark_failed`]).
    Failed(E),
    /// The in-flight closure goes back to the queue ([`ClosureQueue::put_back`]).
    PutBack(T),
    /// A worker thread stopped with this error and no closure in flight to
    /// report ([`ClosureQueue::fail`]).
    Stopped(E),
}

/// Seconds a worker thread of this package waits on the queue, or on its
/// holds, before it looks at its holds again: on the queue (`held` None), on
/// a strict hold (`Some(true)`), or on a hold that lets it take a closure
/// while the main queue is full (`Some(false)`: it looks at the queue's size
/// that often).
#[must_use]
pub fn worker_poll_timeout(held: Option<bool>) -> Duration {
    use crate::ps_control::{WORKER_GET_SLICE, WORKER_SOFT_SLICE};
    Duration::from_secs_f64(match held {
        None | Some(true) => WORKER_GET_SLICE,
        Some(false) => WORKER_SOFT_SLICE.min(WORKER_GET_SLICE),
    })
}

/// How a wait ended.
#[must_use]
pub enum Settled<'q, T, E, K> {
    /// Nothing queued or in flight.
    Done,
    /// An error is pending: finish this cancellation and raise its error.
    Failed(Cancellation<'q, T, E, K>),
}

/// What `done()` found.
#[must_use]
pub enum Done<'q, T, E, K> {
    /// Nothing queued or in flight.
    Yes,
    /// Closures queued or in flight, or another thread is cancelling.
    No,
    /// An error is pending: finish this cancellation and raise its error.
    Failed(Cancellation<'q, T, E, K>),
}

/// The result of a finished cancellation.
pub struct Cancelled<T, E> {
    /// The error to raise.
    pub error: E,
    /// The closures that were queued, in order: mark each cancelled.
    pub items: VecDeque<T>,
}

struct State<T, E, K> {
    main: VecDeque<T>,
    /// Main-queue capacity; 0 = unbounded.
    capacity: usize,
    tagged: HashMap<K, VecDeque<T>>,
    inflight: usize,
    error: Option<E>,
    /// Live [`Waiter`]s; the gate is closed while this is non-zero.
    waiters: usize,
    /// A [`Cancellation`] is alive; the gate is closed and main-queue gets
    /// wait.
    cancelling: bool,
    stopped: bool,
}

impl<T, E, K> State<T, E, K> {
    fn gate_closed(&self) -> bool {
        self.waiters > 0 || self.cancelling
    }

    fn full(&self) -> bool {
        self.capacity != 0 && self.main.len() >= self.capacity
    }

    /// Whether an untagged put may enqueue now.
    fn admits_put(&self) -> bool {
        !self.gate_closed() && (self.error.is_some() || !self.full())
    }

    /// Whether nothing is queued (main queue) or in flight.
    fn idle(&self) -> bool {
        self.main.is_empty() && self.inflight == 0
    }
}

/// A thread-safe closure queue with TensorFlow 2.21's semantics; see the
/// module documentation.
///
/// `T` is a closure, `E` an error, `K` a tag (a worker index).
pub struct ClosureQueue<T, E, K = i64> {
    state: Mutex<State<T, E, K>>,
    /// "A get may be served": an item reached a queue, a cancellation ended
    /// (main-queue gets resume), or the queue stopped. One waiter per untagged
    /// item; all on the rest (a tagged item is for one particular getter).
    queued: Condvar,
    /// "A blocked put may enqueue": a main-queue slot freed (one waiter), the
    /// gate opened or an error became pending (all waiters).
    admitted: Condvar,
    /// "A wait may return": nothing is queued or in flight, an error became
    /// pending, or a cancellation ended or was abandoned.
    stop_waiting: Condvar,
    /// "Nothing is in flight": what a cancellation waits for before draining.
    no_inflight: Condvar,
}

impl<T, E, K: Eq + Hash> ClosureQueue<T, E, K> {
    /// A queue whose main queue holds at most `capacity` closures (0:
    /// unbounded, like TensorFlow's `queue.Queue(maxsize=0)`).
    #[must_use]
    pub fn new(capacity: usize) -> Self {
        ClosureQueue {
            state: Mutex::new(State {
                main: VecDeque::new(),
                capacity,
                tagged: HashMap::new(),
                inflight: 0,
                error: None,
                waiters: 0,
                cancelling: false,
                stopped: false,
            }),
            queued: Condvar::new(),
            admitted: Condvar::new(),
            stop_waiting: Condvar::new(),
            no_inflight: Condvar::new(),
        }
    }

    /// Enqueues `item` on the main queue, waiting until `deadline` (`None`:
    /// no limit) while the queue is full or the gate is closed.
    ///
    /// # Errors
    ///
    /// [`PutError::Timeout`] (with the item) when it could not be enqueued
    /// before the deadline.
    pub fn put(&self, item: T, deadline: Option<Instant>) -> Result<Put<'_, T, E, K>, PutError<T>> {
        let mut s = self.state.lock();
        loop {
            if s.admits_put() {
                return Ok(self.enqueue(s, item));
            }
            if !wait(&self.admitted, &mut s, deadline) {
                if s.admits_put() {
                    return Ok(self.enqueue(s, item));
                }
                return Err(PutError::Timeout(item));
            }
        }
    }

    /// [`ClosureQueue::put`] with a deadline `timeout` from now (one too long
    /// to represent: no limit).
    ///
    /// # Errors
    ///
    /// As [`ClosureQueue::put`].
    pub fn put_timeout(&self, item: T, timeout: Duration) -> Result<Put<'_, T, E, K>, PutError<T>> {
        self.put(item, Instant::now().checked_add(timeout))
    }

    /// [`ClosureQueue::put`] without waiting.
    ///
    /// # Errors
    ///
    /// [`PutError::Timeout`] (with the item) when the queue is full or the
    /// gate closed.
    pub fn try_put(&self, item: T) -> Result<Put<'_, T, E, K>, PutError<T>> {
        let s = self.state.lock();
        if s.admits_put() {
            Ok(self.enqueue(s, item))
        } else {
            Err(PutError::Timeout(item))
        }
    }

    fn enqueue(&self, mut s: MutexGuard<'_, State<T, E, K>>, item: T) -> Put<'_, T, E, K> {
        s.main.push_back(item);
        if s.error.is_some() {
            s.cancelling = true;
            return Put::Failed(Cancellation::new(self));
        }
        drop(s);
        self.queued.notify_one();
        Put::Queued
    }

    /// Enqueues `item` on `tag`'s queue. Never blocks.
    pub fn put_tagged(&self, item: T, tag: K) {
        self.state.lock().tagged.entry(tag).or_default().push_back(item);
        self.queued.notify_all();
    }

    /// Takes the next closure for a worker: from `tag`'s queue first, then
    /// from the main queue (counted in flight). Waits until `deadline`
    /// (`None`: no limit) while there is none.
    ///
    /// # Errors
    ///
    /// [`GetError::Stopped`] once the queue is stopped (even with closures
    /// queued), [`GetError::Timeout`] at the deadline.
    pub fn get(&self, tag: Option<&K>, deadline: Option<Instant>) -> Result<T, GetError> {
        let mut s = self.state.lock();
        loop {
            if let Some(r) = self.take(&mut s, tag) {
                return r;
            }
            if !wait(&self.queued, &mut s, deadline) {
                return self.take(&mut s, tag).unwrap_or(Err(GetError::Timeout));
            }
        }
    }

    /// [`ClosureQueue::get`] with a deadline `timeout` from now (one too long
    /// to represent: no limit).
    ///
    /// # Errors
    ///
    /// As [`ClosureQueue::get`].
    pub fn get_timeout(&self, tag: Option<&K>, timeout: Duration) -> Result<T, GetError> {
        self.get(tag, Instant::now().checked_add(timeout))
    }

    /// [`ClosureQueue::get`] without waiting.
    ///
    /// # Errors
    ///
    /// [`GetError::Stopped`] once stopped, [`GetError::Timeout`] when there
    /// is nothing to serve now.
    pub fn try_get(&self, tag: Option<&K>) -> Result<T, GetError> {
        let mut s = self.state.lock();
        self.take(&mut s, tag).unwrap_or(Err(GetError::Timeout))
    }

    /// One attempt of a get; `None` when it must wait.
    fn take(&self, s: &mut State<T, E, K>, tag: Option<&K>) -> Option<Result<T, GetError>> {
        if s.stopped {
            return Some(Err(GetError::Stopped));
        }
        if let Some(item) = tag.and_then(|t| s.tagged.get_mut(t)).and_then(VecDeque::pop_front) {
            return Some(Ok(item));
        }
        if s.cancelling {
            return None;
        }
        let item = s.main.pop_front()?;
        s.inflight += 1;
        self.admitted.notify_one();
        Some(Ok(item))
    }

    /// Reports an in-flight closure as finished.
    ///
    /// # Errors
    ///
    /// [`CompletionError::NothingInFlight`] when nothing is in flight.
    pub fn mark_finished(&self) -> Result<(), CompletionError> {
        let mut s = self.state.lock();
        if s.inflight == 0 {
            return Err(CompletionError::NothingInFlight(Completion::MarkFinished));
        }
        self.release(&mut s);
        Ok(())
    }

    /// Returns an in-flight closure to the tail of the main queue (without
    /// waiting for room), or, when an error is pending, hands it back to be
    /// cancelled.
    ///
    /// # Errors
    ///
    /// [`CompletionError::NothingInFlight`] when nothing is in flight (the
    /// item is dropped after the lock is released).
    pub fn put_back(&self, item: T) -> Result<PutBack<'_, T, E, K>, CompletionError> {
        let mut s = self.state.lock();
        if s.inflight == 0 {
            drop(s);
            return Err(CompletionError::NothingInFlight(Completion::PutBack));
        }
        if s.error.is_some() {
            return Ok(PutBack::Cancel {
                item,
                slot: InFlightSlot { queue: self },
            });
        }
        s.main.push_back(item);
        self.release(&mut s);
        drop(s);
        self.queued.notify_one();
        Ok(PutBack::Queued)
    }

    /// Reports an in-flight closure as failed with `error`; the first error
    /// stays pending until a put, wait or done raises it. Wakes every wait.
    ///
    /// # Errors
    ///
    /// [`CompletionError::NothingInFlight`] when nothing is in flight. An
    /// error that is not kept is dropped after the lock is released.
    pub fn mark_failed(&self, error: E) -> Result<(), CompletionError> {
        let mut s = self.state.lock();
        if s.inflight == 0 {
            drop(s);
            return Err(CompletionError::NothingInFlight(Completion::MarkFailed));
        }
        let unused = Self::keep_first(&mut s, error);
        self.release(&mut s);
        drop(s);
        self.stop_waiting.notify_all();
        // A blocked put no longer needs room: it enqueues and cancels.
        self.admitted.notify_all();
        drop(unused);
        Ok(())
    }

    /// Makes `error` the pending error (the first one is kept) with no closure
    /// in flight to report: what a worker thread that stopped outside a
    /// closure leaves, so that the next put, wait or done raises it. Wakes
    /// every wait; an error that is not kept is dropped after the lock is
    /// released.
    pub fn fail(&self, error: E) {
        let mut s = self.state.lock();
        let unused = Self::keep_first(&mut s, error);
        drop(s);
        self.stop_waiting.notify_all();
        self.admitted.notify_all();
        drop(unused);
    }

    /// Reports a closure as `outcome` says: [`ClosureQueue::mark_finished`],
    /// [`ClosureQueue::mark_failed`], [`ClosureQueue::put_back`] or
    /// [`ClosureQueue::fail`]. What a put-back hands back for cancelling
    /// comes back as [`PutBack::Cancel`]; everything else as
    /// [`PutBack::Queued`].
    ///
    /// # Errors
    ///
    /// [`CompletionError::NothingInFlight`] when the outcome is of an
    /// in-flight closure and nothing is in flight.
    pub fn finish(&self, outcome: Outcome<T, E>) -> Result<PutBack<'_, T, E, K>, CompletionError> {
        match outcome {
            Outcome::Finished => self.mark_finished().map(|()| PutBack::Queued),
            Outcome::Failed(error) => self.mark_failed(error).map(|()| PutBack::Queued),
            Outcome::PutBack(item) => self.put_back(item),
            Outcome::Stopped(error) => {
                self.fail(error);
                Ok(PutBack::Queued)
            }
        }
    }

    /// Registers a wait: closes the gate to untagged puts until the
    /// [`Waiter`] is dropped.
    pub fn waiter(&self) -> Waiter<'_, T, E, K> {
        self.state.lock().waiters += 1;
        Waiter { queue: self }
    }

    /// Waits until nothing is queued or in flight or an error is pending;
    /// the same as [`ClosureQueue::waiter`] then [`Waiter::wait_until`].
    ///
    /// # Errors
    ///
    /// [`WaitError::Timeout`] at the deadline.
    pub fn wait(&self, deadline: Option<Instant>) -> Result<Settled<'_, T, E, K>, WaitError> {
        self.waiter().wait_until(deadline)
    }

    /// Whether nothing is queued or in flight; starts a cancellation when an
    /// error is pending.
    pub fn done(&self) -> Done<'_, T, E, K> {
        let mut s = self.state.lock();
        if s.cancelling {
            Done::No
        } else if s.error.is_some() {
            s.cancelling = true;
            Done::Failed(Cancellation::new(self))
        } else if s.idle() {
            Done::Yes
        } else {
            Done::No
        }
    }

    /// Stops the queue: every get, blocked or later, returns
    /// [`GetError::Stopped`]. Puts are unaffected (as in TensorFlow).
    pub fn stop(&self) {
        self.state.lock().stopped = true;
        self.queued.notify_all();
    }

    /// Whether [`ClosureQueue::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.state.lock().stopped
    }

    /// Empties `tag`'s queue and returns what it held (TensorFlow drops those
    /// closures without cancelling them).
    pub fn clear_tag(&self, tag: &K) -> VecDeque<T> {
        self.state.lock().tagged.remove(tag).unwrap_or_default()
    }

    /// Closures taken from the main queue and not yet reported.
    pub fn inflight(&self) -> usize {
        self.state.lock().inflight
    }

    /// Sets the in-flight count to `count`, as TensorFlow's tests do with
    /// `_inflight_closure_count += 1` to keep a `join()` from returning (and
    /// `-= 1` to let it). Reaching 0 wakes what waits for nothing in flight,
    /// as a finished closure does.
    pub fn set_inflight(&self, count: usize) {
        let mut s = self.state.lock();
        s.inflight = count;
        if count == 0 {
            self.no_inflight.notify_all();
            if s.main.is_empty() {
                self.stop_waiting.notify_all();
            }
        }
    }

    /// `f` of the pending error, if any, run under the queue's lock: it must
    /// not block (the binding only takes a new reference to it).
    pub fn with_error<R>(&self, f: impl FnOnce(Option<&E>) -> R) -> R {
        f(self.state.lock().error.as_ref())
    }

    /// Closures in the main queue.
    pub fn queued(&self) -> usize {
        self.state.lock().main.len()
    }

    /// Closures in `tag`'s queue.
    pub fn queued_tagged(&self, tag: &K) -> usize {
        self.state.lock().tagged.get(tag).map_or(0, VecDeque::len)
    }

    /// Whether an error is pending.
    pub fn has_error(&self) -> bool {
        self.state.lock().error.is_some()
    }

    /// Moves the main queue's closures that `rank` ranks to its head, by
    /// rank (ties in queue order); the others keep their order behind them.
    /// `rank` runs under the queue's lock. Returns how many were moved.
    pub fn promote(&self, mut rank: impl FnMut(&T) -> Option<usize>) -> usize {
        let mut s = self.state.lock();
        let mut picked: Vec<(usize, T)> = Vec::new();
        let mut rest = VecDeque::with_capacity(s.main.len());
        for item in s.main.drain(..) {
            match rank(&item) {
                Some(r) => picked.push((r, item)),
                None => rest.push_back(item),
            }
        }
        picked.sort_by_key(|(r, _)| *r);
        let moved = picked.len();
        s.main = picked.into_iter().map(|(_, item)| item).chain(rest).collect();
        moved
    }

    /// Calls `item` on every queued closure (main queue, then each tag's),
    /// under the queue's lock.
    pub fn visit(&self, mut item: impl FnMut(&T)) {
        let s = self.state.lock();
        s.main.iter().chain(s.tagged.values().flatten()).for_each(&mut item);
    }

    /// Calls `item` on every queued closure and `error` on the pending error,
    /// if the lock is free now (for a garbage collector's traversal, which
    /// must not block). Returns false, visiting nothing, when it is not.
    ///
    /// # Errors
    ///
    /// The first error a visitor returns; the visit stops there.
    pub fn try_visit<X>(&self, mut item: impl FnMut(&T) -> Result<(), X>, error: impl FnOnce(&E) -> Result<(), X>) -> Result<bool, X> {
        let Some(s) = self.state.try_lock() else {
            return Ok(false);
        };
        for it in s.main.iter().chain(s.tagged.values().flatten()) {
            item(it)?;
        }
        if let Some(e) = &s.error {
            error(e)?;
        }
        Ok(true)
    }

    /// Takes every queued closure (main queue, then each tag's queue) and the
    /// pending error out of the queue, for a garbage collector breaking a
    /// reference cycle. The in-flight count is left alone.
    pub fn take_all(&self) -> (Vec<T>, Option<E>) {
        let mut s = self.state.lock();
        let mut items: Vec<T> = s.main.drain(..).collect();
        for (_, q) in s.tagged.drain() {
            items.extend(q);
        }
        // A live cancellation owns the error (it cannot be, while a collector
        // runs: the cancelling call holds a reference), so leave it alone.
        let error = if s.cancelling { None } else { s.error.take() };
        drop(s);
        self.admitted.notify_all();
        self.stop_waiting.notify_all();
        (items, error)
    }
}

/// Waits on `cv` until `deadline` (`None`: no limit). False when the deadline
/// passed; the caller re-checks its condition either way.
fn wait<S>(cv: &Condvar, guard: &mut MutexGuard<'_, S>, deadline: Option<Instant>) -> bool {
    match deadline {
        None => {
            cv.wait(guard);
            true
        }
        Some(d) => !cv.wait_until(guard, d).timed_out(),
    }
}

/// A wait in progress: the gate stays closed to untagged puts until it is
/// dropped. Get one from [`ClosureQueue::waiter`].
#[must_use]
pub struct Waiter<'q, T, E, K> {
    queue: &'q ClosureQueue<T, E, K>,
}

impl<'q, T, E, K> Waiter<'q, T, E, K> {
    /// Waits until nothing is queued or in flight, or an error is pending
    /// (then a cancellation starts and is returned), or `deadline` (`None`:
    /// no limit). While another thread cancels, it keeps waiting.
    ///
    /// # Errors
    ///
    /// [`WaitError::Timeout`] at the deadline.
    pub fn wait_until(&mut self, deadline: Option<Instant>) -> Result<Settled<'q, T, E, K>, WaitError> {
        let q = self.queue;
        let mut s = q.state.lock();
        loop {
            if let Some(settled) = self.settle(&mut s) {
                return Ok(settled);
            }
            if !wait(&q.stop_waiting, &mut s, deadline) {
                return self.settle(&mut s).ok_or(WaitError::Timeout);
            }
        }
    }

    /// [`Waiter::wait_until`] with a deadline `timeout` from now (one too long
    /// to represent: no limit).
    ///
    /// # Errors
    ///
    /// As [`Waiter::wait_until`].
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Settled<'q, T, E, K>, WaitError> {
        self.wait_until(Instant::now().checked_add(timeout))
    }

    /// [`Waiter::wait_until`] without waiting.
    ///
    /// # Errors
    ///
    /// [`WaitError::Timeout`] when closures are queued or in flight.
    pub fn try_wait(&mut self) -> Result<Settled<'q, T, E, K>, WaitError> {
        let mut s = self.queue.state.lock();
        self.settle(&mut s).ok_or(WaitError::Timeout)
    }

    fn settle(&self, s: &mut State<T, E, K>) -> Option<Settled<'q, T, E, K>> {
        if s.cancelling {
            None
        } else if s.error.is_some() {
            s.cancelling = true;
            Some(Settled::Failed(Cancellation::new(self.queue)))
        } else if s.idle() {
            Some(Settled::Done)
        } else {
            None
        }
    }
}

impl<T, E, K> Drop for Waiter<'_, T, E, K> {
    fn drop(&mut self) {
        let mut s = self.queue.state.lock();
        s.waiters -= 1;
        let open = !s.gate_closed();
        drop(s);
        if open {
            self.queue.admitted.notify_all();
        }
    }
}

/// A closure that `put_back` handed back for cancelling: it stays counted in
/// flight until this is dropped.
#[must_use]
pub struct InFlightSlot<'q, T, E, K> {
    queue: &'q ClosureQueue<T, E, K>,
}

impl<T, E, K> Drop for InFlightSlot<'_, T, E, K> {
    fn drop(&mut self) {
        let mut s = self.queue.state.lock();
        self.queue.release(&mut s);
    }
}

/// A cancellation in progress; see the module documentation. While it is
/// alive the gate is closed and main-queue gets wait. Dropping it unfinished
/// abandons it (the error stays pending).
#[must_use]
pub struct Cancellation<'q, T, E, K> {
    queue: &'q ClosureQueue<T, E, K>,
    finished: bool,
}

impl<'q, T, E, K> Cancellation<'q, T, E, K> {
    fn new(queue: &'q ClosureQueue<T, E, K>) -> Self {
        Cancellation { queue, finished: false }
    }

    /// Waits until nothing is in flight (or `deadline`; `None`: no limit),
    /// then drains the main queue, takes the pending error and ends the
    /// cancellation.
    ///
    /// # Errors
    ///
    /// [`CancelError::InFlight`] at the deadline; call again.
    ///
    /// # Panics
    ///
    /// When called again after it succeeded.
    pub fn finish_until(&mut self, deadline: Option<Instant>) -> Result<Cancelled<T, E>, CancelError> {
        assert!(!self.finished, "the cancellation already finished");
        let q = self.queue;
        let mut s = q.state.lock();
        while s.inflight > 0 {
            if !wait(&q.no_inflight, &mut s, deadline) && s.inflight > 0 {
                return Err(CancelError::InFlight);
            }
        }
        Ok(self.end(s))
    }

    /// [`Cancellation::finish_until`] with a deadline `timeout` from now (one
    /// too long to represent: no limit).
    ///
    /// # Errors
    ///
    /// As [`Cancellation::finish_until`].
    ///
    /// # Panics
    ///
    /// When called again after it succeeded.
    pub fn finish_timeout(&mut self, timeout: Duration) -> Result<Cancelled<T, E>, CancelError> {
        self.finish_until(Instant::now().checked_add(timeout))
    }

    /// [`Cancellation::finish_until`] without waiting.
    ///
    /// # Errors
    ///
    /// [`CancelError::InFlight`] while closures are in flight.
    ///
    /// # Panics
    ///
    /// When called again after it succeeded.
    pub fn try_finish(&mut self) -> Result<Cancelled<T, E>, CancelError> {
        assert!(!self.finished, "the cancellation already finished");
        let s = self.queue.state.lock();
        if s.inflight > 0 {
            return Err(CancelError::InFlight);
        }
        Ok(self.end(s))
    }

    fn end(&mut self, mut s: MutexGuard<'_, State<T, E, K>>) -> Cancelled<T, E> {
        let items = std::mem::take(&mut s.main);
        let error = s.error.take().expect("an error is pending while cancelling");
        s.cancelling = false;
        self.finished = true;
        drop(s);
        self.queue.wake_all();
        Cancelled { error, items }
    }
}

impl<T, E, K> Drop for Cancellation<'_, T, E, K> {
    fn drop(&mut self) {
        if !self.finished {
            self.queue.state.lock().cancelling = false;
            self.queue.wake_all();
        }
    }
}

impl<T, E, K> ClosureQueue<T, E, K> {
    /// Makes `error` the pending error unless one is pending already; returns
    /// the one not kept, for the caller to drop after releasing the lock.
    fn keep_first(s: &mut State<T, E, K>, error: E) -> Option<E> {
        if s.error.is_none() {
            s.error = Some(error);
            None
        } else {
            Some(error)
        }
    }

    /// One closure left flight.
    fn release(&self, s: &mut State<T, E, K>) {
        s.inflight -= 1;
        if s.inflight == 0 {
            self.no_inflight.notify_all();
            if s.main.is_empty() {
                self.stop_waiting.notify_all();
            }
        }
    }

    /// A cancellation ended: puts, waits and main-queue gets all re-check.
    fn wake_all(&self) {
        self.admitted.notify_all();
        self.stop_waiting.notify_all();
        self.queued.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::thread;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    type Q = ClosureQueue<u32, &'static str, u8>;

    fn soon(ms: u64) -> Option<Instant> {
        Some(Instant::now() + Duration::from_millis(ms))
    }

    fn put(q: &Q, item: u32) {
        assert!(matches!(q.try_put(item), Ok(Put::Queued)), "put {item} should enqueue");
    }

    fn get(q: &Q, tag: Option<u8>) -> Result<u32, GetError> {
        q.try_get(tag.as_ref())
    }

    fn finish(c: &mut Cancellation<'_, u32, &'static str, u8>) -> (&'static str, Vec<u32>) {
        let done = c.try_finish().expect("nothing in flight");
        (done.error, done.items.into_iter().collect())
    }

    #[test]
    fn main_queue_is_fifo_and_counts_in_flight() {
        let q = Q::new(DEFAULT_CAPACITY);
        for i in 1..=3 {
            put(&q, i);
        }
        assert_eq!(q.queued(), 3);
        assert_eq!((get(&q, None), get(&q, None), get(&q, None)), (Ok(1), Ok(2), Ok(3)));
        assert_eq!(q.inflight(), 3);
        assert_eq!(get(&q, None), Err(GetError::Timeout));
    }

    #[test]
    fn tagged_queue_is_served_first_and_not_counted() {
        let q = Q::new(DEFAULT_CAPACITY);
        put(&q, 1);
        q.put_tagged(10, 0);
        q.put_tagged(11, 0);
        q.put_tagged(20, 1);
        assert_eq!(q.queued_tagged(&0), 2);
        assert_eq!(get(&q, Some(0)), Ok(10));
        assert_eq!(get(&q, Some(0)), Ok(11));
        assert_eq!(q.inflight(), 0, "tagged gets are not in flight");
        assert_eq!(get(&q, Some(0)), Ok(1), "then the main queue");
        assert_eq!(q.inflight(), 1);
        assert_eq!(get(&q, None), Err(GetError::Timeout), "untagged gets never see tagged closures");
        assert_eq!(get(&q, Some(1)), Ok(20));
    }

    #[test]
    fn put_waits_for_room_and_a_get_frees_it() {
        let q = Arc::new(Q::new(2));
        put(&q, 1);
        put(&q, 2);
        assert!(matches!(q.try_put(3), Err(PutError::Timeout(3))));
        assert!(matches!(q.put(3, soon(20)), Err(PutError::Timeout(3))));
        let q2 = Arc::clone(&q);
        let producer = thread::spawn(move || matches!(q2.put(3, None), Ok(Put::Queued)));
        thread::sleep(Duration::from_millis(20));
        assert!(!producer.is_finished(), "put blocks while the queue is full");
        assert_eq!(get(&q, None), Ok(1));
        assert!(producer.join().unwrap());
        assert_eq!(q.queued(), 2);
    }

    #[test]
    fn capacity_zero_is_unbounded() {
        let q = Q::new(0);
        for i in 0..1000 {
            put(&q, i);
        }
        assert_eq!(q.queued(), 1000);
    }

    #[test]
    fn put_waits_while_a_wait_runs() {
        let q = Arc::new(Q::new(DEFAULT_CAPACITY));
        put(&q, 1);
        let waiter = q.waiter();
        assert!(matches!(q.try_put(2), Err(PutError::Timeout(2))), "the gate is closed");
        q.put_tagged(9, 0);
        assert_eq!(q.queued_tagged(&0), 1, "tagged puts never block");
        let q2 = Arc::clone(&q);
        let producer = thread::spawn(move || matches!(q2.put(2, None), Ok(Put::Queued)));
        thread::sleep(Duration::from_millis(20));
        assert!(!producer.is_finished());
        drop(waiter);
        assert!(producer.join().unwrap());
        assert_eq!(q.queued(), 2);
    }

    #[test]
    fn put_with_pending_error_enqueues_then_cancels_everything_queued() {
        let q = Q::new(DEFAULT_CAPACITY);
        put(&q, 1);
        put(&q, 2);
        assert_eq!(get(&q, None), Ok(1));
        q.mark_failed("boom").unwrap();
        let Ok(Put::Failed(mut c)) = q.try_put(3) else {
            panic!("put should report the error")
        };
        assert_eq!(finish(&mut c), ("boom", vec![2, 3]));
        drop(c);
        assert!(!q.has_error(), "the error is raised once");
        assert_eq!(q.queued(), 0);
        put(&q, 4);
        assert_eq!(get(&q, None), Ok(4), "scheduling works again");
    }

    #[test]
    fn put_with_pending_error_does_not_wait_for_room() {
        let q = Q::new(1);
        put(&q, 1);
        assert_eq!(get(&q, None), Ok(1));
        put(&q, 2);
        q.mark_failed("boom").unwrap();
        let Ok(Put::Failed(mut c)) = q.try_put(3) else {
            panic!("a full queue with an error pending still takes the put")
        };
        assert_eq!(finish(&mut c), ("boom", vec![2, 3]));
    }

    #[test]
    fn fail_without_a_closure_in_flight_is_raised_by_the_next_wait() {
        let q = Q::new(DEFAULT_CAPACITY);
        put(&q, 1);
        q.fail("worker thread stopped");
        q.fail("later");
        let Done::Failed(mut c) = q.done() else {
            panic!("done() should report the error")
        };
        assert_eq!(finish(&mut c), ("worker thread stopped", vec![1]), "the first error wins");
        drop(c);
        assert!(!q.has_error(), "the error is raised once");
    }

    #[test]
    fn cancellation_waits_for_in_flight_and_holds_main_gets() {
        let q = Q::new(DEFAULT_CAPACITY);
        for i in 1..=3 {
            put(&q, i);
        }
        assert_eq!(get(&q, None), Ok(1));
        assert_eq!(get(&q, None), Ok(2));
        q.mark_failed("first").unwrap();
        let Done::Failed(mut c) = q.done() else {
            panic!("done() should report the error")
        };
        assert_eq!(c.try_finish().err(), Some(CancelError::InFlight));
        assert_eq!(c.finish_until(soon(10)).err(), Some(CancelError::InFlight));
        assert_eq!(
            get(&q, None),
            Err(GetError::Timeout),
            "no main-queue closure starts while cancelling"
        );
        q.put_tagged(7, 0);
        assert_eq!(get(&q, Some(0)), Ok(7), "tagged closures are still served");
        assert!(matches!(q.done(), Done::No), "done() does not cancel twice");
        assert!(
            matches!(q.try_put(4), Err(PutError::Timeout(4))),
            "the gate is closed while cancelling"
        );
        q.mark_failed("second").unwrap();
        assert_eq!(finish(&mut c), ("first", vec![3]), "the first error wins");
    }

    #[test]
    fn cancellation_finishes_when_the_last_closure_lands() {
        let q = Arc::new(Q::new(DEFAULT_CAPACITY));
        put(&q, 1);
        put(&q, 2);
        assert_eq!(get(&q, None), Ok(1));
        assert_eq!(get(&q, None), Ok(2));
        q.mark_failed("boom").unwrap();
        let q2 = Arc::clone(&q);
        let worker = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            q2.mark_finished().unwrap();
        });
        let Done::Failed(mut c) = q.done() else { panic!() };
        let done = c.finish_until(soon(5000)).unwrap();
        assert_eq!(done.error, "boom");
        worker.join().unwrap();
    }

    #[test]
    fn abandoned_cancellation_leaves_the_error_pending() {
        let q = Q::new(DEFAULT_CAPACITY);
        put(&q, 1);
        assert_eq!(get(&q, None), Ok(1));
        put(&q, 2);
        assert_eq!(get(&q, None), Ok(2));
        q.mark_failed("boom").unwrap();
        let Done::Failed(c) = q.done() else { panic!() };
        drop(c);
        assert!(q.has_error());
        q.mark_finished().unwrap();
        let Done::Failed(mut c) = q.done() else {
            panic!("the next done() starts over")
        };
        assert_eq!(finish(&mut c), ("boom", vec![]));
    }

    #[test]
    fn put_back_goes_to_the_tail_without_waiting_for_room() {
        let q = Q::new(2);
        put(&q, 1);
        put(&q, 2);
        assert_eq!(get(&q, None), Ok(1));
        put(&q, 3);
        assert!(matches!(q.put_back(1), Ok(PutBack::Queued)));
        assert_eq!(q.inflight(), 0);
        assert_eq!(q.queued(), 3, "over capacity by the number that was in flight");
        assert_eq!((get(&q, None), get(&q, None), get(&q, None)), (Ok(2), Ok(3), Ok(1)));
    }

    #[test]
    fn put_back_with_pending_error_hands_the_closure_back() {
        let q = Q::new(DEFAULT_CAPACITY);
        put(&q, 1);
        put(&q, 2);
        assert_eq!(get(&q, None), Ok(1));
        assert_eq!(get(&q, None), Ok(2));
        q.mark_failed("boom").unwrap();
        let Ok(PutBack::Cancel { item, slot }) = q.put_back(2) else {
            panic!("should cancel")
        };
        assert_eq!(item, 2);
        assert_eq!(q.inflight(), 1, "still in flight until cancelled");
        drop(slot);
        assert_eq!(q.inflight(), 0);
        assert_eq!(q.queued(), 0);
    }

    #[test]
    fn reports_fail_with_nothing_in_flight() {
        let q = Q::new(DEFAULT_CAPACITY);
        put(&q, 1);
        let m = |c| Err(CompletionError::NothingInFlight(c));
        assert_eq!(q.mark_finished(), m(Completion::MarkFinished));
        assert_eq!(q.mark_failed("x"), m(Completion::MarkFailed));
        assert!(matches!(q.put_back(1), Err(CompletionError::NothingInFlight(Completion::PutBack))));
        assert!(!q.has_error());
        assert_eq!(
            CompletionError::NothingInFlight(Completion::PutBack).to_string(),
            "There is no inflight closures to put_back."
        );
        q.put_tagged(5, 0);
        assert_eq!(get(&q, Some(0)), Ok(5));
        assert_eq!(q.mark_finished(), m(Completion::MarkFinished), "a tagged get is not in flight");
    }

    #[test]
    fn wait_settles_on_idle_error_or_deadline() {
        let q = Arc::new(Q::new(DEFAULT_CAPACITY));
        assert!(matches!(q.wait(None), Ok(Settled::Done)));
        put(&q, 1);
        assert_eq!(q.wait(soon(10)).err(), Some(WaitError::Timeout));
        assert_eq!(get(&q, None), Ok(1));
        assert_eq!(q.waiter().try_wait().err(), Some(WaitError::Timeout));
        let q2 = Arc::clone(&q);
        let worker = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            q2.mark_finished().unwrap();
        });
        assert!(matches!(q.wait(soon(5000)), Ok(Settled::Done)));
        worker.join().unwrap();
        put(&q, 2);
        assert_eq!(get(&q, None), Ok(2));
        put(&q, 3);
        let q2 = Arc::clone(&q);
        let worker = thread::spawn(move || {
            thread::sleep(Duration::from_millis(20));
            q2.mark_failed("boom").unwrap();
        });
        let Ok(Settled::Failed(mut c)) = q.wait(soon(5000)) else {
            panic!("the error ends the wait")
        };
        assert_eq!(finish(&mut c), ("boom", vec![3]));
        worker.join().unwrap();
    }

    #[test]
    fn wait_deadline_is_not_restarted_by_wake_ups() {
        let q = Arc::new(Q::new(DEFAULT_CAPACITY));
        for i in 0..5000 {
            put(&q, i);
        }
        let q2 = Arc::clone(&q);
        // Work remains for at least 10 s (5,000 closures of 2 ms or more, cut
        // short by stop): each finish wakes the wait without settling it. A
        // wait whose deadline each wake-up restarted would run until the
        // queue is idle and return Done, not Timeout.
        let worker = thread::spawn(move || {
            while let Ok(_item) = q2.get(None, None) {
                thread::sleep(Duration::from_millis(2));
                q2.mark_finished().unwrap();
            }
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let q3 = Arc::clone(&q);
        let start = Instant::now();
        thread::spawn(move || {
            let settled = q3.wait(Some(start + Duration::from_millis(100)));
            let _ = tx.send(settled.err());
        });
        // Only turns a wait that never returns into a failure; how soon after
        // its deadline it returns is a bench figure.
        let r = rx.recv_timeout(Duration::from_secs(30));
        let took = start.elapsed();
        q.stop();
        worker.join().unwrap();
        let r = r.unwrap_or_else(|e| panic!("wait(100 ms) with work going on did not return: {e:?}"));
        assert_eq!(r, Some(WaitError::Timeout), "the wait settled instead of timing out");
        assert!(took >= Duration::from_millis(100), "returned before its deadline: {took:?}");
    }

    #[test]
    fn a_wait_outlasts_another_threads_cancellation() {
        let q = Arc::new(Q::new(DEFAULT_CAPACITY));
        put(&q, 1);
        put(&q, 2);
        assert_eq!(get(&q, None), Ok(1));
        q.mark_failed("boom").unwrap();
        let Done::Failed(mut c) = q.done() else { panic!() };
        let q2 = Arc::clone(&q);
        let waiter = thread::spawn(move || matches!(q2.wait(soon(5000)), Ok(Settled::Done)));
        thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished(), "the cancelling thread raises the error, not the wait");
        assert_eq!(finish(&mut c), ("boom", vec![2]));
        assert!(waiter.join().unwrap(), "then the wait finds the queue idle");
    }

    #[test]
    fn done_reports_idle() {
        let q = Q::new(DEFAULT_CAPACITY);
        assert!(matches!(q.done(), Done::Yes));
        put(&q, 1);
        assert!(matches!(q.done(), Done::No));
        assert_eq!(get(&q, None), Ok(1));
        assert!(matches!(q.done(), Done::No));
        q.mark_finished().unwrap();
        assert!(matches!(q.done(), Done::Yes));
    }

    #[test]
    fn stop_releases_blocked_gets() {
        let q = Arc::new(Q::new(DEFAULT_CAPACITY));
        let getters: Vec<_> = (0..3)
            .map(|i| {
                let q = Arc::clone(&q);
                thread::spawn(move || q.get(if i == 0 { None } else { Some(i) }.as_ref(), None))
            })
            .collect();
        thread::sleep(Duration::from_millis(20));
        q.stop();
        for g in getters {
            assert_eq!(g.join().unwrap(), Err(GetError::Stopped));
        }
        put(&q, 1);
        assert_eq!(get(&q, None), Err(GetError::Stopped), "even with closures queued");
        assert!(q.is_stopped());
    }

    #[test]
    fn get_wakes_on_put_and_times_out() {
        let q = Arc::new(Q::new(DEFAULT_CAPACITY));
        assert_eq!(q.get(None, soon(10)), Err(GetError::Timeout));
        let q2 = Arc::clone(&q);
        let getter = thread::spawn(move || q2.get(Some(&3), soon(5000)));
        thread::sleep(Duration::from_millis(10));
        q.put_tagged(30, 3);
        assert_eq!(getter.join().unwrap(), Ok(30));
    }

    /// The `_timeout` forms (the binding's) time out as their deadline forms do,
    /// and succeed at once when they need not wait.
    #[test]
    fn timeout_forms_wait_at_most_their_duration() {
        let short = Duration::from_millis(10);
        let q = Q::new(1);
        assert_eq!(q.get_timeout(None, short), Err(GetError::Timeout));
        assert!(matches!(q.put_timeout(1, short), Ok(Put::Queued)));
        assert!(matches!(q.put_timeout(2, short), Err(PutError::Timeout(2))), "the queue is full");
        assert!(
            matches!(q.waiter().wait_timeout(short), Err(WaitError::Timeout)),
            "one closure queued"
        );
        assert_eq!(q.get_timeout(None, short), Ok(1));
        q.set_inflight(2);
        q.mark_failed("boom").unwrap();
        let Done::Failed(mut c) = q.done() else {
            panic!("done() should report the error")
        };
        assert_eq!(c.finish_timeout(short).err(), Some(CancelError::InFlight));
        q.mark_finished().unwrap();
        assert_eq!(c.finish_timeout(short).map(|done| done.error).ok(), Some("boom"));
        drop(c);
        assert!(matches!(q.waiter().wait_timeout(short), Ok(Settled::Done)));
    }

    #[test]
    fn visit_sees_every_queued_closure_and_none_in_flight() {
        let q = Q::new(DEFAULT_CAPACITY);
        for i in 1..=3 {
            assert!(matches!(q.try_put(i), Ok(Put::Queued)));
        }
        q.put_tagged(40, 4);
        assert_eq!(q.try_get(None), Ok(1)); // in flight now: not queued
        let mut seen = Vec::new();
        q.visit(|&i| seen.push(i));
        assert_eq!(seen, vec![2, 3, 40]);
    }

    #[test]
    fn promote_moves_the_ranked_closures_to_the_head_in_rank_order() {
        let q = Q::new(DEFAULT_CAPACITY);
        for i in [36, 37, 38, 30, 39, 31] {
            assert!(matches!(q.try_put(i), Ok(Put::Queued)));
        }
        let moved = q.promote(|&i| (i < 35).then_some(usize::try_from(i).unwrap()));
        assert_eq!(moved, 2);
        let mut seen = Vec::new();
        q.visit(|&i| seen.push(i));
        assert_eq!(seen, vec![30, 31, 36, 37, 38, 39]);
        assert_eq!(q.promote(|_| None), 0);
    }

    #[test]
    fn clear_tag_returns_what_it_held() {
        let q = Q::new(DEFAULT_CAPACITY);
        q.put_tagged(1, 0);
        q.put_tagged(2, 0);
        assert_eq!(q.clear_tag(&0), VecDeque::from([1, 2]));
        assert_eq!(q.clear_tag(&0), VecDeque::new());
        assert_eq!(get(&q, Some(0)), Err(GetError::Timeout));
    }

    #[test]
    fn visit_and_take_all_see_every_closure_and_the_error() {
        let q = Q::new(DEFAULT_CAPACITY);
        put(&q, 1);
        put(&q, 2);
        assert_eq!(get(&q, None), Ok(1));
        q.mark_failed("boom").unwrap();
        q.put_tagged(3, 0);
        let mut seen = Vec::new();
        let mut err = None;
        let visited = q.try_visit::<()>(
            |i| {
                seen.push(*i);
                Ok(())
            },
            |e| {
                err = Some(*e);
                Ok(())
            },
        );
        assert_eq!((visited, seen, err), (Ok(true), vec![2, 3], Some("boom")));
        let (items, error) = q.take_all();
        assert_eq!((items, error), (vec![2, 3], Some("boom")));
        assert!(!q.has_error());
    }

    // ---- properties ------------------------------------------------------

    #[derive(Debug, Clone)]
    enum Op {
        Put,
        PutTagged(u8),
        Get(Option<u8>),
        Finish(usize),
        PutBack(usize),
        Fail(usize),
        Wait,
        Done,
        ClearTag(u8),
        Stop,
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => Just(Op::Put),
            2 => (0u8..2).prop_map(Op::PutTagged),
            6 => proptest::option::of(0u8..2).prop_map(Op::Get),
            3 => any::<usize>().prop_map(Op::Finish),
            2 => any::<usize>().prop_map(Op::PutBack),
            1 => any::<usize>().prop_map(Op::Fail),
            1 => Just(Op::Wait),
            1 => Just(Op::Done),
            1 => (0u8..2).prop_map(Op::ClearTag),
            1 => Just(Op::Stop),
        ]
    }

    /// A plain single-threaded model of the queue.
    #[derive(Default)]
    struct Model {
        main: VecDeque<u32>,
        tagged: HashMap<u8, VecDeque<u32>>,
        /// Untagged closures held by the (single) worker: the in-flight ones.
        held: Vec<u32>,
        error: Option<&'static str>,
        stopped: bool,
    }

    const ERRORS: [&str; 3] = ["e0", "e1", "e2"];

    /// Runs one cancellation against the model: it finishes exactly when
    /// nothing is in flight (a single thread cannot land in-flight closures
    /// meanwhile), else it is abandoned.
    fn check_cancel(m: &mut Model, mut c: Cancellation<'_, u32, &'static str, u8>) -> Result<(), TestCaseError> {
        if m.held.is_empty() {
            let done = c.try_finish().map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(Some(done.error), m.error.take());
            prop_assert_eq!(done.items, std::mem::take(&mut m.main));
        } else {
            prop_assert_eq!(c.try_finish().err(), Some(CancelError::InFlight));
        }
        Ok(())
    }

    fn run_model(capacity: usize, ops: &[Op]) -> Result<(), TestCaseError> {
        let q = Q::new(capacity);
        let mut m = Model::default();
        let mut next = 0u32;
        for op in ops {
            match op.clone() {
                Op::Put => {
                    next += 1;
                    let admitted = m.error.is_some() || m.main.len() < capacity;
                    match q.try_put(next) {
                        Ok(Put::Queued) => {
                            prop_assert!(admitted && m.error.is_none());
                            m.main.push_back(next);
                        }
                        Ok(Put::Failed(c)) => {
                            prop_assert!(m.error.is_some());
                            m.main.push_back(next);
                            check_cancel(&mut m, c)?;
                        }
                        Err(PutError::Timeout(back)) => prop_assert!(!admitted && back == next),
                    }
                }
                Op::PutTagged(t) => {
                    next += 1;
                    q.put_tagged(next, t);
                    m.tagged.entry(t).or_default().push_back(next);
                }
                Op::Get(tag) => {
                    let expected = if m.stopped {
                        Err(GetError::Stopped)
                    } else if let Some(x) = tag.and_then(|t| m.tagged.get_mut(&t)).and_then(VecDeque::pop_front) {
                        Ok(x)
                    } else if let Some(x) = m.main.pop_front() {
                        m.held.push(x);
                        Ok(x)
                    } else {
                        Err(GetError::Timeout)
                    };
                    prop_assert_eq!(q.try_get(tag.as_ref()), expected);
                }
                Op::Finish(i) | Op::Fail(i) | Op::PutBack(i) if m.held.is_empty() => {
                    let completion = match op {
                        Op::Finish(_) => q.mark_finished(),
                        Op::Fail(_) => q.mark_failed(ERRORS[i % 3]),
                        _ => q.put_back(u32::MAX).map(|_| ()),
                    };
                    prop_assert!(matches!(completion, Err(CompletionError::NothingInFlight(_))));
                }
                Op::Finish(i) => {
                    m.held.swap_remove(i % m.held.len());
                    prop_assert_eq!(q.mark_finished(), Ok(()));
                }
                Op::Fail(i) => {
                    m.held.swap_remove(i % m.held.len());
                    prop_assert_eq!(q.mark_failed(ERRORS[i % 3]), Ok(()));
                    m.error.get_or_insert(ERRORS[i % 3]);
                }
                Op::PutBack(i) => {
                    let item = m.held.swap_remove(i % m.held.len());
                    match q.put_back(item) {
                        Ok(PutBack::Queued) => {
                            prop_assert!(m.error.is_none());
                            m.main.push_back(item);
                        }
                        Ok(PutBack::Cancel { item: back, slot }) => {
                            prop_assert!(m.error.is_some() && back == item);
                            prop_assert_eq!(q.inflight(), m.held.len() + 1);
                            drop(slot);
                        }
                        Err(e) => return Err(TestCaseError::fail(e.to_string())),
                    }
                }
                Op::Wait => match q.waiter().try_wait() {
                    Ok(Settled::Done) => prop_assert!(m.error.is_none() && m.main.is_empty() && m.held.is_empty()),
                    Ok(Settled::Failed(c)) => {
                        prop_assert!(m.error.is_some());
                        check_cancel(&mut m, c)?;
                    }
                    Err(WaitError::Timeout) => prop_assert!(m.error.is_none() && !(m.main.is_empty() && m.held.is_empty())),
                },
                Op::Done => match q.done() {
                    Done::Yes => prop_assert!(m.error.is_none() && m.main.is_empty() && m.held.is_empty()),
                    Done::No => prop_assert!(m.error.is_none() && !(m.main.is_empty() && m.held.is_empty())),
                    Done::Failed(c) => {
                        prop_assert!(m.error.is_some());
                        check_cancel(&mut m, c)?;
                    }
                },
                Op::ClearTag(t) => {
                    prop_assert_eq!(q.clear_tag(&t), m.tagged.remove(&t).unwrap_or_default());
                }
                Op::Stop => {
                    q.stop();
                    m.stopped = true;
                }
            }
            prop_assert_eq!(q.inflight(), m.held.len());
            prop_assert_eq!(q.queued(), m.main.len());
            prop_assert_eq!(q.has_error(), m.error.is_some());
            for t in 0..2 {
                prop_assert_eq!(q.queued_tagged(&t), m.tagged.get(&t).map_or(0, VecDeque::len));
            }
        }
        Ok(())
    }

    // Multi-threaded run: one scheduler thread (puts, waits, done) and a few
    // worker threads that get and report closures with a cyclic list of
    // actions. Every closure records how it ended, before the queue hears of
    // it, so the scheduler can check what a settled wait promises.

    const PENDING: u8 = 0;
    const FINISHED: u8 = 1;
    const FAILED: u8 = 2;
    const CANCELLED: u8 = 3;
    const CLEARED: u8 = 4;

    #[derive(Debug, Clone, Copy)]
    enum Action {
        Finish,
        Fail,
        PutBack,
    }

    #[derive(Debug, Clone, Copy)]
    enum SchedOp {
        Put,
        PutTagged(u8),
        Wait,
        Done,
    }

    /// Closure `id` tagged or not; errors are the failing closure's id.
    type MtQ = ClosureQueue<(u32, bool), u32, u8>;

    struct Outcomes(Vec<AtomicU8>);

    impl Outcomes {
        fn end(&self, id: u32, how: u8) {
            let previous = self.0[id as usize].swap(how, Ordering::SeqCst);
            assert_eq!(previous, PENDING, "closure {id} ended twice ({previous} then {how})");
        }

        fn ended(&self, id: u32) -> bool {
            self.0[id as usize].load(Ordering::SeqCst) != PENDING
        }
    }

    fn cancel(q: &MtQ, out: &Outcomes, mut c: Cancellation<'_, (u32, bool), u32, u8>) {
        let done = c.finish_until(None).expect("no deadline");
        for (id, _) in done.items {
            out.end(id, CANCELLED);
        }
        assert_eq!(
            (q.inflight(), q.has_error()),
            (0, false),
            "a finished cancellation leaves nothing in flight"
        );
    }

    fn run_threads(capacity: usize, sched: &[SchedOp], workers: &[Vec<Action>]) {
        let q = Arc::new(MtQ::new(capacity));
        let out = Arc::new(Outcomes((0..=sched.len()).map(|_| AtomicU8::new(PENDING)).collect()));
        let max_inflight = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = workers
            .iter()
            .enumerate()
            .map(|(w, actions)| {
                let (q, out, actions, max_inflight) = (Arc::clone(&q), Arc::clone(&out), actions.clone(), Arc::clone(&max_inflight));
                #[allow(clippy::cast_possible_truncation)]
                let tag = w as u8;
                thread::spawn(move || {
                    let mut turn = 0;
                    loop {
                        let (id, tagged) = match q.get(Some(&tag), soon(2)) {
                            Ok(item) => item,
                            Err(GetError::Timeout) => continue,
                            Err(GetError::Stopped) => return,
                        };
                        max_inflight.fetch_max(q.inflight(), Ordering::SeqCst);
                        if tagged {
                            out.end(id, FINISHED);
                            continue;
                        }
                        let action = actions[turn % actions.len()];
                        turn += 1;
                        match action {
                            Action::Finish => {
                                out.end(id, FINISHED);
                                q.mark_finished().unwrap();
                            }
                            Action::Fail => {
                                out.end(id, FAILED);
                                q.mark_failed(id).unwrap();
                            }
                            Action::PutBack => match q.put_back((id, false)).unwrap() {
                                PutBack::Queued => {}
                                PutBack::Cancel { item, slot } => {
                                    out.end(item.0, CANCELLED);
                                    drop(slot);
                                }
                            },
                        }
                    }
                })
            })
            .collect();

        let mut untagged = Vec::new();
        let all_ended = |ids: &[u32]| {
            for &id in ids {
                assert!(
                    out.ended(id),
                    "closure {id} neither queued, in flight nor ended after a settled wait"
                );
            }
        };
        for (i, op) in sched.iter().enumerate() {
            #[allow(clippy::cast_possible_truncation)]
            let id = i as u32;
            match *op {
                SchedOp::Put => {
                    untagged.push(id);
                    if let Put::Failed(c) = q.put((id, false), None).unwrap() {
                        cancel(&q, &out, c);
                        all_ended(&untagged);
                    }
                }
                SchedOp::PutTagged(w) => q.put_tagged((id, true), w % workers.len() as u8),
                SchedOp::Wait => match q.wait(soon(3)) {
                    Ok(Settled::Done) => all_ended(&untagged),
                    Ok(Settled::Failed(c)) => {
                        cancel(&q, &out, c);
                        all_ended(&untagged);
                    }
                    Err(WaitError::Timeout) => {}
                },
                SchedOp::Done => match q.done() {
                    Done::Yes => all_ended(&untagged),
                    Done::No => {}
                    Done::Failed(c) => {
                        cancel(&q, &out, c);
                        all_ended(&untagged);
                    }
                },
            }
        }
        // Join: wait until settled, cancelling whenever an error is pending.
        loop {
            match q.wait(None).unwrap() {
                Settled::Done => break,
                Settled::Failed(c) => cancel(&q, &out, c),
            }
        }
        all_ended(&untagged);
        assert!(matches!(q.done(), Done::Yes));
        q.stop();
        for h in handles {
            h.join().unwrap();
        }
        #[allow(clippy::cast_possible_truncation)]
        for w in 0..workers.len() as u8 {
            for (id, _) in q.clear_tag(&w) {
                out.end(id, CLEARED);
            }
        }
        assert_eq!(q.inflight(), 0);
        for (i, op) in sched.iter().enumerate() {
            if matches!(op, SchedOp::Put | SchedOp::PutTagged(_)) {
                assert!(out.ended(i as u32), "closure {i} never ended");
            }
        }
        assert!(max_inflight.load(Ordering::SeqCst) <= workers.len(), "more in flight than workers");
    }

    fn arb_actions() -> impl Strategy<Value = Vec<Action>> {
        proptest::collection::vec(
            prop_oneof![4 => Just(Action::Finish), 1 => Just(Action::Fail), 2 => Just(Action::PutBack)],
            1..5,
        )
        .prop_map(|mut a| {
            if a.iter().all(|x| matches!(x, Action::PutBack)) {
                a.push(Action::Finish);
            }
            a
        })
    }

    fn arb_sched() -> impl Strategy<Value = Vec<SchedOp>> {
        proptest::collection::vec(
            prop_oneof![8 => Just(SchedOp::Put), 2 => (0u8..4).prop_map(SchedOp::PutTagged), 1 => Just(SchedOp::Wait), 1 => Just(SchedOp::Done)],
            0..40,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

        /// Every operation agrees with a plain model: FIFO, put-back to the
        /// tail, tags first, in-flight counting, first error wins, a
        /// cancellation drains exactly what was queued.
        #[test]
        fn matches_the_model(capacity in 1usize..5, ops in proptest::collection::vec(arb_op(), 0..60)) {
            run_model(capacity, &ops)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() })]

        /// With real threads: every closure ends exactly once (finished,
        /// failed, cancelled, or left in a tag queue at the end); a settled
        /// wait or done means everything scheduled before it ended; in flight
        /// never exceeds the number of workers.
        #[test]
        fn threads_end_every_closure_once(
            capacity in 1usize..6,
            sched in arb_sched(),
            workers in proptest::collection::vec(arb_actions(), 1..4),
        ) {
            run_threads(capacity, &sched, &workers);
        }
    }

    #[test]
    fn set_inflight_holds_a_wait_until_it_returns_to_zero() {
        let q = Q::new(0);
        q.set_inflight(1);
        assert_eq!(q.inflight(), 1);
        assert!(matches!(q.wait(soon(20)), Err(WaitError::Timeout)), "one closure counted in flight");
        let q = Arc::new(q);
        let waiter = {
            let q = Arc::clone(&q);
            thread::spawn(move || matches!(q.wait(soon(10_000)), Ok(Settled::Done)))
        };
        q.set_inflight(0);
        assert!(waiter.join().unwrap(), "the wait returns once the count is back at zero");
    }

    #[test]
    fn with_error_sees_the_pending_error_until_it_is_raised() {
        let q = Q::new(0);
        assert_eq!(q.with_error(|e| e.copied()), None);
        assert!(matches!(q.put(1, None).unwrap(), Put::Queued));
        q.try_get(None).unwrap();
        q.mark_failed("boom").unwrap();
        assert_eq!(q.with_error(|e| e.copied()), Some("boom"));
        let Done::Failed(mut c) = q.done() else {
            panic!("the error is pending")
        };
        let cancelled = c.try_finish().unwrap();
        assert_eq!(cancelled.error, "boom");
        assert_eq!(q.with_error(|e| e.copied()), None, "raised: no longer pending");
    }

    #[test]
    fn finish_reports_each_outcome_as_its_own_operation() {
        let q = Q::new(0);
        for item in 1..=3 {
            assert!(matches!(q.try_put(item).unwrap(), Put::Queued));
        }
        for _ in 0..3 {
            q.try_get(None).unwrap();
        }
        assert!(matches!(q.finish(Outcome::Finished), Ok(PutBack::Queued)));
        assert!(matches!(q.finish(Outcome::PutBack(2)), Ok(PutBack::Queued)));
        assert_eq!((q.inflight(), q.queued()), (1, 1), "put back at the tail");
        assert!(matches!(q.finish(Outcome::Failed("first")), Ok(PutBack::Queued)));
        assert_eq!(q.inflight(), 0);
        assert!(matches!(
            q.finish(Outcome::Finished),
            Err(CompletionError::NothingInFlight(Completion::MarkFinished))
        ));
        assert!(matches!(
            q.finish(Outcome::Failed("late")),
            Err(CompletionError::NothingInFlight(Completion::MarkFailed))
        ));
        assert!(matches!(
            q.finish(Outcome::PutBack(9)),
            Err(CompletionError::NothingInFlight(Completion::PutBack))
        ));
        // A stopped worker's error needs nothing in flight; the first error stays.
        assert!(matches!(q.finish(Outcome::Stopped("stopped")), Ok(PutBack::Queued)));
        assert_eq!(q.with_error(|e| e.copied()), Some("first"));
        q.try_get(None).unwrap();
        let Ok(PutBack::Cancel { item, slot }) = q.finish(Outcome::PutBack(2)) else {
            panic!("an error is pending: the closure is handed back to be cancelled")
        };
        assert_eq!((item, q.inflight()), (2, 1));
        drop(slot);
        assert_eq!(q.inflight(), 0);
    }

    #[test]
    fn a_fresh_queue_takes_a_stopped_workers_error() {
        let q = Q::new(0);
        assert!(matches!(q.finish(Outcome::Stopped("stopped")), Ok(PutBack::Queued)));
        assert!(matches!(q.done(), Done::Failed(_)));
    }

    #[test]
    fn a_worker_looks_at_a_soft_hold_more_often_than_at_the_queue() {
        let on_queue = worker_poll_timeout(None);
        assert_eq!(worker_poll_timeout(Some(true)), on_queue);
        assert!(worker_poll_timeout(Some(false)) < on_queue);
        assert!(!worker_poll_timeout(Some(false)).is_zero());
    }
}
