//! Signals as a termination source: one event per delivery, from any thread.
//!
//! A worker learns of its end from a signal (SIGTERM everywhere; SIGUSR1 or
//! another signal configured on SLURM), from a user's
//! `termination_watcher_fn`, or from a platform's metadata service (the
//! pollers beside this file). Whatever the source, the result is one
//! [`crate::step_resolution::Notice`] handed to the resolver. This module
//! holds the part that cannot be sans-IO: the process-wide signal plumbing.
//! Everything it decides is trivial (a counter went up); the decisions live
//! in the resolver.
//!
//! # Signals
//!
//! TensorFlow installs its SIGTERM handler with Python's `signal.signal`,
//! which only works on the main thread and replaces whatever handler was
//! there. Here a C-level `sigaction` handler is installed instead, from any
//! thread:
//!
//! * the handler only does async-signal-safe work: it bumps a per-signal
//!   counter and writes one byte to a non-blocking self-pipe; one dispatcher
//!   thread blocks on the pipe and, at once, not after a poll interval,
//!   posts the delivery to every watch made with a [`Sink`]
//!   ([`SignalWatch::with_sink`]: the binding's sink posts into the
//!   handler's [`crate::inbox::Inbox`]) and wakes every [`SignalWatch`]
//!   waiting on a condition variable;
//! * installs are reference-counted per signal; when the last watch of a
//!   signal is dropped, the previous disposition is restored.
//!
//! ## Who owns a notice
//!
//! A watch is an **owner** (a `PreemptionCheckpointHandler`: the notice is
//! its to act on until the checkpoint is written) or an **observer** (a
//! `PreemptionWatcher`: it records the notice and nothing more).
//!
//! * While an owner of a signal is alive, the handler installed before ours
//!   (a Python `signal.signal` handler, `faulthandler.register(...,
//!   chain=True)`, a C library's) is **not called**: it could end the process
//!   before the save, which is exactly what a preemption handler exists to
//!   prevent. TensorFlow behaves the same way (its `signal.signal` replaces the
//!   previous handler). Dropping the last watch restores the previous
//!   disposition, so it runs again for later signals.
//! * With observers only, the previous handler is chained after the counter
//!   is bumped (a watcher must not change what SIGTERM does to the process,
//!   beyond not letting the default action kill it).
//! * A chained call that comes back to us (a third-party handler installed
//!   after ours that chains to ours, while ours chains to it) is cut by a
//!   per-thread depth guard: each handler runs once per delivery.
//! * Someone who replaces our disposition later (`signal.signal(SIGTERM, f)`)
//!   switches our watching off; [`SignalWatch::displaced`] tells, and the
//!   binding logs a warning once per watch. Dropping the last watch then
//!   leaves their handler in place and keeps our handler's chain to the
//!   previous one intact, since theirs may still call ours.
//! * A forked child inherits the disposition but neither the dispatcher
//!   thread nor the watches: in a process other than the one that installed
//!   it, the handler puts the previous disposition back and re-raises the
//!   signal, so the child behaves as if we had never been installed (SIGTERM
//!   ends it by default). A watch made in the child starts afresh.
//!
//! Nothing in this module calls Python or logs while the install table's mutex is
//! held: `log` reaches Python through pyo3-log, which needs the GIL, and a
//! thread holding the GIL may be waiting for that mutex.

use std::cell::{Cell, UnsafeCell};
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use thiserror::Error;

/// Signals numbered below this can be watched (Linux has 64).
const MAX_SIGNAL: usize = 65;

/// Deliveries per signal since the process started.
static COUNTS: [AtomicU64; MAX_SIGNAL] = [const { AtomicU64::new(0) }; MAX_SIGNAL];
/// The handler address that was installed before ours, per signal (0 = none
/// to chain: default or ignore).
static PREV_HANDLER: [AtomicUsize; MAX_SIGNAL] = [const { AtomicUsize::new(0) }; MAX_SIGNAL];
/// Whether that previous handler takes `(sig, info, context)`.
static PREV_SIGINFO: [AtomicBool; MAX_SIGNAL] = [const { AtomicBool::new(false) }; MAX_SIGNAL];
/// Live owner watches per signal: while above 0 the previous handler is not
/// called (see "Who owns a notice").
static OWNERS: [AtomicUsize; MAX_SIGNAL] = [const { AtomicUsize::new(0) }; MAX_SIGNAL];
/// Set by [`ignore_warnings_at_exit`]: when the last watch of this signal goes,
/// a default disposition is restored as "ignore".
static IGNORE_AT_EXIT: [AtomicBool; MAX_SIGNAL] = [const { AtomicBool::new(false) }; MAX_SIGNAL];
/// Write end of the self-pipe, -1 until the dispatcher runs.
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// The process that installed our handlers and runs the dispatcher (0 =
/// none yet). A different `getpid()` means a forked child.
static OWNER_PID: AtomicI32 = AtomicI32::new(0);

