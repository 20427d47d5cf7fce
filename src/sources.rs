//! Metadata-service termination sources: GCE, AWS and Azure, polled.
//!
//! TensorFlow watches one platform's metadata server (GCE's
//! `maintenance-event`, one Python thread, no timeout on its request). Here
//! each cloud's own announcement is watched, with every request bounded:
//!
//! | cloud | request | notice when | deadline |
//! | --- | --- | --- | --- |
//! | GCE | `GET /computeMetadata/v1/instance/maintenance-event` | body `TERMINATE_ON_HOST_MAINTENANCE` | none announced |
//! | GCE | `GET /computeMetadata/v1/instance/preempted` | body `TRUE` | seen + [`GCE_PREEMPTED_LEAD`] |
//! | AWS | `GET /latest/meta-data/spot/instance-action` | 200 with `{"action": "terminate"\|"stop"\|"hibernate"}` | its `time` (RFC 3339) |
//! | Azure | `GET /metadata/scheduledevents?api-version=2020-07-01` | a `Preempt`/`Terminate` event naming this VM | its `NotBefore` (RFC 1123); empty = now |
//!
//! AWS also announces a *rebalance recommendation*
//! (`/latest/meta-data/events/recommendations/rebalance`): an elevated risk
//! of interruption, not a termination. It is reported separately
//! ([`Event::Rebalance`]) and never wakes the handler.
//!
//! # Sans-IO pollers, one thin I/O shell
//!
//! Each endpoint's protocol is a [`Poller`]: a state machine that is asked
//! for its next [`Action`] at monotonic time `now` (seconds), and told how
//! the request it asked for ended, with the wall-clock `unix_now` for
//! deadlines it computes. It never reads a clock or touches a socket, so
//! every transition is a table test (`sources/tests.rs`):
//!
//! * [`GcePoller`] (one per endpoint): a plain `GET`, then, as long as the
//!   server sends an `ETag`, long polls
//!   (`?wait_for_change=true&last_etag=…&timeout_sec=`[`GCE_LONG_POLL_SECONDS`])
//!   that return the moment the value changes. A failed long poll (error,
//!   non-200, no `ETag`) falls back to plain `GET`s every interval, and after
//!   [`GCE_LONG_POLL_GIVE_UP`] failures in a row long polling is not tried
//!   again. A long poll that returns at once with the same `ETag` (a server
//!   that ignores `wait_for_change`) is paced at the interval, not repeated
//!   in a busy loop.
//! * [`AwsPoller`]: an IMDSv2 session token (`PUT /latest/api/token`, TTL
//!   [`AWS_TOKEN_TTL`] s), refreshed at 90 % of its lifetime and dropped on a
//!   401; a 403/404/405 on the `PUT` means IMDSv1 (no token); a token that
//!   cannot be had (timeout: the hop limit in a container; 5xx) is retried
//!   every [`AWS_TOKEN_RETRY`] s while polling goes on without one. Between
//!   token calls, the spot `instance-action` every interval and the rebalance
//!   recommendation every min(interval, [`AWS_REBALANCE_MAX_INTERVAL`]),
//!   whichever is due first.
//! * [`AzurePoller`]: this VM's name once
//!   (`/metadata/instance/compute/name`), then scheduled events every
//!   interval. Only events naming this VM count; when the name cannot be
//!   learned, events for any resource do (the [`Event::Trouble`] reporting
//!   that says so; the name is asked for once).
//!
//! A poller has at most one request outstanding. After an answer its next
//! poll of the same endpoint is due one interval after the request *started*
//! (or at once, if the request took longer): a server that times out is
//! retried without an extra pause, one that answers is polled at the
//! interval.
//!
//! # Hostile input
//!
//! A metadata server, or whatever answers on its address, may send anything.
//! Only status 200 with a body that parses completely as the expected
//! announcement is a notice: JSON is parsed by `serde_json` (with its
//! recursion limit) from bodies the HTTP client already capped at
//! [`http::MAX_BODY`]; strings that end up in a log line or a request (an
//! AWS token, a GCE `ETag`, an Azure VM name) are validated or
//! percent-encoded first. Anything else is an [`Event::Trouble`], counted
//! and logged, and polling goes on at the interval.
//!
//! # The I/O shell
//!
//! [`MetadataWatch`] runs one thread per poller (two for GCE, so each
//! endpoint sees a change within one long poll or one interval), executes
//! the actions with [`http::Client`], and keeps the first notice, sticky.
//! The first notice also calls the `wake` callback (the Python binding
//! triggers a [`crate::termination::SignalWatch`] with it) and ends polling:
//! nothing a later answer says can change what the handler does. Every
//! request is bounded by its timeout and, through the stop flag, by
//! [`MetadataWatch::close`], which returns within about
//! [`http::SLICE`] plus one slice even while a request is blocked.
//!
//! Logging (target `tf_failure_handling`, forwarded to Python's logger of
//! that name): info for a notice and for each [`Event::Note`] (once),
//! a warning the first time each kind of trouble occurs, debug for every
//! failure.

