//! The I/O shell: [`MetadataWatch`] runs each poller of a cloud on its own
//! thread with [`http::Client`](crate::sources::http::Client); [`probe`] makes one cloud's detection
//! requests.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};

use super::clouds::{pollers, Cloud};
use super::gce;
use super::http::{BaseUrl, Client, HttpError};
use super::shared::Answer;
use super::shared::{Action, Event, Notice, Poller, Response, Timing, WatchError, LOG_TARGET};

/// What to watch, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct WatchConfig {
    /// The cloud.
    pub cloud: Cloud,
    /// Where its metadata server listens.
    pub base: BaseUrl,
    /// Pacing.
    pub timing: Timing,
}

impl WatchConfig {
    /// Validates `cloud`, `base_url`, `interval`, `request_timeout`.
    ///
    /// # Errors
    ///
    /// [`WatchError::UnknownCloud`], [`WatchError::BadUrl`] or
    /// [`WatchError::BadDuration`].
    pub fn new(cloud: &str, base_url: &str, interval: f64, request_timeout: f64) -> Result<Self, WatchError> {
        Ok(WatchConfig {
            cloud: cloud.parse()?,
            base: BaseUrl::parse(base_url)?,
            timing: Timing::new(interval, request_timeout)?,
        })
    }
}

/// Request counters of a [`MetadataWatch`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Requests started.
    pub requests: u64,
    /// Requests without a usable answer: transport failure or unexpected
    /// status.
    pub failures: u64,
    /// 200 answers whose body was not what the endpoint returns.
    pub malformed: u64,
    /// Notices reported by pollers (the earliest-ending one is kept).
    pub notices: u64,
}

#[derive(Default)]
struct Found {
    notice: Option<Notice>,
    rebalance: Option<f64>,
}

/// A callback run on the polling thread with the first notice and with each
/// later one whose deadline is earlier (the binding posts it into the
/// handler's [`crate::inbox::Inbox`]). It must not block.
pub type Wake = Box<dyn Fn(&Notice) + Send + Sync>;