/// The full previous disposition per signal, readable from the signal
/// handler without a lock (a forked child restores it). Written only under
/// [`installed`]'s mutex, before our handler is installed for that signal;
/// the handler reads it only after seeing our handler was installed.
struct PreviousActions([UnsafeCell<libc::sigaction>; MAX_SIGNAL]);
// SAFETY: see the struct's comment: writes happen-before the installation
// of the handler that reads them (sigaction is a full barrier in practice,
// and a SeqCst fence is issued between the write and the install).
unsafe impl Sync for PreviousActions {}
static PREV_ACTION: PreviousActions =
    // SAFETY: an all-zero sigaction is SIG_DFL with an empty mask.
    PreviousActions([const { UnsafeCell::new(unsafe { std::mem::zeroed() }) }; MAX_SIGNAL]);

thread_local! {
    /// Depth of [`on_signal`] on this thread, to cut a chain that loops back.
    static IN_HANDLER: Cell<u32> = const { Cell::new(0) };
}

/// Where a watch made with [`SignalWatch::with_sink`] sends its deliveries:
/// called on the dispatcher thread with the signal's number, once per
/// wake-up of the dispatcher in which that signal was delivered (deliveries
/// in quick succession are coalesced). It must not block or call Python; the
/// binding's posts into an inbox.
pub type Sink = Box<dyn Fn(i32) + Send + Sync>;

/// One watch's subscription to the dispatcher.
struct Subscription {
    signals: Vec<i32>,
    /// The process that made it: a forked child's dispatcher skips its
    /// parent's subscriptions (it cannot lock anything the parent held).
    pid: i32,
    /// Deliveries per signal already posted.
    posted: Mutex<Vec<u64>>,
    sink: Sink,
}

impl Subscription {
    /// Posts every watched signal delivered since the last call.
    fn forward(&self) {
        let fresh: Vec<i32> = {
            let mut posted = self.posted.lock();
            self.signals
                .iter()
                .zip(posted.iter_mut())
                .filter_map(|(&s, seen)| {
                    let now = delivered(s);
                    (now != *seen).then(|| {
                        *seen = now;
                        s
                    })
                })
                .collect()
        };
        for s in fresh {
            (self.sink)(s);
        }
    }
}

/// Every live subscription. The dispatcher clones the list under the lock
/// and posts after releasing it.
fn subscriptions() -> &'static Mutex<Vec<std::sync::Weak<Subscription>>> {
    static SUBSCRIPTIONS: OnceLock<Mutex<Vec<std::sync::Weak<Subscription>>>> = OnceLock::new();
    SUBSCRIPTIONS.get_or_init(|| Mutex::new(Vec::new()))
}

/// The dispatcher's work for one wake-up: post to every subscription of
/// this process, then wake the waiters.
fn dispatch() {
    let pid = current_pid();
    let live: Vec<Arc<Subscription>> = {
        let mut list = subscriptions().lock();
        list.retain(|s| s.strong_count() > 0);
        list.iter().filter_map(std::sync::Weak::upgrade).collect()
    };
    for sub in live.iter().filter(|s| s.pid == pid) {
        sub.forward();
    }
    notify_all();
}

/// Wakes waiters. `generation` counts wake-ups so that a waiter that checked
/// the counters just before a signal cannot miss its notification.
struct Wakeup {
    generation: Mutex<u64>,
    /// Signalled by the dispatcher on every delivery and by
    /// [`SignalWatch::trigger`].
    changed: Condvar,
}

fn wakeup() -> &'static Wakeup {
    static WAKEUP: OnceLock<Wakeup> = OnceLock::new();
    WAKEUP.get_or_init(|| Wakeup {
        generation: Mutex::new(0),
        changed: Condvar::new(),
    })
}

fn notify_all() {
    let w = wakeup();
    *w.generation.lock() += 1;
    w.changed.notify_all();
}

/// Errors of [`SignalWatch::new`].
#[derive(Debug, Error)]
pub enum InstallError {
    /// The number is not a signal that can be caught (SIGKILL, SIGSTOP, out
    /// of range).
    #[error("signal {0} cannot be watched")]
    Uncatchable(i32),
    /// The operating system refused.
    #[error("installing a handler for signal {signal} failed: {source}")]
    Os {
        /// The signal.
        signal: i32,
        /// The OS error.
        source: io::Error,
    },
}

/// What a watch does with a signal; see "Who owns a notice".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The notice is this watch's to act on: the previous handler is not
    /// called while it lives.
    Owner,
    /// The watch only records the notice; the previous handler still runs.
    Observer,
}

struct Installed {
    previous: libc::sigaction,
    watchers: usize,
}

fn installed() -> &'static Mutex<HashMap<i32, Installed>> {
    static INSTALLED: OnceLock<Mutex<HashMap<i32, Installed>>> = OnceLock::new();
    INSTALLED.get_or_init(|| Mutex::new(HashMap::new()))
}

fn our_handler() -> usize {
    on_signal as *const () as usize
}

