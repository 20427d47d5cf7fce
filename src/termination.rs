//! Termination sources: turning "the machine is going away" into one event.
//!
//! A worker learns of its end from a signal (SIGTERM everywhere; SIGUSR1 or
//! another signal configured on SLURM), from a user's
//! `termination_watcher_fn`, or from a platform (later: metadata servers).
//! Whatever the source, the result is one [`crate::step_resolution::Notice`]
//! handed to the resolver. This module holds the part that cannot be
//! sans-IO: the process-wide signal plumbing. Everything it decides is
//! trivial (a counter went up); the decisions live in the resolver.
//!
//! # Signals
//!
//! TensorFlow installs its SIGTERM handler with Python's `signal.signal`,
//! which only works on the main thread and silently replaces whatever handler
//! was there. Here a C-level `sigaction` handler is installed instead, from
//! any thread:
//!
//! * the handler only does async-signal-safe work: it bumps a per-signal
//!   counter, writes one byte to a non-blocking self-pipe, and calls the
//!   handler that was installed before it (Python's own C handler, so a
//!   Python-level `signal.signal` handler still runs on the main thread), but
//!   never the default action, which would kill the process before it can
//!   save;
//! * one dispatcher thread blocks on the pipe and wakes every
//!   [`SignalWatch`] waiting on a condition variable, so a watcher sees the
//!   signal at once, not after a poll interval;
//! * installs are reference-counted per signal; when the last watch of a
//!   signal is dropped, the previous disposition is restored (unless someone
//!   replaced ours meanwhile, in which case theirs is left alone).

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
/// Write end of the self-pipe, -1 until the dispatcher runs.
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);

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

struct Installed {
    previous: libc::sigaction,
    watchers: usize,
}

fn installed() -> &'static Mutex<HashMap<i32, Installed>> {
    static INSTALLED: OnceLock<Mutex<HashMap<i32, Installed>>> = OnceLock::new();
    INSTALLED.get_or_init(|| Mutex::new(HashMap::new()))
}