struct Shared {
    cloud: Cloud,
    /// Set by `close`: polling threads end, blocked requests are abandoned
    /// within a slice.
    stop: AtomicBool,
    /// Set by `close`: `wait` returns at once.
    closed: AtomicBool,
    /// Guards nothing but the sleepers' wait: `stop` changes under it, so a
    /// sleeper cannot miss the notification.
    sleep: Mutex<()>,
    /// Signalled when `stop` is set; polling threads sleep on it between
    /// polls.
    stopping: Condvar,
    found: Mutex<Found>,
    /// Signalled when a notice is stored and on close; `wait`
    /// blocks on it.
    noticed: Condvar,
    requests: AtomicU64,
    failures: AtomicU64,
    malformed: AtomicU64,
    notices: AtomicU64,
    /// Kinds of trouble already warned about.
    warned: Mutex<HashSet<(&'static str, bool)>>,
    /// Notes already logged.
    noted: Mutex<HashSet<&'static str>>,
    wake: Option<Wake>,
}

impl Shared {
    fn halt(&self) {
        {
            let _guard = self.sleep.lock();
            self.stop.store(true, Ordering::SeqCst);
        }
        self.stopping.notify_all();
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Sleeps until `until` (None: until stopped) or until stopped.
    fn sleep_until(&self, until: Option<Instant>) {
        let mut guard = self.sleep.lock();
        while !self.stopped() {
            match until {
                Some(t) => {
                    if Instant::now() >= t || self.stopping.wait_until(&mut guard, t).timed_out() {
                        return;
                    }
                }
                None => self.stopping.wait(&mut guard),
            }
        }
    }

    fn handle(&self, event: Event) {
        let cloud = self.cloud.name();
        match event {
            Event::Notice(notice) => {
                self.notices.fetch_add(1, Ordering::SeqCst);
                // The first notice, and each later one that ends earlier (a GCE
                // maintenance event, then `preempted`): the handler plans for
                // the earliest deadline. Polling goes on until `close`.
                let news = {
                    let mut found = self.found.lock();
                    let earlier = found.notice.as_ref().map_or(true, |known| {
                        notice.deadline.is_some_and(|d| known.deadline.map_or(true, |k| d < k))
                    });
                    if earlier {
                        found.notice = Some(notice.clone());
                    }
                    earlier
                };
                if news {
                    // The wake-up first: whoever `wait` returns to may look at
                    // the `SignalWatch` next. Logging last: it may wait for
                    // the GIL.
                    if let Some(wake) = &self.wake {
                        wake(&notice);
                    }
                    self.noticed.notify_all();
                    log::info!(target: LOG_TARGET, "Termination notice from the {cloud} metadata service: {}.", notice.description);
                }
            }
            Event::Rebalance(time) => {
                let first = {
                    let mut found = self.found.lock();
                    let first = found.rebalance.is_none();
                    found.rebalance.get_or_insert(time);
                    first
                };
                if first {
                    log::warn!(
                        target: LOG_TARGET,
                        "AWS recommends rebalancing this instance (noticeTime {time:.0} Unix seconds): \
                         an interruption is more likely; no termination is announced yet."
                    );
                }
            }
            Event::Trouble(trouble) => {
                let counter = if trouble.malformed { &self.malformed } else { &self.failures };
                counter.fetch_add(1, Ordering::SeqCst);
                let kind = if trouble.malformed { "unexpected answer" } else { "request failed" };
                log::debug!(target: LOG_TARGET, "{cloud} metadata: {}: {kind}: {}", trouble.what, trouble.detail);
                if self.warned.lock().insert((trouble.what, trouble.malformed)) {
                    log::warn!(
                        target: LOG_TARGET,
                        "{cloud} metadata: {}: {kind}: {}; polling goes on (further such failures are logged at debug level).",
                        trouble.what,
                        trouble.detail
                    );
                }
            }
            Event::Note(note) => {
                if self.noted.lock().insert(note) {
                    log::info!(target: LOG_TARGET, "{cloud} metadata: {note}.");
                }
            }
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// Seconds to a duration; a value too large to represent is a year.
fn duration(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds.max(0.0)).unwrap_or(Duration::from_secs(365 * 86_400))
}

/// One polling thread: runs `poller`'s actions until stopped. `_alive` is
/// dropped when the thread ends, which is how `close` knows.
fn drive(shared: &Shared, poller: &mut dyn Poller, base: BaseUrl, _alive: mpsc::Sender<()>) {
    let epoch = Instant::now();
    let mut client = Client::new(base);
    while !shared.stopped() {
        let now = epoch.elapsed().as_secs_f64();
        match poller.next(now) {
            Action::SleepUntil(t) => {
                // A poller never asks to sleep into the past twice; if it
                // did, this keeps the thread from spinning.
                let t = t.max(now + 0.001);
                shared.sleep_until(Duration::try_from_secs_f64(t).ok().and_then(|d| epoch.checked_add(d)));
            }
            Action::Request(request) => {
                shared.requests.fetch_add(1, Ordering::SeqCst);
                let headers: Vec<(&str, &str)> = request.headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
                let result = client.request(
                    request.method,
                    &request.path,
                    &headers,
                    duration(request.timeout),
                    Some(&shared.stop),
                );
                if shared.stopped() {
                    return;
                }
                let now = epoch.elapsed().as_secs_f64();
                let event = match &result {
                    Ok(r) => poller.on_response(
                        now,
                        unix_now(),
                        &Response {
                            status: r.status,
                            headers: &r.headers,
                            body: &r.body,
                        },
                    ),
                    Err(e) => poller.on_failure(now, &e.to_string()),
                };
                if let Some(event) = event {
                    shared.handle(event);
                }
            }
        }
    }
}

/// Polls a cloud's metadata service on background threads until the first
/// termination notice or [`MetadataWatch::close`]. Network trouble is
/// counted and logged, never returned.
pub struct MetadataWatch {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Disconnected once every polling thread has ended.
    alive: Mutex<Option<mpsc::Receiver<()>>>,
}

/// How long [`MetadataWatch::close`] waits for its threads (the Python
/// binding waits as long, in slices). They notice the stop flag within
/// [`http::SLICE`](crate::sources::http::SLICE); a thread still running after this
/// is left to end on its own.
pub const CLOSE_WAIT: Duration = Duration::from_secs(2);

impl MetadataWatch {
    /// Starts polling at once. `wake` runs on a polling thread when the first
    /// notice arrives, and again for each later one that ends earlier.
    ///
    /// # Errors
    ///
    /// [`WatchError::Spawn`] when a thread cannot be started (the ones
    /// started are stopped).
    pub fn start(config: &WatchConfig, wake: Option<Wake>) -> Result<Self, WatchError> {
        let shared = Arc::new(Shared {
            cloud: config.cloud,
            stop: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            sleep: Mutex::new(()),
            stopping: Condvar::new(),
            found: Mutex::new(Found::default()),
            noticed: Condvar::new(),
            requests: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            notices: AtomicU64::new(0),
            warned: Mutex::new(HashSet::new()),
            noted: Mutex::new(HashSet::new()),
            wake,
        });
        let (alive_tx, alive_rx) = mpsc::channel();
        let mut threads = Vec::new();
        for (name, mut poller) in pollers(config.cloud, config.timing) {
            let s = Arc::clone(&shared);
            let base = config.base.clone();
            let alive = alive_tx.clone();
            let spawned = std::thread::Builder::new()
                .name(name.into())
                .spawn(move || drive(&s, poller.as_mut(), base, alive));
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(e) => {
                    shared.halt();
                    return Err(WatchError::Spawn(e));
                }
            }
        }
        Ok(MetadataWatch {
            shared,
            threads: Mutex::new(threads),
            alive: Mutex::new(Some(alive_rx)),
        })
    }

    /// The notice with the earliest deadline seen, if any (sticky).
    #[must_use]
    pub fn notice(&self) -> Option<Notice> {
        self.shared.found.lock().notice.clone()
    }

    /// AWS's rebalance recommendation time (Unix seconds), once seen.
    #[must_use]
    pub fn rebalance(&self) -> Option<f64> {
        self.shared.found.lock().rebalance
    }

    /// The request counters.
    #[must_use]
    pub fn stats(&self) -> Stats {
        let s = &self.shared;
        Stats {
            requests: s.requests.load(Ordering::SeqCst),
            failures: s.failures.load(Ordering::SeqCst),
            malformed: s.malformed.load(Ordering::SeqCst),
            notices: s.notices.load(Ordering::SeqCst),
        }
    }

    /// Whether [`MetadataWatch::close`] was called.
    #[must_use]
    pub fn closed(&self) -> bool {
        self.shared.closed.load(Ordering::SeqCst)
    }

    /// Blocks up to `timeout` for the first notice; returns it at once if it
    /// was already seen, None on timeout or once closed.
    pub fn wait(&self, timeout: Duration) -> Option<Notice> {
        let deadline = Instant::now().checked_add(timeout);
        let mut found = self.shared.found.lock();
        loop {
            if let Some(notice) = &found.notice {
                return Some(notice.clone());
            }
            if self.closed() {
                return None;
            }
            match deadline {
                Some(d) => {
                    if self.shared.noticed.wait_until(&mut found, d).timed_out() {
                        return found.notice.clone();
                    }
                }
                None => self.shared.noticed.wait(&mut found),
            }
        }
    }

    /// Stops polling without waiting for the threads (they end within a
    /// slice). Idempotent.
    pub fn stop(&self) {
        {
            let _found = self.shared.found.lock();
            self.shared.closed.store(true, Ordering::SeqCst);
        }
        self.shared.noticed.notify_all();
        self.shared.halt();
    }

    /// Waits up to `timeout` for the polling threads to end, and joins them
    /// once they all have: true then (and on every later call), false on
    /// timeout. It does not stop them ([`MetadataWatch::stop`] does).
    ///
    /// The threads may log, and a log record may need the GIL (pyo3-log):
    /// a caller that holds the GIL must release it around this wait, and
    /// wait in short slices if it wants to run signal handlers meanwhile.
    pub fn join(&self, timeout: Duration) -> bool {
        let mut alive = self.alive.lock();
        let Some(receiver) = alive.as_ref() else { return true };
        match receiver.recv_timeout(timeout) {
            // Nothing is ever sent: disconnected means every sender, one per
            // thread, was dropped as its `drive` returned.
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                *alive = None;
                drop(alive);
                for t in std::mem::take(&mut *self.threads.lock()) {
                    let _ = t.join();
                }
                true
            }
            _ => false,
        }
    }

    /// Stops polling and joins the threads: returns within about
    /// [`http::SLICE`](crate::sources::http::SLICE) even while a request is blocked
    /// (at most [`CLOSE_WAIT`]; threads still running then are left to end
    /// on their own). Idempotent. Blocks without looking at signals: the
    /// Python binding stops and [`MetadataWatch::join`]s in slices instead.
    pub fn close(&self) {
        self.stop();
        if !self.join(CLOSE_WAIT) {
            self.abandon();
        }
    }

    /// Gives up waiting for threads that did not stop within
    /// [`CLOSE_WAIT`]: they are left to end on their own, and later
    /// [`MetadataWatch::join`]s return at once.
    pub fn abandon(&self) {
        if self.alive.lock().take().is_some() {
            self.threads.lock().clear();
            log::warn!(target: LOG_TARGET, "metadata polling threads did not stop within {CLOSE_WAIT:?}; leaving them");
        }
    }
}

impl Drop for MetadataWatch {
    /// Stops polling; the threads end on their own within a slice (dropping
    /// never blocks, so it is safe where the GIL is held).
    fn drop(&mut self) {
        self.stop();
    }
}

/// One detection request to `base`, all within `timeout`: is this `cloud`'s
/// metadata server there?
///
/// * GCE: `GET /computeMetadata/v1/instance/hostname` with
///   `Metadata-Flavor: Google` answers 200;
/// * AWS: `PUT /latest/api/token` answers 200, or answers 403/404/405 and
///   then `GET /latest/meta-data/` answers 200 (IMDSv1);
/// * Azure: `GET /metadata/instance?api-version=2021-02-01` with
///   `Metadata: true` answers 200.
///
/// Anything else, including any failure, is false. `stop` abandons it
/// within [`http::SLICE`](crate::sources::http::SLICE); once it is set, nothing more
/// is logged.
#[must_use]
pub fn probe(cloud: Cloud, base: &BaseUrl, timeout: Duration, stop: Option<&AtomicBool>) -> bool {
    let what = format!("{} metadata probe", cloud.name());
    ask(base, timeout, stop, &what, |answer| {
        (cloud.parts().probe)(&mut |method, path, headers| answer(method, path, headers).map(|r| r.status))
    })
}

/// TensorFlow's GCE termination watcher (`termination_watcher_function_gce`),
/// one request to `base` within `timeout`: does GCE's
/// `instance/maintenance-event` answer `TERMINATE_ON_HOST_MAINTENANCE`? Any
/// failure is no; `stop` as for [`probe`].
#[must_use]
pub fn gce_terminating(base: &BaseUrl, timeout: Duration, stop: Option<&AtomicBool>) -> bool {
    ask(base, timeout, stop, "GCE maintenance-event", |answer| gce::terminating(answer))
}

/// Runs `requests` against `base`, all within `timeout`; a failed request is
/// None to them, logged (as `what`) unless `stop` abandoned it.
fn ask(base: &BaseUrl, timeout: Duration, stop: Option<&AtomicBool>, what: &str, requests: impl FnOnce(&mut Answer<'_>) -> bool) -> bool {
    let start = Instant::now();
    let deadline = start.checked_add(timeout).unwrap_or(start + Duration::from_secs(86_400));
    let mut client = Client::new(base.clone());
    let mut answer = |method: &str, path: &str, headers: &[(&str, &str)]| {
        let left = deadline.saturating_duration_since(Instant::now());
        match client.request(method, path, headers, left, stop) {
            Ok(r) => Some(r),
            // Abandoned by the caller, who is gone or going: nothing to say,
            // and no log record that might wait for the GIL.
            Err(HttpError::Stopped) => None,
            Err(e) => {
                log::debug!(target: LOG_TARGET, "{what} {path}: {e}");
                None
            }
        }
    };
    requests(&mut answer)
}

/// How long a stopped [`Probing`] is waited for: the probe notices its stop
/// flag within [`http::SLICE`](crate::sources::http::SLICE).
pub const PROBE_STOP_WAIT: Duration = Duration::from_secs(1);

/// One [`probe`] (or, `terminating`, one [`gce_terminating`] ask) on a thread of
/// its own, for a caller that waits for the answer in slices (the binding runs
/// signal handlers between them) and may give up: [`Probing::stop`].
pub struct Probing {
    stop: Arc<AtomicBool>,
    answer: mpsc::Receiver<bool>,
    thread: Option<JoinHandle<()>>,
}

impl Probing {
    /// Starts the probe of `cloud` at `base`, bounded by `timeout`.
    ///
    /// # Errors
    ///
    /// [`WatchError::Spawn`] when its thread cannot start.
    pub fn start(cloud: Cloud, base: BaseUrl, timeout: Duration, terminating: bool) -> Result<Self, WatchError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, answer) = mpsc::channel();
        let thread_stop = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tfh-probe".into())
            .spawn(move || {
                let stop = Some(&*thread_stop);
                let _ = tx.send(if terminating {
                    gce_terminating(&base, timeout, stop)
                } else {
                    probe(cloud, &base, timeout, stop)
                });
            })
            .map_err(WatchError::Spawn)?;
        Ok(Probing {
            stop,
            answer,
            thread: Some(thread),
        })
    }

    /// The answer, waiting up to `slice` for it: `Some(found)` once it came
    /// (false when the probe's thread ended without one: it panicked), None
    /// while the probe goes on. The thread is joined once it answered.
    pub fn answer(&mut self, slice: Duration) -> Option<bool> {
        let found = match self.answer.recv_timeout(slice) {
            Ok(found) => found,
            Err(mpsc::RecvTimeoutError::Timeout) => return None,
            Err(mpsc::RecvTimeoutError::Disconnected) => false,
        };
        // It has sent its answer (or died): joining cannot block on it.
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        Some(found)
    }

    /// Stops the probe and waits up to [`PROBE_STOP_WAIT`] for its thread to
    /// end (a stopped probe logs nothing, but it may be in the middle of a log
    /// record); a thread still running then is left to end on its own.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if self.thread.is_some() {
            let _ = self.answer(PROBE_STOP_WAIT);
        }
    }
}