fn current_pid() -> i32 {
    // SAFETY: getpid has no preconditions and is async-signal-safe.
    unsafe { libc::getpid() }
}

extern "C" fn on_signal(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: only async-signal-safe calls below (atomics, getpid, write(2),
    // sigaction, raise, and the previous handler, which was itself installed
    // as a signal handler). errno is preserved for the interrupted code.
    unsafe {
        let errno = *libc::__errno_location();
        let Ok(index) = usize::try_from(signal) else { return };
        if index >= MAX_SIGNAL {
            return;
        }
        if current_pid() != OWNER_PID.load(Ordering::SeqCst) {
            // A forked child: step aside. The re-raised signal is blocked
            // while this handler runs and is delivered, with the previous
            // disposition, as soon as it returns.
            libc::sigaction(signal, PREV_ACTION.0[index].get(), std::ptr::null_mut());
            libc::raise(signal);
            *libc::__errno_location() = errno;
            return;
        }
        COUNTS[index].fetch_add(1, Ordering::SeqCst);
        let fd = PIPE_WRITE.load(Ordering::SeqCst);
        if fd >= 0 {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let byte = signal as u8;
            let _ = libc::write(fd, std::ptr::addr_of!(byte).cast(), 1);
        }
        let previous = PREV_HANDLER[index].load(Ordering::SeqCst);
        let depth = IN_HANDLER.with(Cell::get);
        if previous != 0 && depth == 0 && OWNERS[index].load(Ordering::SeqCst) == 0 {
            IN_HANDLER.with(|d| d.set(1));
            if PREV_SIGINFO[index].load(Ordering::SeqCst) {
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(previous);
                f(signal, info, context);
            } else {
                let f: extern "C" fn(libc::c_int) = std::mem::transmute(previous);
                f(signal);
            }
            IN_HANDLER.with(|d| d.set(0));
        }
        *libc::__errno_location() = errno;
    }
}

/// Starts the dispatcher thread and the self-pipe once per process (again
/// in a forked child, which inherits neither thread). Called with
/// [`installed`]'s mutex held.
fn ensure_dispatcher(table: &mut HashMap<i32, Installed>) -> io::Result<()> {
    let pid = current_pid();
    let owner = OWNER_PID.load(Ordering::SeqCst);
    if owner == pid {
        return Ok(());
    }
    if owner != 0 {
        // A forked child: the parent's watches are not ours. Entries whose
        // handler is still installed keep their previous disposition with no
        // watcher, so the next install reuses it instead of chaining to
        // itself.
        for entry in table.values_mut() {
            entry.watchers = 0;
        }
        for owners in &OWNERS {
            owners.store(0, Ordering::SeqCst);
        }
    }
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: plain pipe2 on a two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let read_fd = fds[0];
    // The reader blocks: clear O_NONBLOCK on the read end only.
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let flags = libc::fcntl(read_fd, libc::F_GETFL);
        libc::fcntl(read_fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
    }
    let spawned = std::thread::Builder::new().name("tfh-signal-dispatch".into()).spawn(move || {
        let mut buf = [0u8; 64];
        loop {
            // SAFETY: reading into a local buffer from our pipe.
            let n = unsafe { libc::read(read_fd, buf.as_mut_ptr().cast(), buf.len()) };
            if n > 0 {
                dispatch();
            } else if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            } else {
                return;
            }
        }
    });
    if let Err(e) = spawned {
        // SAFETY: closing the descriptors we just made.
        unsafe {
            libc::close(fds[0]);
            libc::close(fds[1]);
        }
        return Err(e);
    }
    let old_write = PIPE_WRITE.swap(fds[1], Ordering::SeqCst);
    if old_write >= 0 {
        // The parent's pipe, inherited: the child must not wake the parent.
        // SAFETY: closing an inherited descriptor nothing else here uses.
        unsafe { libc::close(old_write) };
    }
    OWNER_PID.store(pid, Ordering::SeqCst);
    Ok(())
}

fn install(signal: i32, role: Role) -> Result<(), InstallError> {
    let index = usize::try_from(signal).map_err(|_| InstallError::Uncatchable(signal))?;
    if index == 0 || index >= MAX_SIGNAL || signal == libc::SIGKILL || signal == libc::SIGSTOP {
        return Err(InstallError::Uncatchable(signal));
    }
    let chained = {
        let mut table = installed().lock();
        ensure_dispatcher(&mut table).map_err(|source| InstallError::Os { signal, source })?;
        install_locked(&mut table, signal, index)?;
        if role == Role::Owner {
            OWNERS[index].fetch_add(1, Ordering::SeqCst);
        }
        PREV_HANDLER[index].load(Ordering::SeqCst) != 0
    };
    // Logged after the mutex is released (pyo3-log needs the GIL).
    log::debug!(
        "watching signal {signal} as {} (previous handler: {})",
        if role == Role::Owner { "owner" } else { "observer" },
        match (chained, role) {
            (false, _) => "none",
            (true, Role::Owner) => "not called while a handler is open",
            (true, Role::Observer) => "chained",
        }
    );
    Ok(())
}

