//! Azure: the VM's name once, then scheduled events, watched by one
//! [`AzurePoller`], and the detection request (`/metadata/instance`).

use serde_json::Value;

use super::dates::parse_rfc1123;
use super::shared::{paced, trouble, Action, Event, Notice, Poller, Request, Response, Timing};

/// Azure's instance-metadata request header.
pub const AZURE_METADATA: (&str, &str) = ("Metadata", "true");
/// Default grace period on Azure, in seconds: Azure Spot's `Preempt` event comes
/// 30 s ahead.
pub const AZURE_GRACE_PERIOD: u32 = 30;

const AZURE_EVENTS_PATH: &str = "/metadata/scheduledevents?api-version=2020-07-01";
const AZURE_NAME_PATH: &str = "/metadata/instance/compute/name?api-version=2021-02-01&format=text";
const AZURE_NAME_WHAT: &str = "Azure VM name";
const AZURE_PROBE_PATH: &str = "/metadata/instance?api-version=2021-02-01";

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
pub(super) fn valid_vm_name(body: &[u8]) -> Option<String> {
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

/// Azure's detection request: `GET /metadata/instance` with `Metadata: true`
/// answers 200.
/// The poller watching Azure, with its thread's name.
pub(super) fn pollers(timing: Timing) -> Vec<super::shared::NamedPoller> {
    vec![("tfh-azure-events", Box::new(AzurePoller::new(timing)))]
}

pub(super) fn probe(status: &mut super::shared::ProbeStatus<'_>) -> bool {
    status("GET", AZURE_PROBE_PATH, &[AZURE_METADATA]) == Some(200)
}
