//! Hostile bytes never panic and never announce.

use super::*;
use crate::sources::aws::valid_token;
use crate::sources::azure::valid_vm_name;

use proptest::prelude::*;
use serde_json::Value;

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Bytes that are sometimes nearly a valid document.
fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..300),
        "[{}\\[\\]\":, a-zA-Z0-9]{0,120}".prop_map(String::into_bytes),
        (
            "(terminate|stop|hibernate|reboot|Preempt|Terminate|Reboot|TRUE|FALSE|)",
            "[{}\\[\\]\":, ]{0,8}",
            "[{}\\[\\]\":, ]{0,8}"
        )
            .prop_map(|(word, a, b)| format!("{a}{{\"action\":\"{word}\",\"Events\":[{b}{{\"EventType\":\"{word}\"}}]{b}").into_bytes()),
    ]
}

/// A poller of each kind with its first request outstanding, the VM name
/// learned for Azure.
fn fresh_pollers() -> Vec<(&'static str, Box<dyn Poller>)> {
    let mut azure = AzurePoller::new(timing());
    let _ = request(&mut azure, 0.0);
    let _ = answer(&mut azure, 0.0, 200, &[], "vm");
    let mut aws = AwsPoller::new(timing());
    let _ = request(&mut aws, 0.0);
    let _ = answer(&mut aws, 0.0, 200, &[], "tok");
    let mut out: Vec<(&'static str, Box<dyn Poller>)> = vec![
        ("gce-maintenance", Box::new(GcePoller::new(GceEndpoint::MaintenanceEvent, timing()))),
        ("gce-preempted", Box::new(GcePoller::new(GceEndpoint::Preempted, timing()))),
        ("aws", Box::new(aws)),
        ("azure", Box::new(azure)),
    ];
    for (_, p) in &mut out {
        let _ = request(p.as_mut(), 0.0);
    }
    out
}

proptest! {
    #[test]
    fn response_parsers_never_panic_or_announce_from_junk(body in hostile_bytes()) {
        if let Ok(n) = parse_spot_action(&body) {
            prop_assert!(contains(&body, "action"), "{:?}", n);
            let named = ["terminate", "stop", "hibernate"].iter().any(|a| contains(&body, &format!("\"{a}\"")));
            prop_assert!(named);
        }
        if let Ok(Some(_)) = parse_scheduled_events(&body, Some("vm"), 0.0) {
            prop_assert!(contains(&body, "\"vm\""));
        }
        if let Ok(Some(_)) = parse_scheduled_events(&body, None, 0.0) {
            prop_assert!(contains(&body, "\"Preempt\"") || contains(&body, "\"Terminate\""));
            prop_assert!(contains(&body, "Events") && contains(&body, "Resources"));
        }
        if parse_rebalance(&body).is_ok() {
            prop_assert!(contains(&body, "noticeTime"));
        }
        let _ = valid_token(&body);
        let _ = valid_vm_name(&body);
    }

    #[test]
    fn pollers_never_panic_or_announce_from_junk(
        status in prop_oneof![Just(200u16), 100u16..600],
        body in hostile_bytes(),
        etag in proptest::option::of(".{0,20}"),
    ) {
        let headers: Vec<(String, String)> = etag.into_iter().map(|e| ("ETag".to_owned(), e)).collect();
        for (name, mut p) in fresh_pollers() {
            let event = p.on_response(1.0, 1.0, &Response { status, headers: &headers, body: &body });
            if let Some(Event::Notice(n)) = &event {
                prop_assert_eq!(status, 200);
                let text = String::from_utf8_lossy(&body);
                match name {
                    "gce-maintenance" => prop_assert_eq!(text.trim(), "TERMINATE_ON_HOST_MAINTENANCE"),
                    "gce-preempted" => prop_assert_eq!(text.trim(), "TRUE"),
                    "aws" => prop_assert!(parse_spot_action(&body).is_ok(), "{:?}", n),
                    _ => prop_assert!(contains(&body, "\"vm\""), "{:?}", n),
                }
            }
            // Whatever came back, the poller goes on.
            let _ = p.next(1.0);
            let _ = p.next(10.0);
        }
    }

    /// Generated documents: a notice exactly when a valid action is there.
    #[test]
    fn spot_action_notice_iff_valid_action(action in "[a-z]{0,10}", time in proptest::option::of("[0-9TZ:.-]{0,25}")) {
        let mut doc = serde_json::Map::new();
        doc.insert("action".into(), Value::String(action.clone()));
        if let Some(t) = &time {
            doc.insert("time".into(), Value::String(t.clone()));
        }
        let body = serde_json::to_vec(&Value::Object(doc)).unwrap();
        let got = parse_spot_action(&body);
        prop_assert_eq!(got.is_ok(), ["terminate", "stop", "hibernate"].contains(&action.as_str()));
        if let Ok(n) = got {
            prop_assert_eq!(n.deadline, time.as_deref().and_then(parse_rfc3339));
        }
    }

    /// Generated event lists: a notice exactly when some Preempt/Terminate
    /// event names this VM.
    #[test]
    fn scheduled_events_notice_iff_an_event_names_this_vm(
        list in proptest::collection::vec(
            (
                prop_oneof![Just("Preempt"), Just("Terminate"), Just("Reboot"), Just("Redeploy"), Just("Freeze")],
                proptest::collection::vec(prop_oneof![Just("vm"), Just("VM"), Just("other"), Just("")], 0..3),
            ),
            0..5,
        ),
    ) {
        let events: Vec<Value> = list
            .iter()
            .map(|(kind, resources)| serde_json::json!({"EventType": kind, "Resources": resources, "NotBefore": ""}))
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({"DocumentIncarnation": 1, "Events": events})).unwrap();
        let expected = list
            .iter()
            .any(|(kind, resources)| matches!(*kind, "Preempt" | "Terminate") && resources.iter().any(|r| r.eq_ignore_ascii_case("vm")));
        let got = parse_scheduled_events(&body, Some("vm"), 7.0).unwrap();
        prop_assert_eq!(got.is_some(), expected);
        if let Some(n) = got {
            prop_assert_eq!(n.deadline, Some(7.0));
        }
    }
}