fn install_locked(table: &mut HashMap<i32, Installed>, signal: i32, index: usize) -> Result<(), InstallError> {
    // SAFETY: sigaction queries and installs with structs we own.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
            return Err(InstallError::Os {
                signal,
                source: io::Error::last_os_error(),
            });
        }
        if let Some(entry) = table.get_mut(&signal) {
            if entry.watchers > 0 || current.sa_sigaction == our_handler() {
                // Ours is installed (or, in a forked child, still inherited):
                // the recorded previous disposition stands.
                entry.watchers += 1;
                return Ok(());
            }
            // A dormant entry (we were displaced and later uninstalled): the
            // current handler may chain to ours; the depth guard cuts that
            // loop. Record the current one as the new previous.
            table.remove(&signal);
        }
        let previous = current;
        let chain = previous.sa_sigaction;
        let chain = if chain == libc::SIG_DFL || chain == libc::SIG_IGN || chain == our_handler() {
            0
        } else {
            chain
        };
        *PREV_ACTION.0[index].get() = previous;
        PREV_SIGINFO[index].store(previous.sa_flags & libc::SA_SIGINFO != 0, Ordering::SeqCst);
        PREV_HANDLER[index].store(chain, Ordering::SeqCst);
        std::sync::atomic::fence(Ordering::SeqCst);
        let mut ours: libc::sigaction = std::mem::zeroed();
        ours.sa_sigaction = our_handler();
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
        libc::sigemptyset(&mut ours.sa_mask);
        if libc::sigaction(signal, &ours, std::ptr::null_mut()) != 0 {
            PREV_HANDLER[index].store(0, Ordering::SeqCst);
            return Err(InstallError::Os {
                signal,
                source: io::Error::last_os_error(),
            });
        }
        table.insert(signal, Installed { previous, watchers: 1 });
    }
    Ok(())
}

fn uninstall(signal: i32, role: Role) {
    let Ok(index) = usize::try_from(signal) else { return };
    let mut table = installed().lock();
    let Some(entry) = table.get_mut(&signal) else { return };
    if entry.watchers == 0 {
        return;
    }
    if role == Role::Owner {
        // Saturating: a forked child reset the count.
        let _ = OWNERS[index].fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
    }
    entry.watchers -= 1;
    if entry.watchers > 0 {
        return;
    }
    // SAFETY: sigaction query and restore with structs we own.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current);
        if current.sa_sigaction == our_handler() {
            let mut restore = entry.previous;
            if IGNORE_AT_EXIT[index].load(Ordering::SeqCst) && restore.sa_sigaction == libc::SIG_DFL {
                restore.sa_sigaction = libc::SIG_IGN;
            }
            libc::sigaction(signal, &restore, std::ptr::null_mut());
            table.remove(&signal);
            PREV_HANDLER[index].store(0, Ordering::SeqCst);
        }
        // Otherwise someone replaced ours: theirs stays, and the entry stays
        // dormant with its chain to the previous handler, since theirs may
        // still call ours (zeroing it would drop the previous handler from
        // that chain).
    }
}

/// Whether `signal` only warns of an end to come rather than ends the process:
/// SIGUSR1 and SIGUSR2, what a scheduler sends ahead of a time limit (SLURM's
/// `--signal`, whose default is SIGUSR1). SIGTERM and the rest are not: they
/// are the end itself.
#[must_use]
pub fn is_warning(signal: i32) -> bool {
    signal == libc::SIGUSR1 || signal == libc::SIGUSR2
}

/// The process is in its exit (the handler's training is over): a warning
/// signal ([`is_warning`]) among `signals` is ignored from now on where its
/// disposition is, or when the last watch of it goes would be restored to, the
/// default action. That action ends the process (with 128 + the signal's
/// number), which for a process whose work is done and that is ending anyway
/// turns a finished job into a failed one: SLURM's time-limit warning arriving
/// during TensorFlow's teardown did so. A handler someone else installed stays.
/// Returns the signals set to be ignored.
pub fn ignore_warnings_at_exit(signals: &[i32]) -> Vec<i32> {
    let mut ignored = Vec::new();
    let table = installed().lock();
    for &signal in signals {
        let Ok(index) = usize::try_from(signal) else { continue };
        if !is_warning(signal) || index >= MAX_SIGNAL {
            continue;
        }
        IGNORE_AT_EXIT[index].store(true, Ordering::SeqCst);
        // SAFETY: sigaction query and set with structs we own.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut current) != 0 {
                continue;
            }
            if current.sa_sigaction == our_handler() {
                // Still ours: `uninstall` ignores it when the last watch goes
                // (until then ours takes it, and nobody acts on it).
                if table.get(&signal).is_some_and(|e| e.previous.sa_sigaction == libc::SIG_DFL) {
                    ignored.push(signal);
                }
            } else if current.sa_sigaction == libc::SIG_DFL {
                let mut ignore: libc::sigaction = std::mem::zeroed();
                ignore.sa_sigaction = libc::SIG_IGN;
                libc::sigemptyset(&mut ignore.sa_mask);
                if libc::sigaction(signal, &ignore, std::ptr::null_mut()) == 0 {
                    ignored.push(signal);
                }
            }
        }
    }
    ignored
}

