//! Termination sources: signals, and the metadata services of GCE, AWS and Azure, polled.
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
//! every transition is a table test (`tests/<platform>.rs`):
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
//! [`http::MAX_BODY`](crate::sources::http::MAX_BODY); strings that end up in a log line or a request (an
//! AWS token, a GCE `ETag`, an Azure VM name) are validated or
//! percent-encoded first. Anything else is an [`Event::Trouble`], counted
//! and logged, and polling goes on at the interval.
//!
//! # The I/O shell
//!
//! [`MetadataWatch`] runs one thread per poller (two for GCE, so each
//! endpoint sees a change within one long poll or one interval), executes
//! the actions with [`http::Client`](crate::sources::http::Client), and keeps the notice with
//! the earliest deadline, sticky. The first notice, and each later one that ends earlier (a GCE
//! maintenance event, then `preempted`), calls the `wake` callback with it (the Python
//! binding posts it into the handler's [`crate::inbox::Inbox`], or triggers
//! a [`crate::sources::signals::SignalWatch`]); polling goes on until `close`,
//! because a later answer can bring the deadline forward. Every
//! request is bounded by its timeout and, through the stop flag, by
//! [`MetadataWatch::close`], which returns within about
//! [`http::SLICE`](crate::sources::http::SLICE) plus one slice even while a request
//! is blocked.
//!
//! Logging (target `tf_failure_handling`, forwarded to Python's logger of
//! that name): info for a notice and for each [`Event::Note`] (once),
//! a warning the first time each kind of trouble occurs, debug for every
//! failure; a request cut short by the stop flag is not logged. A record
//! may need the GIL (pyo3-log), so a caller that holds it never blocks on
//! these threads: it [`MetadataWatch::stop`]s and then
//! [`MetadataWatch::join`]s in short slices with the GIL released
//! (`src/python/sources.rs`), and a stopped [`probe`] logs nothing.
//!
//! # Files
//!
//! One file per platform, one for what they all share, one for the I/O:
//!
//! | file | holds |
//! | --- | --- |
//! | `shared.rs` | what every poller says and hears: [`Notice`], [`Request`], [`Action`], [`Response`], [`Event`], the [`Poller`] trait, [`Timing`], [`WatchError`] |
//! | `dates.rs` | [`parse_rfc3339`] (AWS) and [`parse_rfc1123`] (Azure), without a date crate |
//! | `gce.rs` | [`GcePoller`] and GCE's detection request |
//! | `aws.rs` | [`AwsPoller`], [`parse_spot_action`], [`parse_rebalance`] and AWS's detection requests |
//! | `azure.rs` | [`AzurePoller`], [`parse_scheduled_events`] and Azure's detection request |
//! | `clouds.rs` | the one table of the clouds: [`Cloud`], each one's name, [`pollers`] and detection request |
//! | `kubernetes.rs` | a SIGTERM's deadline and kill: the pod's grace period when stated, else Kubernetes' default for the deadline and no kill (nothing to poll: the pod gets SIGTERM) |
//! | `watcher_fn.rs` | how often a user's `termination_watcher_fn` is called, and the bound on its thread's join |
//! | `watch.rs` | the I/O shell: [`MetadataWatch`], [`probe`] and [`Probing`] (a probe on its own thread, for a caller that waits in slices) |
//! | `http.rs` | the minimal, strictly bounded HTTP/1.1 client `watch.rs` polls with |
//! | `slurm.rs` | SLURM's text as `scontrol` prints it: `Key=Value` fields, timestamps, durations, a config value (`_platforms/slurm.py` runs `scontrol`) |
//! | `signals.rs` | signals: `sigaction` from any thread, who owns a notice, one wake-up per delivery (not a poller: the process-wide plumbing) |
//! | `tests.rs`, `tests/` | table tests per platform, dates, hostile input, the shell against fake servers |
//!
//! Files import downward: the platforms use `shared.rs` and `dates.rs` and
//! never each other; `watch.rs` reaches them only through `clouds.rs`, the
//! one table. A new cloud is a new file with its poller, `pollers` and
//! `probe`, its `mod` line here, and a [`Cloud`] variant and its row in
//! `clouds.rs`.

mod aws;
mod azure;
mod clouds;
mod dates;
mod gce;
pub mod http;
pub mod key_watch;
mod kubernetes;
mod shared;
pub mod signals;
pub mod slurm;
mod watch;
mod watcher_fn;

pub use aws::{parse_rebalance, parse_spot_action, AwsPoller, AWS_REBALANCE_MAX_INTERVAL, AWS_TOKEN_RETRY, AWS_TOKEN_TTL, NOTE_IMDSV1};
pub use azure::{parse_scheduled_events, AzurePoller, AZURE_METADATA};
pub use clouds::{pollers, Cloud, Line as SysfsLine, Row as CloudRow, DEFAULT_EXIT_CODE, GCE_EXIT_CODE};
pub use dates::{parse_rfc1123, parse_rfc3339};
pub use gce::{GceEndpoint, GcePoller, GCE_FLAVOR, GCE_LONG_POLL_GIVE_UP, GCE_LONG_POLL_SECONDS, GCE_PREEMPTED_LEAD};
pub use kubernetes::sigterm_deadlines as kubernetes_sigterm_deadlines;
pub use shared::{
    Action, Event, Notice, Poller, Request, Response, Timing, Trouble, WatchError, METADATA_TIMEOUT, MIN_INTERVAL, WATCH_INTERVAL,
    WATCH_REQUEST_TIMEOUT,
};
pub use watch::{gce_terminating, probe, MetadataWatch, Probing, Stats, Wake, WatchConfig, CLOSE_WAIT, PROBE_STOP_WAIT};
pub use watcher_fn::{Next as WatcherFnNext, WatcherFnPoll, SLOW_WATCHER_FN, WATCHER_FN_INTERVAL, WATCHER_FN_JOIN_TIMEOUT};

#[cfg(test)]
mod tests;