use std::collections::HashSet;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use serde_json::Value;
use thiserror::Error;

use crate::http::{self, BaseUrl, Client, UrlError};

/// The `log` target of this module (Python's logger of the same name).
const LOG_TARGET: &str = "tf_failure_handling";

/// GCE's metadata request header.
pub const GCE_FLAVOR: (&str, &str) = ("Metadata-Flavor", "Google");
/// Seconds a GCE long poll may wait on the server (`timeout_sec`). Short, so
/// a server that ignores it costs little, and a lost connection is noticed
/// soon.
pub const GCE_LONG_POLL_SECONDS: u32 = 2;
/// Failed long polls in a row after which a GCE poller only polls plainly.
pub const GCE_LONG_POLL_GIVE_UP: u32 = 3;
/// Lead time of a GCE Spot/preemptible VM: 30 s from the preemption notice
/// to the hard stop.
pub const GCE_PREEMPTED_LEAD: f64 = 30.0;
/// IMDSv2 session token lifetime asked for, in seconds (the maximum, 6 h).
pub const AWS_TOKEN_TTL: u32 = 21_600;
/// Seconds between attempts to get an IMDSv2 token once one failed.
pub const AWS_TOKEN_RETRY: f64 = 30.0;
/// Longest pause between rebalance-recommendation polls, in seconds.
pub const AWS_REBALANCE_MAX_INTERVAL: f64 = 1.0;
/// Azure's instance-metadata request header.
pub const AZURE_METADATA: (&str, &str) = ("Metadata", "true");
/// Shortest poll interval honoured, in seconds: a smaller one would only
/// hammer the metadata server.
pub const MIN_INTERVAL: f64 = 0.01;

const GCE_MAINTENANCE_PATH: &str = "/computeMetadata/v1/instance/maintenance-event";
const GCE_PREEMPTED_PATH: &str = "/computeMetadata/v1/instance/preempted";
const GCE_PROBE_PATH: &str = "/computeMetadata/v1/instance/hostname";
const AWS_TOKEN_PATH: &str = "/latest/api/token";
const AWS_TOKEN_TTL_HEADER: &str = "X-aws-ec2-metadata-token-ttl-seconds";
const AWS_TOKEN_HEADER: &str = "X-aws-ec2-metadata-token";
const AWS_ACTION_PATH: &str = "/latest/meta-data/spot/instance-action";
const AWS_REBALANCE_PATH: &str = "/latest/meta-data/events/recommendations/rebalance";
const AWS_PROBE_V1_PATH: &str = "/latest/meta-data/";
const AZURE_EVENTS_PATH: &str = "/metadata/scheduledevents?api-version=2020-07-01";
const AZURE_NAME_PATH: &str = "/metadata/instance/compute/name?api-version=2021-02-01&format=text";
const AZURE_NAME_WHAT: &str = "Azure VM name";
const AZURE_PROBE_PATH: &str = "/metadata/instance?api-version=2021-02-01";

/// The note [`AwsPoller`] emits when IMDSv2 is not there (logged once).
pub const NOTE_IMDSV1: &str = "the IMDSv2 token request was refused (403/404/405); polling with IMDSv1, without a token";

// ---------------------------------------------------------------------------
// Dates
// ---------------------------------------------------------------------------

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix seconds of a UTC date and time, or None when a field is out of
/// range (second 60, a leap second, is accepted).
fn unix_seconds(year: i64, month: u32, day: u32, hour: u32, minute: u32, second: u32) -> Option<i64> {
    if !(1..=12).contains(&month) || day == 0 || day > days_in_month(year, month) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + i64::from(hour * 3600 + minute * 60 + second))
}

/// The ASCII digits `bytes[range]` as a number; None if any is not a digit
/// or the range is out of bounds.
fn digits(bytes: &[u8], range: std::ops::Range<usize>) -> Option<u32> {
    let part = bytes.get(range)?;
    if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(part.iter().fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0')))
}

#[allow(clippy::cast_precision_loss)] // Unix seconds of years 0–9999 fit an f64 exactly
fn as_f64(seconds: i64) -> f64 {
    seconds as f64
}

/// Parses an RFC 3339 date-time (`2017-09-18T08:22:00Z`,
/// `2017-09-18T08:22:00.123+00:00`, any `±hh:mm` offset) to Unix seconds.
/// None for anything else; never panics.
#[must_use]
pub fn parse_rfc3339(text: &str) -> Option<f64> {
    let b = text.as_bytes();
    let sep = |i: usize, c: u8| b.get(i) == Some(&c);
    if !(sep(4, b'-') && sep(7, b'-') && (sep(10, b'T') || sep(10, b't')) && sep(13, b':') && sep(16, b':')) {
        return None;
    }
    let year = digits(b, 0..4)?;
    let mut seconds = unix_seconds(
        i64::from(year),
        digits(b, 5..7)?,
        digits(b, 8..10)?,
        digits(b, 11..13)?,
        digits(b, 14..16)?,
        digits(b, 17..19)?,
    )?;
    let mut i = 19;
    let mut fraction = 0.0;
    if sep(i, b'.') {
        i += 1;
        let start = i;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == start {
            return None;
        }
        // Nanoseconds are plenty; further digits are validated, not used.
        let used = &b[start..(start + 9).min(i)];
        let value = used.iter().fold(0u32, |acc, d| acc * 10 + u32::from(d - b'0'));
        let scale = used.iter().fold(1u32, |acc, _| acc * 10);
        fraction = f64::from(value) / f64::from(scale);
    }
    match &b[i..] {
        b"Z" | b"z" => {}
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let hours = digits(b, i + 1..i + 3)?;
            let minutes = digits(b, i + 4..i + 6)?;
            if hours > 23 || minutes > 59 {
                return None;
            }
            let offset = i64::from(hours * 3600 + minutes * 60);
            // Local time = UTC + offset.
            seconds -= if *sign == b'+' { offset } else { -offset };
        }
        _ => return None,
    }
    Some(as_f64(seconds) + fraction)
}