/// How many times `signal` was delivered since the process started (0 for
/// numbers out of range).
#[must_use]
pub fn delivered(signal: i32) -> u64 {
    usize::try_from(signal)
        .ok()
        .filter(|&i| i < MAX_SIGNAL)
        .map_or(0, |i| COUNTS[i].load(Ordering::SeqCst))
}

/// What ended a [`SignalWatch::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wake {
    /// This signal was delivered.
    Signal(i32),
    /// [`SignalWatch::trigger`] was called.
    Triggered,
}

/// Watches a set of signals for one consumer (one handler or watcher).
/// Dropping it uninstalls what it installed.
pub struct SignalWatch {
    signals: Vec<i32>,
    role: Role,
    /// The process it was made in: dropped in a forked child, it leaves the
    /// child's (reset) bookkeeping alone.
    pid: i32,
    seen: Mutex<Vec<u64>>,
    triggered: Arc<AtomicBool>,
    /// Set once [`SignalWatch::newly_displaced`] reported displaced handlers.
    displaced_reported: AtomicBool,
    /// Present for a watch made with [`SignalWatch::with_sink`]; dropping it
    /// ends the posting (the dispatcher holds it only weakly).
    _subscription: Option<Arc<Subscription>>,
}

impl SignalWatch {
    /// Installs handlers for `signals` (possibly none: then only
    /// [`SignalWatch::trigger`] wakes it). Deliveries before this call are
    /// not reported.
    ///
    /// # Errors
    ///
    /// [`InstallError`] when a signal cannot be caught or the OS refuses; the
    /// signals installed before the failing one are uninstalled again.
    pub fn new(signals: &[i32], role: Role) -> Result<Self, InstallError> {
        Self::install_all(signals, role, None)
    }

    /// Like [`SignalWatch::new`], and every later delivery of a watched
    /// signal is also posted to `sink` by the dispatcher thread, at once.
    /// [`SignalWatch::poll`] and [`SignalWatch::wait`] keep their own
    /// account and still report each delivery once.
    ///
    /// # Errors
    ///
    /// As [`SignalWatch::new`].
    pub fn with_sink(signals: &[i32], role: Role, sink: Sink) -> Result<Self, InstallError> {
        Self::install_all(signals, role, Some(sink))
    }

    fn install_all(signals: &[i32], role: Role, sink: Option<Sink>) -> Result<Self, InstallError> {
        let mut done = Vec::with_capacity(signals.len());
        for &s in signals {
            if done.contains(&s) {
                continue;
            }
            if let Err(e) = install(s, role) {
                for &d in &done {
                    uninstall(d, role);
                }
                return Err(e);
            }
            done.push(s);
        }
        let seen = done.iter().map(|&s| delivered(s)).collect();
        let subscription = sink.map(|sink| {
            let mut list = subscriptions().lock();
            // Counted under the list's lock: a delivery the dispatcher
            // reads after this is one it posts to this subscription, and
            // one counted before it is not reported ("deliveries before
            // this call").
            let sub = Arc::new(Subscription {
                posted: Mutex::new(done.iter().map(|&s| delivered(s)).collect()),
                signals: done.clone(),
                pid: current_pid(),
                sink,
            });
            list.push(Arc::downgrade(&sub));
            sub
        });
        Ok(SignalWatch {
            signals: done,
            role,
            pid: current_pid(),
            seen: Mutex::new(seen),
            triggered: Arc::new(AtomicBool::new(false)),
            displaced_reported: AtomicBool::new(false),
            _subscription: subscription,
        })
    }

    /// The signals watched.
    #[must_use]
    pub fn signals(&self) -> &[i32] {
        &self.signals
    }

    /// Whether this watch owns its signals' notices.
    #[must_use]
    pub fn role(&self) -> Role {
        self.role
    }

    /// The watched signals whose disposition is no longer ours (someone
    /// called `signal.signal` or `sigaction` after us): they are not seen
    /// any more.
    #[must_use]
    pub fn displaced(&self) -> Vec<i32> {
        self.signals
            .iter()
            .copied()
            .filter(|&s| {
                // SAFETY: querying a disposition into a struct we own.
                unsafe {
                    let mut current: libc::sigaction = std::mem::zeroed();
                    libc::sigaction(s, std::ptr::null(), &mut current) == 0 && current.sa_sigaction != our_handler()
                }
            })
            .collect()
    }