extern "C" fn on_signal(signal: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: only async-signal-safe calls below (atomics, write(2), and the
    // previous handler, which was itself installed as a signal handler).
    // errno is preserved for the interrupted code.
    unsafe {
        let errno = *libc::__errno_location();
        let Ok(index) = usize::try_from(signal) else { return };
        if index < MAX_SIGNAL {
            COUNTS[index].fetch_add(1, Ordering::SeqCst);
            let fd = PIPE_WRITE.load(Ordering::SeqCst);
            if fd >= 0 {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let byte = signal as u8;
                let _ = libc::write(fd, std::ptr::addr_of!(byte).cast(), 1);
            }
            let previous = PREV_HANDLER[index].load(Ordering::SeqCst);
            if previous != 0 {
                if PREV_SIGINFO[index].load(Ordering::SeqCst) {
                    let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = std::mem::transmute(previous);
                    f(signal, info, context);
                } else {
                    let f: extern "C" fn(libc::c_int) = std::mem::transmute(previous);
                    f(signal);
                }
            }
        }
        *libc::__errno_location() = errno;
    }
}

/// Starts the dispatcher thread and the self-pipe once.
fn ensure_dispatcher() -> io::Result<()> {
    static STARTED: OnceLock<Result<(), i32>> = OnceLock::new();
    let result = STARTED.get_or_init(|| {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: plain pipe2 on a two-element array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        let read_fd = fds[0];
        // The reader blocks: clear O_NONBLOCK on the read end only.
        // SAFETY: fcntl on a descriptor we own.
        unsafe {
            let flags = libc::fcntl(read_fd, libc::F_GETFL);
            libc::fcntl(read_fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
        }
        PIPE_WRITE.store(fds[1], Ordering::SeqCst);
        std::thread::Builder::new()
            .name("tfh-signal-dispatch".into())
            .spawn(move || {
                let mut buf = [0u8; 64];
                loop {
                    // SAFETY: reading into a local buffer from our pipe.
                    let n = unsafe { libc::read(read_fd, buf.as_mut_ptr().cast(), buf.len()) };
                    if n > 0 {
                        notify_all();
                    } else if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                        continue;
                    } else {
                        return;
                    }
                }
            })
            .map(|_| ())
            .map_err(|e| e.raw_os_error().unwrap_or(0))
    });
    (*result).map_err(io::Error::from_raw_os_error)
}

fn install(signal: i32) -> Result<(), InstallError> {
    let index = usize::try_from(signal).map_err(|_| InstallError::Uncatchable(signal))?;
    if index == 0 || index >= MAX_SIGNAL || signal == libc::SIGKILL || signal == libc::SIGSTOP {
        return Err(InstallError::Uncatchable(signal));
    }
    ensure_dispatcher().map_err(|source| InstallError::Os { signal, source })?;
    let mut table = installed().lock();
    if let Some(entry) = table.get_mut(&signal) {
        entry.watchers += 1;
        return Ok(());
    }
    // SAFETY: sigaction with zeroed, then filled, structs.
    unsafe {
        let mut ours: libc::sigaction = std::mem::zeroed();
        ours.sa_sigaction = on_signal as *const () as usize;
        ours.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_ONSTACK;
        libc::sigemptyset(&mut ours.sa_mask);
        let mut previous: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(signal, std::ptr::null(), &mut previous) != 0 {
            return Err(InstallError::Os {
                signal,
                source: io::Error::last_os_error(),
            });
        }
        let chain = previous.sa_sigaction;
        let chain = if chain == libc::SIG_DFL || chain == libc::SIG_IGN {
            0
        } else {
            chain
        };
        PREV_SIGINFO[index].store(previous.sa_flags & libc::SA_SIGINFO != 0, Ordering::SeqCst);
        PREV_HANDLER[index].store(chain, Ordering::SeqCst);
        if libc::sigaction(signal, &ours, std::ptr::null_mut()) != 0 {
            PREV_HANDLER[index].store(0, Ordering::SeqCst);
            return Err(InstallError::Os {
                signal,
                source: io::Error::last_os_error(),
            });
        }
        table.insert(signal, Installed { previous, watchers: 1 });
    }
    log::debug!(
        "watching signal {signal} (previous handler {})",
        if PREV_HANDLER[index].load(Ordering::SeqCst) == 0 {
            "none"
        } else {
            "chained"
        }
    );
    Ok(())
}

fn uninstall(signal: i32) {
    let mut table = installed().lock();
    let Some(entry) = table.get_mut(&signal) else { return };
    entry.watchers -= 1;
    if entry.watchers > 0 {
        return;
    }
    let entry = table.remove(&signal).expect("present above");
    // SAFETY: sigaction query and restore with structs we own.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut current);
        if current.sa_sigaction == on_signal as *const () as usize {
            libc::sigaction(signal, &entry.previous, std::ptr::null_mut());
        }
    }
    #[allow(clippy::cast_sign_loss)]
    PREV_HANDLER[signal as usize].store(0, Ordering::SeqCst);
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

/// Watches a set of signals for one consumer (one handler). Dropping it
/// uninstalls what it installed.
pub struct SignalWatch {
    signals: Vec<i32>,
    seen: Mutex<Vec<u64>>,
    triggered: Arc<AtomicBool>,
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
    pub fn new(signals: &[i32]) -> Result<Self, InstallError> {
        let mut done = Vec::with_capacity(signals.len());
        for &s in signals {
            if done.contains(&s) {
                continue;
            }
            if let Err(e) = install(s) {
                for &d in &done {
                    uninstall(d);
                }
                return Err(e);
            }
            done.push(s);
        }
        let seen = done.iter().map(|&s| delivered(s)).collect();
        Ok(SignalWatch {
            signals: done,
            seen: Mutex::new(seen),
            triggered: Arc::new(AtomicBool::new(false)),
        })
    }

    /// The signals watched.
    #[must_use]
    pub fn signals(&self) -> &[i32] {
        &self.signals
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
        for &s in &self.signals {
            uninstall(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Signals are process-wide; these tests use SIGUSR2 and SIGWINCH, which
    // nothing else in the test binary touches, and run their steps in one
    // test to avoid interleaving.
    #[test]
    fn signal_wakes_waiter_from_another_thread_and_uninstall_restores() {
        let watch = Arc::new(SignalWatch::new(&[libc::SIGUSR2]).unwrap());
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

    #[test]
    fn previous_handler_is_chained_and_refcount_keeps_install() {
        // SAFETY: installing a plain handler for SIGWINCH.
        unsafe { libc::signal(libc::SIGWINCH, previous_handler as *const () as usize) };
        let a = SignalWatch::new(&[libc::SIGWINCH]).unwrap();
        let b = SignalWatch::new(&[libc::SIGWINCH, libc::SIGWINCH]).unwrap();
        assert_eq!(b.signals(), &[libc::SIGWINCH]);
        unsafe { libc::raise(libc::SIGWINCH) };
        assert_eq!(a.wait(Duration::from_secs(5)), Some(Wake::Signal(libc::SIGWINCH)));
        assert_eq!(b.wait(Duration::from_secs(5)), Some(Wake::Signal(libc::SIGWINCH)));
        assert_eq!(CHAINED.load(Ordering::SeqCst), 1);
        drop(a);
        unsafe { libc::raise(libc::SIGWINCH) };
        assert_eq!(b.wait(Duration::from_secs(5)), Some(Wake::Signal(libc::SIGWINCH)));
        assert_eq!(CHAINED.load(Ordering::SeqCst), 2);
        drop(b);
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGWINCH, std::ptr::null(), &mut current);
            assert_eq!(current.sa_sigaction, previous_handler as *const () as usize);
        }
    }

    #[test]
    fn uncatchable_signals_are_refused() {
        assert!(matches!(SignalWatch::new(&[libc::SIGKILL]), Err(InstallError::Uncatchable(_))));
        assert!(matches!(SignalWatch::new(&[0]), Err(InstallError::Uncatchable(0))));
        assert!(matches!(SignalWatch::new(&[999]), Err(InstallError::Uncatchable(999))));
    }
}
