//! What every platform's poller says and hears: notices,
//! requests and answers, the [`Poller`] trait, pacing, and the errors of the
//! family. Below every other file of `sources`; imports nothing from them.

use thiserror::Error;

use super::http::{self, UrlError};

/// The `log` target of this module (Python's logger of the same name).
pub(super) const LOG_TARGET: &str = "tf_failure_handling";

/// Shortest poll interval honoured, in seconds: a smaller one would only
/// hammer the metadata server.
pub const MIN_INTERVAL: f64 = 0.01;

/// Seconds a metadata request made to detect the cloud may take, DNS included:
/// each cloud's probe (`_platforms/clouds.py`; a probe that fails in any way means
/// "not that cloud") and TensorFlow's GCE termination watcher
/// ([`gce_terminating`](super::gce_terminating)).
pub const METADATA_TIMEOUT: f64 = 1.0;

/// Seconds between two polls of one metadata endpoint by a `MetadataWatch`
/// (GCE's long polls wait on the server instead).
pub const WATCH_INTERVAL: f64 = 0.5;
/// Seconds one request of a `MetadataWatch` may take.
pub const WATCH_REQUEST_TIMEOUT: f64 = 1.0;

/// A termination notice from a metadata service.
#[derive(Clone, Debug, PartialEq)]
pub struct Notice {
    /// What was announced, for logs ("GCE preempted", "AWS spot
    /// instance-action terminate at …").
    pub description: String,
    /// When the machine goes away, as Unix seconds, if the platform said.
    pub deadline: Option<f64>,
}

/// One HTTP request a poller wants made.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// `GET` or `PUT`.
    pub method: &'static str,
    /// Path and query, relative to the base URL.
    pub path: String,
    /// Extra header fields (`Host` and `Connection` are the client's).
    pub headers: Vec<(&'static str, String)>,
    /// Seconds the whole exchange may take.
    pub timeout: f64,
}

/// What a poller wants done next.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Make this request, then report how it ended
    /// ([`Poller::on_response`] or [`Poller::on_failure`]).
    Request(Request),
    /// Nothing to do before this monotonic time (seconds); ask again then.
    SleepUntil(f64),
}

/// A response as a poller sees it.
#[derive(Clone, Copy, Debug)]
pub struct Response<'a> {
    /// The status code.
    pub status: u16,
    /// Header fields.
    pub headers: &'a [(String, String)],
    /// The (capped, de-chunked) body.
    pub body: &'a [u8],
}

impl Response<'_> {
    /// The first value of header `name` (case-insensitive).
    #[must_use]
    pub fn header(&self, name: &str) -> Option<&str> {
        http::header(self.headers, name)
    }
}

/// A request that did not give a usable answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trouble {
    /// The endpoint ("AWS spot instance-action"): with `malformed`, the kind
    /// of trouble that is warned about once.
    pub what: &'static str,
    /// True for a 200 whose body is not what the endpoint returns; false for
    /// a transport failure or an unexpected status.
    pub malformed: bool,
    /// What happened (status code, error message; never raw body bytes).
    pub detail: String,
}

/// What an answer meant.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A termination was announced. Each poller reports at most one.
    Notice(Notice),
    /// AWS recommends rebalancing: `noticeTime` as Unix seconds. Reported
    /// once; not a termination.
    Rebalance(f64),
    /// No usable answer.
    Trouble(Trouble),
    /// A change of mode worth one log line (IMDSv1).
    Note(&'static str),
}

pub(super) fn trouble(what: &'static str, malformed: bool, detail: impl Into<String>) -> Option<Event> {
    Some(Event::Trouble(Trouble {
        what,
        malformed,
        detail: detail.into(),
    }))
}

/// One endpoint protocol as a state machine. Times are seconds: `now` on a
/// monotonic clock of the caller's choosing, `unix_now` the wall clock.
pub trait Poller {
    /// The next action at `now`. After a [`Action::Request`], the caller
    /// reports how it ended before asking again (if it asks without
    /// reporting, the request is taken as abandoned).
    fn next(&mut self, now: f64) -> Action;
    /// The request ended with this response.
    fn on_response(&mut self, now: f64, unix_now: f64, response: &Response<'_>) -> Option<Event>;
    /// The request ended without a response (`detail` says why, for logs).
    fn on_failure(&mut self, now: f64, detail: &str) -> Option<Event>;
}

/// How a platform's `probe` makes one detection request: `(method, path,
/// headers)` to the status code of the answer, None for no answer.
pub(super) type ProbeStatus<'a> = dyn FnMut(&str, &str, &[(&str, &str)]) -> Option<u16> + 'a;
/// One request `(method, path, headers)` and its whole answer; None when it
/// failed.
pub(super) type Answer<'a> = dyn FnMut(&str, &str, &[(&str, &str)]) -> Option<super::http::Response> + 'a;

/// A poller and the name of the thread that runs it.
pub type NamedPoller = (&'static str, Box<dyn Poller + Send>);

/// Poll pacing, in seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    /// Between polls of one endpoint (at least [`MIN_INTERVAL`]).
    pub interval: f64,
    /// Longest time one ordinary request may take.
    pub request_timeout: f64,
}

impl Timing {
    /// Checks both are positive and finite; clamps `interval` up to
    /// [`MIN_INTERVAL`].
    ///
    /// # Errors
    ///
    /// [`WatchError::BadDuration`] naming the bad argument.
    pub fn new(interval: f64, request_timeout: f64) -> Result<Self, WatchError> {
        for (what, value) in [("interval", interval), ("request_timeout", request_timeout)] {
            if !(value.is_finite() && value > 0.0) {
                return Err(WatchError::BadDuration { what, value });
            }
        }
        Ok(Timing {
            interval: interval.max(MIN_INTERVAL),
            request_timeout,
        })
    }
}

/// The next poll of an endpoint whose request started at `issued` and ended
/// at `now`: one `every` after the start, but not in the past.
pub(super) fn paced(issued: f64, every: f64, now: f64) -> f64 {
    (issued + every).max(now)
}

/// Errors of [`WatchConfig::new`](super::WatchConfig::new),
/// [`MetadataWatch::start`](super::MetadataWatch::start) and
/// [`probe`](super::probe)'s callers.
#[derive(Debug, Error)]
pub enum WatchError {
    /// Not `gce`, `aws` or `azure`.
    #[error("unknown cloud {0:?} (expected \"gce\", \"aws\" or \"azure\")")]
    UnknownCloud(String),
    /// The base URL is not `http://host[:port]`.
    #[error(transparent)]
    BadUrl(#[from] UrlError),
    /// A duration that is not positive and finite.
    #[error("{what} must be a positive finite number of seconds, got {value}")]
    BadDuration {
        /// The argument.
        what: &'static str,
        /// Its value.
        value: f64,
    },
    /// A polling thread could not be started.
    #[error("cannot start a metadata polling thread: {0}")]
    Spawn(std::io::Error),
}