    /// The watched signals whose handler was replaced ([`SignalWatch::displaced`]),
    /// the first time any is found; None before and after: each wait on the
    /// watch checks it between its slices, and the warning
    /// ([`warn_displaced`]) is given once per watch.
    pub fn newly_displaced(&self) -> Option<Vec<i32>> {
        if self.displaced_reported.load(Ordering::Relaxed) {
            return None;
        }
        let displaced = self.displaced();
        (!displaced.is_empty()).then(|| {
            self.displaced_reported.store(true, Ordering::Relaxed);
            displaced
        })
    }

    /// Wakes the waiter as if a notice arrived (a termination source that is
    /// not a signal, or a test).
    pub fn trigger(&self) {
        self.triggered.store(true, Ordering::SeqCst);
        notify_all();
    }

    /// Reports a delivery or trigger that happened since the last report,
    /// without blocking.
    pub fn poll(&self) -> Option<Wake> {
        if self.triggered.swap(false, Ordering::SeqCst) {
            return Some(Wake::Triggered);
        }
        let mut seen = self.seen.lock();
        for (i, &s) in self.signals.iter().enumerate() {
            let now = delivered(s);
            if now != seen[i] {
                seen[i] = now;
                return Some(Wake::Signal(s));
            }
        }
        None
    }

    /// Blocks until a watched signal arrives, [`SignalWatch::trigger`] is
    /// called, or `timeout` passes (then `None`).
    pub fn wait(&self, timeout: Duration) -> Option<Wake> {
        let deadline = Instant::now() + timeout;
        let w = wakeup();
        loop {
            let mut generation = w.generation.lock();
            if let Some(wake) = self.poll() {
                return Some(wake);
            }
            let seen_generation = *generation;
            while *generation == seen_generation {
                if w.changed.wait_until(&mut generation, deadline).timed_out() {
                    drop(generation);
                    return self.poll();
                }
            }
        }
    }
}

impl Drop for SignalWatch {
    fn drop(&mut self) {
        if self.pid != current_pid() {
            return;
        }
        for &s in &self.signals {
            uninstall(s, self.role);
        }
    }
}