const WEEKDAYS: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

/// Parses an RFC 1123 date (`Mon, 19 Sep 2016 18:29:47 GMT`; zone `GMT`,
/// `UTC` or `+0000`) to Unix seconds. The weekday must be a weekday name but
/// is not checked against the date. None for anything else; never panics.
#[must_use]
pub fn parse_rfc1123(text: &str) -> Option<f64> {
    let (weekday, rest) = text.split_once(", ")?;
    if !WEEKDAYS.contains(&weekday) {
        return None;
    }
    let mut parts = rest.split(' ');
    let (day, month, year, time, zone) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !matches!(zone, "GMT" | "UTC" | "+0000") || !(1..=2).contains(&day.len()) || year.len() != 4 {
        return None;
    }
    let month = MONTHS.iter().position(|m| *m == month)?;
    let t = time.as_bytes();
    if t.len() != 8 || t[2] != b':' || t[5] != b':' {
        return None;
    }
    let seconds = unix_seconds(
        i64::from(digits(year.as_bytes(), 0..4)?),
        u32::try_from(month).ok()? + 1,
        digits(day.as_bytes(), 0..day.len())?,
        digits(t, 0..2)?,
        digits(t, 3..5)?,
        digits(t, 6..8)?,
    )?;
    Some(as_f64(seconds))
}

// ---------------------------------------------------------------------------
// What pollers say and hear
// ---------------------------------------------------------------------------

/// A cloud whose metadata service announces terminations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cloud {
    /// Google Compute Engine (and Cloud TPU VMs).
    Gce,
    /// Amazon EC2 (Spot).
    Aws,
    /// Azure virtual machines (Spot, scheduled events).
    Azure,
}

impl Cloud {
    /// `"gce"`, `"aws"` or `"azure"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Cloud::Gce => "gce",
            Cloud::Aws => "aws",
            Cloud::Azure => "azure",
        }
    }
}

impl FromStr for Cloud {
    type Err = WatchError;

    fn from_str(s: &str) -> Result<Self, WatchError> {
        match s {
            "gce" => Ok(Cloud::Gce),
            "aws" => Ok(Cloud::Aws),
            "azure" => Ok(Cloud::Azure),
            _ => Err(WatchError::UnknownCloud(s.chars().take(64).collect())),
        }
    }
}

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

fn trouble(what: &'static str, malformed: bool, detail: impl Into<String>) -> Option<Event> {
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
fn paced(issued: f64, every: f64, now: f64) -> f64 {
    (issued + every).max(now)
}

// ---------------------------------------------------------------------------
// GCE
// ---------------------------------------------------------------------------

/// The two GCE endpoints that announce a termination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GceEndpoint {
    /// `instance/maintenance-event`: `TERMINATE_ON_HOST_MAINTENANCE` about
    /// 60 s (1 h with GPUs) before a host maintenance that stops the VM.
    MaintenanceEvent,
    /// `instance/preempted`: `TRUE` once a Spot/preemptible VM is being
    /// preempted (30 s).
    Preempted,
}

impl GceEndpoint {
    fn path(self) -> &'static str {
        match self {
            GceEndpoint::MaintenanceEvent => GCE_MAINTENANCE_PATH,
            GceEndpoint::Preempted => GCE_PREEMPTED_PATH,
        }
    }

    fn what(self) -> &'static str {
        match self {
            GceEndpoint::MaintenanceEvent => "GCE maintenance-event",
            GceEndpoint::Preempted => "GCE preempted",
        }
    }

    fn long_poll_what(self) -> &'static str {
        match self {
            GceEndpoint::MaintenanceEvent => "GCE maintenance-event long poll",
            GceEndpoint::Preempted => "GCE preempted long poll",
        }
    }
}

#[derive(Clone, Debug)]
enum GceSent {
    Plain { issued: f64 },
    LongPoll { issued: f64, etag: String },
}

