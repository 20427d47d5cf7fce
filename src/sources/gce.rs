//! GCE: `instance/maintenance-event` and `instance/preempted`, each watched
//! by its own [`GcePoller`] (plain `GET`, then `ETag` long polls), and the
//! detection request (`instance/hostname`).

use super::shared::{paced, trouble, Action, Event, Notice, Poller, Request, Response, Timing};

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
/// TensorFlow's default grace period on GCE GPU VMs, in seconds (a CPU or TPU VM
/// has none).
pub const GCE_GPU_GRACE_PERIOD: u32 = 3600;

const GCE_MAINTENANCE_PATH: &str = "/computeMetadata/v1/instance/maintenance-event";
const GCE_PREEMPTED_PATH: &str = "/computeMetadata/v1/instance/preempted";
const GCE_PROBE_PATH: &str = "/computeMetadata/v1/instance/hostname";

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
pub(super) fn encode_etag(etag: &str) -> Option<String> {
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

/// GCE's detection request: `GET instance/hostname` with the metadata header
/// answers 200.
/// The pollers watching GCE, each with its thread's name.
pub(super) fn pollers(timing: Timing) -> Vec<super::shared::NamedPoller> {
    vec![
        (
            "tfh-gce-maintenance",
            Box::new(GcePoller::new(GceEndpoint::MaintenanceEvent, timing)) as Box<dyn Poller + Send>,
        ),
        ("tfh-gce-preempted", Box::new(GcePoller::new(GceEndpoint::Preempted, timing))),
    ]
}

/// TensorFlow's GCE termination watcher: `GET instance/maintenance-event` with
/// the metadata header answers 200 with exactly `TERMINATE_ON_HOST_MAINTENANCE`.
pub(super) fn terminating(answer: &mut super::shared::Answer<'_>) -> bool {
    answer("GET", GCE_MAINTENANCE_PATH, &[GCE_FLAVOR]).is_some_and(|r| r.status == 200 && r.body == b"TERMINATE_ON_HOST_MAINTENANCE")
}

pub(super) fn probe(status: &mut super::shared::ProbeStatus<'_>) -> bool {
    status("GET", GCE_PROBE_PATH, &[GCE_FLAVOR]) == Some(200)
}