/// The warning for [`SignalWatch::newly_displaced`]'s signals. It may attach
/// to the interpreter (pyo3-log): the binding gives it with no lock held.
pub fn warn_displaced(signals: &[i32]) {
    let names: Vec<String> = signals.iter().map(|s| format!("signal {s}")).collect();
    log::warn!(
        target: "tf_failure_handling",
        "The handler of {} was replaced after tf_failure_handling installed its own (a later \
         signal.signal or sigaction call): that signal no longer reaches the preemption handler or \
         watcher. Install your handler before building them, or close them first.",
        names.join(", ")
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    // Signals are process-wide; each test uses its own signal (SIGUSR2,
    // SIGWINCH, SIGURG, SIGPROF, SIGVTALRM, SIGUSR1), which nothing else in the
    // test binary touches, and runs its steps in one test to avoid interleaving.

    #[test]
    fn at_exit_a_warning_signal_is_ignored_not_restored_to_its_fatal_default() {
        // SIGTERM and the like are no warnings: left alone (the numbers are
        // only checked against the rule, nothing is installed for them).
        assert!(is_warning(libc::SIGUSR1) && is_warning(libc::SIGUSR2));
        assert!(!is_warning(libc::SIGTERM) && !is_warning(libc::SIGINT) && !is_warning(libc::SIGHUP));
        assert_eq!(ignore_warnings_at_exit(&[libc::SIGTERM, 0, -3, 999]), Vec::<i32>::new());

        // SIGUSR1 watched by a handler when the exit begins: ours takes it
        // until the last watch goes, and then it is ignored, not SIG_DFL.
        assert_eq!(current_handler(libc::SIGUSR1), libc::SIG_DFL);
        let watch = SignalWatch::new(&[libc::SIGUSR1], Role::Owner).unwrap();
        assert_eq!(ignore_warnings_at_exit(&[libc::SIGUSR1]), vec![libc::SIGUSR1]);
        assert_eq!(current_handler(libc::SIGUSR1), our_handler());
        drop(watch);
        assert_eq!(current_handler(libc::SIGUSR1), libc::SIG_IGN);
        // SAFETY: the signal is ignored now; raising it must not end the test.
        unsafe { libc::raise(libc::SIGUSR1) };

        // Already at its default (the watch went first): ignored at once. A
        // handler someone else installed stays.
        // SAFETY: restoring the default disposition of a signal only this test uses.
        unsafe { libc::signal(libc::SIGUSR1, libc::SIG_DFL) };
        assert_eq!(ignore_warnings_at_exit(&[libc::SIGUSR1]), vec![libc::SIGUSR1]);
        assert_eq!(current_handler(libc::SIGUSR1), libc::SIG_IGN);
        // SAFETY: a plain handler (never called here: nothing raises SIGUSR1 now).
        unsafe { libc::signal(libc::SIGUSR1, previous_handler as *const () as usize) };
        let theirs = current_handler(libc::SIGUSR1);
        assert_eq!(theirs, previous_handler as *const () as usize);
        assert_eq!(ignore_warnings_at_exit(&[libc::SIGUSR1]), Vec::<i32>::new());
        assert_eq!(current_handler(libc::SIGUSR1), theirs);
    }
    #[test]
    fn signal_wakes_waiter_from_another_thread_and_uninstall_restores() {
        let watch = Arc::new(SignalWatch::new(&[libc::SIGUSR2], Role::Observer).unwrap());
        assert_eq!(watch.poll(), None);
        let w = Arc::clone(&watch);
        let t = std::thread::spawn(move || w.wait(Duration::from_secs(10)));
        std::thread::sleep(Duration::from_millis(50));
        // SAFETY: raising a signal we handle.
        unsafe { libc::raise(libc::SIGUSR2) };
        assert_eq!(t.join().unwrap(), Some(Wake::Signal(libc::SIGUSR2)));
        assert_eq!(watch.poll(), None, "a delivery is reported once");

        // Nothing pending: the wait ends at its timeout.
        let start = Instant::now();
        assert_eq!(watch.wait(Duration::from_millis(100)), None);
        assert!(start.elapsed() >= Duration::from_millis(100));

        watch.trigger();
        assert_eq!(watch.wait(Duration::from_secs(1)), Some(Wake::Triggered));

        let watch = Arc::try_unwrap(watch).ok().unwrap();
        drop(watch);
        // SAFETY: querying the disposition.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGUSR2, std::ptr::null(), &mut current);
            assert_eq!(current.sa_sigaction, libc::SIG_DFL, "previous disposition restored");
        }
    }

    static CHAINED: AtomicU64 = AtomicU64::new(0);
    extern "C" fn previous_handler(_: libc::c_int) {
        CHAINED.fetch_add(1, Ordering::SeqCst);
    }

    fn current_handler(signal: i32) -> usize {
        // SAFETY: querying the disposition.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            libc::sigaction(signal, std::ptr::null(), &mut current);
            current.sa_sigaction
        }
    }

    /// Observers chain the previous handler; an owner stops it until the
    /// last owner is gone; the refcount keeps the install; the last drop
    /// restores the previous handler. One test: the steps share SIGWINCH.
    #[test]
    fn observers_chain_owners_hold_back_the_previous_handler() {
        // SAFETY: installing a plain handler for SIGWINCH.
        unsafe { libc::signal(libc::SIGWINCH, previous_handler as *const () as usize) };
        let a = SignalWatch::new(&[libc::SIGWINCH], Role::Observer).unwrap();
        let b = SignalWatch::new(&[libc::SIGWINCH, libc::SIGWINCH], Role::Observer).unwrap();
        assert_eq!(b.signals(), &[libc::SIGWINCH]);
        unsafe { libc::raise(libc::SIGWINCH) };
        assert_eq!(a.wait(Duration::from_secs(5)), Some(Wake::Signal(libc::SIGWINCH)));
        assert_eq!(b.wait(Duration::from_secs(5)), Some(Wake::Signal(libc::SIGWINCH)));
        assert_eq!(CHAINED.load(Ordering::SeqCst), 1);

        let owner = SignalWatch::new(&[libc::SIGWINCH], Role::Owner).unwrap();
        unsafe { libc::raise(libc::SIGWINCH) };
        assert_eq!(owner.wait(Duration::from_secs(5)), Some(Wake::Signal(libc::SIGWINCH)));
        assert_eq!(a.wait(Duration::from_secs(5)), Some(Wake::Signal(libc::SIGWINCH)));
        assert_eq!(CHAINED.load(Ordering::SeqCst), 1, "an owner holds the previous handler back");
        drop(owner);

        drop(a);
        unsafe { libc::raise(libc::SIGWINCH) };
        assert_eq!(b.wait(Duration::from_secs(5)), Some(Wake::Signal(libc::SIGWINCH)));
        assert_eq!(CHAINED.load(Ordering::SeqCst), 2, "chained again once no owner is left");
        assert!(b.displaced().is_empty());
        drop(b);
        assert_eq!(current_handler(libc::SIGWINCH), previous_handler as *const () as usize);
    }

    static THIRD_PARTY_CALLS: AtomicU64 = AtomicU64::new(0);
    static THIRD_PARTY_NEXT: AtomicUsize = AtomicUsize::new(0);
    extern "C" fn third_party(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
        THIRD_PARTY_CALLS.fetch_add(1, Ordering::SeqCst);
        let next = THIRD_PARTY_NEXT.load(Ordering::SeqCst);
        if next != 0 {
            // SAFETY: `next` is our own SA_SIGINFO handler, recorded below.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = unsafe { std::mem::transmute(next) };
            f(signal, info, context);
        }
    }

    fn install_third_party(signal: i32) {
        // SAFETY: sigaction with structs we own; the third party chains to
        // whatever was installed before it (ours).
        unsafe {
            let mut ours: libc::sigaction = std::mem::zeroed();
            ours.sa_sigaction = third_party as *const () as usize;
            ours.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut ours.sa_mask);
            let mut previous: libc::sigaction = std::mem::zeroed();
            libc::sigaction(signal, &ours, &mut previous);
            THIRD_PARTY_NEXT.store(previous.sa_sigaction, Ordering::SeqCst);
        }
    }

    /// A handler installed after ours displaces it (reported), stays when our
    /// last watch goes, and a later watch that chains to it while it chains
    /// to us does not loop: each handler runs once per delivery.
    #[test]
    fn a_later_handler_displaces_ours_and_chains_do_not_loop() {
        let first = SignalWatch::new(&[libc::SIGURG], Role::Observer).unwrap();
        assert_eq!(first.newly_displaced(), None, "ours is in place");
        install_third_party(libc::SIGURG);
        assert_eq!(first.displaced(), vec![libc::SIGURG]);
        assert_eq!(first.newly_displaced(), Some(vec![libc::SIGURG]), "reported once...");
        assert_eq!(first.newly_displaced(), None, "...per watch");
        assert_eq!(first.displaced(), vec![libc::SIGURG], "while it stays displaced");
        drop(first);
        assert_eq!(current_handler(libc::SIGURG), third_party as *const () as usize, "theirs stays");

        let second = SignalWatch::new(&[libc::SIGURG], Role::Observer).unwrap();
        assert!(second.displaced().is_empty());
        let before = THIRD_PARTY_CALLS.load(Ordering::SeqCst);
        unsafe { libc::raise(libc::SIGURG) };
        assert_eq!(second.wait(Duration::from_secs(5)), Some(Wake::Signal(libc::SIGURG)));
        assert_eq!(THIRD_PARTY_CALLS.load(Ordering::SeqCst), before + 1, "called once, no loop");
        drop(second);
        assert_eq!(current_handler(libc::SIGURG), third_party as *const () as usize);
    }

    /// In a forked child our handler steps aside: the previous disposition
    /// (here the default, which ends the process) applies.
    #[test]
    fn a_forked_child_gets_the_previous_disposition_back() {
        let watch = SignalWatch::new(&[libc::SIGPROF], Role::Owner).unwrap();
        // SAFETY: the child only calls async-signal-safe functions before
        // _exit.
        unsafe {
            let pid = libc::fork();
            assert!(pid >= 0);
            if pid == 0 {
                libc::raise(libc::SIGPROF);
                libc::_exit(7);
            }
            let mut status = 0;
            assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
            assert!(libc::WIFSIGNALED(status), "the child survived SIGPROF (status {status})");
            assert_eq!(libc::WTERMSIG(status), libc::SIGPROF);
        }
        assert_eq!(watch.poll(), None, "the child's signal did not reach the parent");
    }

    /// A watch with a sink has every delivery posted by the dispatcher, from
    /// the moment it is made until it is dropped; its own `poll` still
    /// reports the delivery too.
    #[test]
    fn a_sink_gets_each_delivery_from_the_dispatcher_until_the_watch_is_dropped() {
        let signal = libc::SIGVTALRM;
        // A delivery before the watch exists is not reported.
        let before = SignalWatch::new(&[signal], Role::Observer).unwrap();
        unsafe { libc::raise(signal) };
        assert_eq!(before.wait(Duration::from_secs(30)), Some(Wake::Signal(signal)));

        let (tx, rx) = std::sync::mpsc::channel();
        let watch = SignalWatch::with_sink(
            &[signal],
            Role::Owner,
            Box::new(move |s| {
                let _ = tx.send(s);
            }),
        )
        .unwrap();
        assert!(rx.try_recv().is_err(), "an earlier delivery was posted");
        unsafe { libc::raise(signal) };
        assert_eq!(rx.recv_timeout(Duration::from_secs(30)), Ok(signal));
        assert_eq!(watch.poll(), Some(Wake::Signal(signal)), "poll keeps its own account");
        drop(watch);
        // A later subscription is posted to after every earlier one (the
        // dispatcher goes through them in order): once it has the delivery,
        // the dropped watch's sink would have had it too.
        let (later_tx, later_rx) = std::sync::mpsc::channel();
        let later = SignalWatch::with_sink(
            &[signal],
            Role::Observer,
            Box::new(move |s| {
                let _ = later_tx.send(s);
            }),
        )
        .unwrap();
        unsafe { libc::raise(signal) };
        assert_eq!(later_rx.recv_timeout(Duration::from_secs(30)), Ok(signal));
        assert!(rx.try_recv().is_err(), "a dropped watch's sink was called");
        drop(later);
        drop(before);
    }

    #[test]
    fn uncatchable_signals_are_refused() {
        assert!(matches!(
            SignalWatch::new(&[libc::SIGKILL], Role::Owner),
            Err(InstallError::Uncatchable(_))
        ));
        assert!(matches!(SignalWatch::new(&[0], Role::Owner), Err(InstallError::Uncatchable(0))));
        assert!(matches!(SignalWatch::new(&[999], Role::Owner), Err(InstallError::Uncatchable(999))));
    }
}