/// Watches one GCE endpoint: plain `GET`, then `ETag` long polls.
#[derive(Clone, Debug)]
pub struct GcePoller {
    endpoint: GceEndpoint,
    timing: Timing,
    /// The `ETag` to long-poll with; None: poll plainly.
    etag: Option<String>,
    /// Failed long polls in a row.
    long_poll_failures: u32,
    next_at: f64,
    sent: Option<GceSent>,
    noticed: bool,
}

impl GcePoller {
    /// A poller whose first request is due at once.
    #[must_use]
    pub fn new(endpoint: GceEndpoint, timing: Timing) -> Self {
        GcePoller {
            endpoint,
            timing,
            etag: None,
            long_poll_failures: 0,
            next_at: f64::NEG_INFINITY,
            sent: None,
            noticed: false,
        }
    }

    fn long_poll_failed(&mut self) {
        self.etag = None;
        self.long_poll_failures = self.long_poll_failures.saturating_add(1);
    }

    /// What a 200's body says.
    fn judge(&mut self, body: &[u8], unix_now: f64) -> Option<Event> {
        let Ok(text) = std::str::from_utf8(body) else {
            return trouble(self.endpoint.what(), true, "the value is not UTF-8");
        };
        let value = text.trim();
        let (description, deadline) = match (self.endpoint, value) {
            (GceEndpoint::MaintenanceEvent, "TERMINATE_ON_HOST_MAINTENANCE") => {
                ("GCE maintenance-event TERMINATE_ON_HOST_MAINTENANCE", None)
            }
            (GceEndpoint::Preempted, "TRUE") => ("GCE preempted", Some(unix_now + GCE_PREEMPTED_LEAD)),
            (GceEndpoint::Preempted, "FALSE") => return None,
            // NONE, MIGRATE_ON_HOST_MAINTENANCE, or a value added later.
            (GceEndpoint::MaintenanceEvent, v)
                if !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') =>
            {
                return None
            }
            _ => return trouble(self.endpoint.what(), true, "unexpected value"),
        };
        if self.noticed {
            return None;
        }
        self.noticed = true;
        Some(Event::Notice(Notice {
            description: description.to_owned(),
            deadline,
        }))
    }
}

/// An `ETag` fit for a query string: at most 256 visible ASCII bytes,
/// percent-encoded except for unreserved characters.
fn encode_etag(etag: &str) -> Option<String> {
    if etag.is_empty() || etag.len() > 256 || !etag.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    let mut out = String::with_capacity(etag.len());
    for b in etag.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    Some(out)
}

impl Poller for GcePoller {
    fn next(&mut self, now: f64) -> Action {
        if now < self.next_at {
            return Action::SleepUntil(self.next_at);
        }
        let headers = vec![(GCE_FLAVOR.0, GCE_FLAVOR.1.to_owned())];
        let path = self.endpoint.path();
        let (sent, request) = match &self.etag {
            Some(etag) => (
                GceSent::LongPoll {
                    issued: now,
                    etag: etag.clone(),
                },
                Request {
                    method: "GET",
                    path: format!("{path}?wait_for_change=true&last_etag={etag}&timeout_sec={GCE_LONG_POLL_SECONDS}"),
                    headers,
                    timeout: f64::from(GCE_LONG_POLL_SECONDS) + self.timing.request_timeout,
                },
            ),
            None => (
                GceSent::Plain { issued: now },
                Request {
                    method: "GET",
                    path: path.to_owned(),
                    headers,
                    timeout: self.timing.request_timeout,
                },
            ),
        };
        self.sent = Some(sent);
        Action::Request(request)
    }

    fn on_response(&mut self, now: f64, unix_now: f64, response: &Response<'_>) -> Option<Event> {
        let sent = self.sent.take()?;
        let (issued, long_polled) = match sent {
            GceSent::Plain { issued } => (issued, None),
            GceSent::LongPoll { issued, etag } => (issued, Some(etag)),
        };
        let later = paced(issued, self.timing.interval, now);
        if response.status != 200 {
            if long_polled.is_some() {
                self.long_poll_failed();
            }
            self.next_at = later;
            let what = if long_polled.is_some() {
                self.endpoint.long_poll_what()
            } else {
                self.endpoint.what()
            };
            return trouble(what, false, format!("status {}", response.status));
        }
        let event = self.judge(response.body, unix_now);
        let etag = response.header("etag").and_then(encode_etag);
        match (long_polled, etag) {
            (Some(_), None) => {
                self.long_poll_failed();
                self.next_at = later;
                if event.is_none() {
                    return trouble(self.endpoint.long_poll_what(), false, "the answer has no ETag");
                }
            }
            (None, None) => self.next_at = later,
            (Some(old), Some(new)) => {
                self.long_poll_failures = 0;
                // Same ETag: the server waited out timeout_sec (then `later`
                // is now) or ignores wait_for_change (then pace it).
                self.next_at = if new == old { later } else { now };
                self.etag = Some(new);
            }
            (None, Some(new)) => {
                if self.long_poll_failures < GCE_LONG_POLL_GIVE_UP {
                    self.etag = Some(new);
                    self.next_at = now;
                } else {
                    self.next_at = later;
                }
            }
        }
        event
    }

    fn on_failure(&mut self, now: f64, detail: &str) -> Option<Event> {
        let sent = self.sent.take()?;
        let (issued, what) = match sent {
            GceSent::Plain { issued } => (issued, self.endpoint.what()),
            GceSent::LongPoll { issued, .. } => {
                self.long_poll_failed();
                (issued, self.endpoint.long_poll_what())
            }
        };
        self.next_at = paced(issued, self.timing.interval, now);
        trouble(what, false, detail)
    }
}

// ---------------------------------------------------------------------------
// AWS
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum Token {
    /// Fetch one before the next poll.
    Need,
    /// Use this one; fetch a new one from `refresh_at` on.
    Have { value: String, refresh_at: f64, expires_at: f64 },
    /// Poll without a token; try to get one again from `retry_at` on (never,
    /// after the server said IMDSv2 is not there).
    Without { retry_at: Option<f64> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AwsCall {
    Token,
    Action,
    Rebalance,
}

/// Watches an EC2 instance: IMDSv2 token, spot `instance-action`, rebalance
/// recommendation.
#[derive(Clone, Debug)]
pub struct AwsPoller {
    timing: Timing,
    token: Token,
    action_at: f64,
    rebalance_at: f64,
    rebalance_seen: bool,
    noticed: bool,
    sent: Option<(AwsCall, f64)>,
}

/// An IMDSv2 token fit for a header: 1–4096 visible ASCII bytes (after
/// trimming white space).
fn valid_token(body: &[u8]) -> Option<String> {
    let token = std::str::from_utf8(body).ok()?.trim();
    (!token.is_empty() && token.len() <= 4096 && token.bytes().all(|b| b.is_ascii_graphic())).then(|| token.to_owned())
}

/// Parses a spot `instance-action` document into a notice.
///
/// # Errors
///
/// Why it is not an announcement: not JSON, not an object, no `action`
/// string, or an action other than `terminate`, `stop`, `hibernate`.
pub fn parse_spot_action(body: &[u8]) -> Result<Notice, &'static str> {
    let value: Value = serde_json::from_slice(body).map_err(|_| "not JSON")?;
    let object = value.as_object().ok_or("not a JSON object")?;
    let action = object.get("action").and_then(Value::as_str).ok_or("no action")?;
    let action = ["terminate", "stop", "hibernate"]
        .into_iter()
        .find(|a| *a == action)
        .ok_or("unknown action")?;
    let time = object
        .get("time")
        .and_then(Value::as_str)
        .and_then(|t| parse_rfc3339(t).map(|s| (t, s)));
    Ok(match time {
        Some((text, seconds)) => Notice {
            description: format!("AWS spot instance-action {action} at {text}"),
            deadline: Some(seconds),
        },
        None => Notice {
            description: format!("AWS spot instance-action {action} (no valid time)"),
            deadline: None,
        },
    })
}

/// Parses a rebalance recommendation (`{"noticeTime": "…"}`) to Unix
/// seconds.
///
/// # Errors
///
/// Why it is not one: not JSON, not an object, no RFC 3339 `noticeTime`.
pub fn parse_rebalance(body: &[u8]) -> Result<f64, &'static str> {
    let value: Value = serde_json::from_slice(body).map_err(|_| "not JSON")?;
    let time = value
        .as_object()
        .ok_or("not a JSON object")?
        .get("noticeTime")
        .and_then(Value::as_str);
    time.and_then(parse_rfc3339).ok_or("no valid noticeTime")
}

impl AwsPoller {
    /// A poller whose first request (the token) is due at once.
    #[must_use]
    pub fn new(timing: Timing) -> Self {
        AwsPoller {
            timing,
            token: Token::Need,
            action_at: f64::NEG_INFINITY,
            rebalance_at: f64::NEG_INFINITY,
            rebalance_seen: false,
            noticed: false,
            sent: None,
        }
    }

    fn rebalance_interval(&self) -> f64 {
        self.timing.interval.min(AWS_REBALANCE_MAX_INTERVAL)
    }

    /// No token to be had: keep a still-valid one for a while, else poll
    /// without; try again after [`AWS_TOKEN_RETRY`].
    fn token_failed(&mut self, now: f64) {
        let retry_at = now + AWS_TOKEN_RETRY;
        self.token = match std::mem::replace(&mut self.token, Token::Need) {
            Token::Have { value, expires_at, .. } if now < expires_at => Token::Have {
                value,
                refresh_at: retry_at.min(expires_at),
                expires_at,
            },
            _ => Token::Without { retry_at: Some(retry_at) },
        };
    }

    fn on_token(&mut self, now: f64, response: &Response<'_>) -> Option<Event> {
        const WHAT: &str = "AWS IMDSv2 token";
        match response.status {
            200 => {
                let Some(value) = valid_token(response.body) else {
                    self.token_failed(now);
                    return trouble(WHAT, true, "not a token");
                };
                let ttl = response
                    .header(AWS_TOKEN_TTL_HEADER)
                    .and_then(|t| t.parse::<u32>().ok())
                    .filter(|&t| t > 0)
                    .map_or(AWS_TOKEN_TTL, |t| t.min(AWS_TOKEN_TTL));
                let ttl = f64::from(ttl);
                self.token = Token::Have {
                    value,
                    refresh_at: now + 0.9 * ttl,
                    expires_at: now + ttl,
                };
                None
            }
            // 403, 404, 405: IMDSv2 is switched off or not there.
            403..=405 => {
                self.token = Token::Without { retry_at: None };
                Some(Event::Note(NOTE_IMDSV1))
            }
            status => {
                self.token_failed(now);
                trouble(WHAT, false, format!("status {status}"))
            }
        }
    }
}

impl Poller for AwsPoller {
    fn next(&mut self, now: f64) -> Action {
        let need_token = match &self.token {
            Token::Need => true,
            Token::Have { refresh_at, .. } => now >= *refresh_at,
            Token::Without { retry_at } => retry_at.is_some_and(|t| now >= t),
        };
        if need_token {
            self.sent = Some((AwsCall::Token, now));
            return Action::Request(Request {
                method: "PUT",
                path: AWS_TOKEN_PATH.to_owned(),
                headers: vec![(AWS_TOKEN_TTL_HEADER, AWS_TOKEN_TTL.to_string())],
                timeout: self.timing.request_timeout,
            });
        }
        let (call, due) = if !self.rebalance_seen && self.rebalance_at < self.action_at {
            (AwsCall::Rebalance, self.rebalance_at)
        } else {
            (AwsCall::Action, self.action_at)
        };
        if now < due {
            return Action::SleepUntil(due);
        }
        self.sent = Some((call, now));
        let headers = match &self.token {
            Token::Have { value, .. } => vec![(AWS_TOKEN_HEADER, value.clone())],
            _ => Vec::new(),
        };
        let path = if call == AwsCall::Action {
            AWS_ACTION_PATH
        } else {
            AWS_REBALANCE_PATH
        };
        Action::Request(Request {
            method: "GET",
            path: path.to_owned(),
            headers,
            timeout: self.timing.request_timeout,
        })
    }

    fn on_response(&mut self, now: f64, _unix_now: f64, response: &Response<'_>) -> Option<Event> {
        let (call, issued) = self.sent.take()?;
        let (what, every) = match call {
            AwsCall::Token => return self.on_token(now, response),
            AwsCall::Action => ("AWS spot instance-action", self.timing.interval),
            AwsCall::Rebalance => ("AWS rebalance recommendation", self.rebalance_interval()),
        };
        let later = paced(issued, every, now);
        if call == AwsCall::Action {
            self.action_at = later;
        } else {
            self.rebalance_at = later;
        }
        match (response.status, call) {
            (401, _) => {
                // The token expired or was never there: get a new one.
                self.token = Token::Need;
                trouble(what, false, "status 401 (session token rejected; fetching a new one)")
            }
            (404, _) => None,
            (200, AwsCall::Action) => match parse_spot_action(response.body) {
                Ok(notice) if !self.noticed => {
                    self.noticed = true;
                    Some(Event::Notice(notice))
                }
                Ok(_) => None,
                Err(why) => trouble(what, true, why),
            },
            (200, _) => match parse_rebalance(response.body) {
                Ok(time) => {
                    self.rebalance_seen = true;
                    Some(Event::Rebalance(time))
                }
                Err(why) => trouble(what, true, why),
            },
            (status, _) => trouble(what, false, format!("status {status}")),
        }
    }

    fn on_failure(&mut self, now: f64, detail: &str) -> Option<Event> {
        let (call, issued) = self.sent.take()?;
        let what = match call {
            AwsCall::Token => {
                self.token_failed(now);
                "AWS IMDSv2 token"
            }
            AwsCall::Action => {
                self.action_at = paced(issued, self.timing.interval, now);
                "AWS spot instance-action"
            }
            AwsCall::Rebalance => {
                self.rebalance_at = paced(issued, self.rebalance_interval(), now);
                "AWS rebalance recommendation"
            }
        };
        trouble(what, false, detail)
    }
}

// ---------------------------------------------------------------------------
// Azure
// ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq, Eq)]
enum VmName {
    /// Not asked yet.
    Ask,
    /// Only events naming this resource count.
    Known(String),
    /// The name could not be learned: any resource counts.
    Any,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AzureCall {
    Name,
    Events,
}

/// Watches an Azure VM's scheduled events.
#[derive(Clone, Debug)]
pub struct AzurePoller {
    timing: Timing,
    name: VmName,
    next_at: f64,
    sent: Option<(AzureCall, f64)>,
    noticed: bool,
}

/// A VM name: 1–256 bytes of UTF-8 without control characters (after
/// trimming).
fn valid_vm_name(body: &[u8]) -> Option<String> {
    let name = std::str::from_utf8(body).ok()?.trim();
    (!name.is_empty() && name.len() <= 256 && !name.chars().any(char::is_control)).then(|| name.to_owned())
}

/// Parses a scheduled-events document: the `Preempt` or `Terminate` event
/// for `vm_name` (any non-empty resource list when None) with the earliest
/// deadline, if any. An empty `NotBefore` (the event has started) is
/// `unix_now`; an unparsable one gives no deadline.
///
/// # Errors
///
/// Why the document is not one: not JSON, not an object, no `Events` list,
/// or (when no notice results) an event that is not an object with a string
/// `EventType` or, for `Preempt`/`Terminate`, a `Resources` list of strings
/// and a `NotBefore` string.
pub fn parse_scheduled_events(body: &[u8], vm_name: Option<&str>, unix_now: f64) -> Result<Option<Notice>, &'static str> {
    let value: Value = serde_json::from_slice(body).map_err(|_| "not JSON")?;
    let events = value
        .as_object()
        .ok_or("not a JSON object")?
        .get("Events")
        .and_then(Value::as_array)
        .ok_or("no Events list")?;
    let mut best: Option<Notice> = None;
    let mut bad = false;
    for event in events {
        let Some(event) = event.as_object() else {
            bad = true;
            continue;
        };
        let Some(kind) = event.get("EventType").and_then(Value::as_str) else {
            bad = true;
            continue;
        };
        let kind = match kind {
            "Preempt" => "Preempt",
            "Terminate" => "Terminate",
            _ => continue,
        };
        // The rest of the event must have its documented shape: a list of
        // resource names (strings) and a NotBefore string.
        let resources: Option<Vec<&str>> = event
            .get("Resources")
            .and_then(Value::as_array)
            .and_then(|list| list.iter().map(Value::as_str).collect());
        let (Some(resources), Some(not_before)) = (resources, event.get("NotBefore").and_then(Value::as_str)) else {
            bad = true;
            continue;
        };
        let concerns_us = match vm_name {
            Some(name) => resources.iter().any(|r| r.eq_ignore_ascii_case(name)),
            None => !resources.is_empty(),
        };
        if !concerns_us {
            continue;
        }
        let (deadline, when) = if not_before.is_empty() {
            (Some(unix_now), "already started".to_owned())
        } else {
            match parse_rfc1123(not_before) {
                Some(t) => (Some(t), format!("NotBefore {not_before}")),
                None => (None, "NotBefore unparsable".to_owned()),
            }
        };
        let earlier = match (&best, deadline) {
            (None, _) => true,
            (Some(b), Some(d)) => match b.deadline {
                None => true,
                Some(bd) => d < bd,
            },
            (Some(_), None) => false,
        };
        if earlier {
            best = Some(Notice {
                description: format!("Azure scheduled event {kind} ({when})"),
                deadline,
            });
        }
    }
    match best {
        Some(notice) => Ok(Some(notice)),
        None if bad => Err("an event without EventType or Resources"),
        None => Ok(None),
    }
}

impl AzurePoller {
    /// A poller whose first request (the VM name) is due at once.
    #[must_use]
    pub fn new(timing: Timing) -> Self {
        AzurePoller {
            timing,
            name: VmName::Ask,
            next_at: f64::NEG_INFINITY,
            sent: None,
            noticed: false,
        }
    }

    /// The name cannot be learned: accept any resource from now on (the
    /// trouble's detail says so; the name is asked once, so this is logged
    /// once).
    fn name_unknown(&mut self, now: f64, malformed: bool, why: &str) -> Option<Event> {
        self.name = VmName::Any;
        self.next_at = now;
        trouble(
            AZURE_NAME_WHAT,
            malformed,
            format!("{why}; accepting scheduled events for any resource"),
        )
    }
}

impl Poller for AzurePoller {
    fn next(&mut self, now: f64) -> Action {
        let (call, path) = if self.name == VmName::Ask {
            (AzureCall::Name, AZURE_NAME_PATH)
        } else if now < self.next_at {
            return Action::SleepUntil(self.next_at);
        } else {
            (AzureCall::Events, AZURE_EVENTS_PATH)
        };
        self.sent = Some((call, now));
        Action::Request(Request {
            method: "GET",
            path: path.to_owned(),
            headers: vec![(AZURE_METADATA.0, AZURE_METADATA.1.to_owned())],
            timeout: self.timing.request_timeout,
        })
    }

    fn on_response(&mut self, now: f64, unix_now: f64, response: &Response<'_>) -> Option<Event> {
        const WHAT: &str = "Azure scheduled events";
        let (call, issued) = self.sent.take()?;
        if call == AzureCall::Name {
            return match (response.status, valid_vm_name(response.body)) {
                (200, Some(name)) => {
                    self.name = VmName::Known(name);
                    self.next_at = now;
                    None
                }
                (200, None) => self.name_unknown(now, true, "not a VM name"),
                (status, _) => self.name_unknown(now, false, &format!("status {status}")),
            };
        }
        self.next_at = paced(issued, self.timing.interval, now);
        if response.status != 200 {
            return trouble(WHAT, false, format!("status {}", response.status));
        }
        let name = match &self.name {
            VmName::Known(n) => Some(n.as_str()),
            _ => None,
        };
        match parse_scheduled_events(response.body, name, unix_now) {
            Ok(Some(notice)) if !self.noticed => {
                self.noticed = true;
                Some(Event::Notice(notice))
            }
            Ok(_) => None,
            Err(why) => trouble(WHAT, true, why),
        }
    }

    fn on_failure(&mut self, now: f64, detail: &str) -> Option<Event> {
        let (call, issued) = self.sent.take()?;
        if call == AzureCall::Name {
            return self.name_unknown(now, false, detail);
        }
        self.next_at = paced(issued, self.timing.interval, now);
        trouble("Azure scheduled events", false, detail)
    }
}

/// The pollers watching `cloud`, each with a thread name.
#[must_use]
pub fn pollers(cloud: Cloud, timing: Timing) -> Vec<(&'static str, Box<dyn Poller + Send>)> {
    match cloud {
        Cloud::Gce => vec![
            (
                "tfh-gce-maintenance",
                Box::new(GcePoller::new(GceEndpoint::MaintenanceEvent, timing)) as Box<dyn Poller + Send>,
            ),
            ("tfh-gce-preempted", Box::new(GcePoller::new(GceEndpoint::Preempted, timing))),
        ],
        Cloud::Aws => vec![("tfh-aws-imds", Box::new(AwsPoller::new(timing)))],
        Cloud::Azure => vec![("tfh-azure-events", Box::new(AzurePoller::new(timing)))],
    }
}

// ---------------------------------------------------------------------------
// The I/O shell
// ---------------------------------------------------------------------------

/// Errors of [`WatchConfig::new`], [`MetadataWatch::start`] and [`probe`]'s
/// callers.
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
    /// Notices reported by pollers (the first one is kept).
    pub notices: u64,
}

#[derive(Default)]
struct Found {
    notice: Option<Notice>,
    rebalance: Option<f64>,
}

/// A callback run once, on the polling thread, when the first notice
/// arrives.
pub type Wake = Box<dyn Fn() + Send + Sync>;

struct Shared {
    cloud: Cloud,
    /// Set by the first notice or by `close`: polling threads end, blocked
    /// requests are abandoned within a slice.
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
    /// Signalled when the first notice is stored and on close; `wait`
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
                let first = {
                    let mut found = self.found.lock();
                    if found.notice.is_some() {
                        false
                    } else {
                        found.notice = Some(notice.clone());
                        true
                    }
                };
                if first {
                    // The wake-up first: whoever `wait` returns to may look at
                    // the `SignalWatch` next. Logging last: it may wait for
                    // the GIL.
                    if let Some(wake) = &self.wake {
                        wake();
                    }
                    self.noticed.notify_all();
                    self.halt();
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

/// How long [`MetadataWatch::close`] waits for its threads. They notice the
/// stop flag within [`http::SLICE`]; a thread still running after this is
/// left to end on its own.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

impl MetadataWatch {
    /// Starts polling at once. `wake` runs once, on a polling thread, when
    /// the first notice arrives.
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

    /// The first notice seen, if any (sticky).
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

    /// Stops polling and joins the threads: returns within about
    /// [`http::SLICE`] even while a request is blocked (at most
    /// [`CLOSE_WAIT`]). Idempotent.
    pub fn close(&self) {
        self.stop();
        let Some(alive) = self.alive.lock().take() else { return };
        let threads = std::mem::take(&mut *self.threads.lock());
        match alive.recv_timeout(CLOSE_WAIT) {
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                for t in threads {
                    let _ = t.join();
                }
            }
            // Nothing is ever sent; a timeout leaves the threads detached.
            _ => log::warn!(target: LOG_TARGET, "metadata polling threads did not stop within {CLOSE_WAIT:?}; leaving them"),
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
/// Anything else, including any failure, is false. `stop` abandons it.
#[must_use]
pub fn probe(cloud: Cloud, base: &BaseUrl, timeout: Duration, stop: Option<&AtomicBool>) -> bool {
    let start = Instant::now();
    let deadline = start.checked_add(timeout).unwrap_or(start + Duration::from_secs(86_400));
    let mut client = Client::new(base.clone());
    let mut status = |method: &str, path: &str, headers: &[(&str, &str)]| {
        let left = deadline.saturating_duration_since(Instant::now());
        match client.request(method, path, headers, left, stop) {
            Ok(r) => Some(r.status),
            Err(e) => {
                log::debug!(target: LOG_TARGET, "{} metadata probe {path}: {e}", cloud.name());
                None
            }
        }
    };
    match cloud {
        Cloud::Gce => status("GET", GCE_PROBE_PATH, &[GCE_FLAVOR]) == Some(200),
        Cloud::Aws => match status("PUT", AWS_TOKEN_PATH, &[(AWS_TOKEN_TTL_HEADER, "21600")]) {
            Some(200) => true,
            Some(403..=405) => status("GET", AWS_PROBE_V1_PATH, &[]) == Some(200),
            _ => false,
        },
        Cloud::Azure => status("GET", AZURE_PROBE_PATH, &[AZURE_METADATA]) == Some(200),
    }
}

#[cfg(test)]
mod tests;
