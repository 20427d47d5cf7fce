//! GCE's transitions, as tables of steps.

use super::*;
use crate::sources::gce::encode_etag;

const MAINT: &str = "/computeMetadata/v1/instance/maintenance-event";
const PREEMPTED: &str = "/computeMetadata/v1/instance/preempted";

#[test]
fn gce_plain_get_then_etag_long_polls_until_terminate() {
    let mut p = GcePoller::new(GceEndpoint::MaintenanceEvent, timing());
    let r = request(&mut p, 0.0);
    assert_eq!((r.method, r.path.as_str(), r.timeout), ("GET", MAINT, 1.0));
    assert_eq!(header(&r, "Metadata-Flavor"), Some("Google"));
    assert_eq!(answer(&mut p, 0.01, 200, &[("ETag", "abc")], "NONE"), None);
    // The long poll starts at once and may take timeout_sec + request_timeout.
    let r = request(&mut p, 0.01);
    assert_eq!(r.path, format!("{MAINT}?wait_for_change=true&last_etag=abc&timeout_sec=2"));
    assert_eq!(r.timeout, 3.0);
    // The server waited out timeout_sec: same ETag, poll again at once.
    assert_eq!(answer(&mut p, 2.01, 200, &[("etag", "abc")], "NONE"), None);
    let r = request(&mut p, 2.01);
    assert!(r.path.ends_with("last_etag=abc&timeout_sec=2"), "{}", r.path);
    // The value changed: MIGRATE is not a notice; the new ETag is used at once.
    assert_eq!(
        answer(&mut p, 2.5, 200, &[("ETag", "d-e_f.~")], "MIGRATE_ON_HOST_MAINTENANCE\n"),
        None
    );
    let r = request(&mut p, 2.5);
    assert!(r.path.contains("last_etag=d-e_f.~&"), "{}", r.path);
    let n = notice(answer(&mut p, 3.0, 200, &[("ETag", "g")], "TERMINATE_ON_HOST_MAINTENANCE"));
    assert_eq!(n.description, "GCE maintenance-event TERMINATE_ON_HOST_MAINTENANCE");
    assert_eq!(n.deadline, None);
    // Reported once.
    let _ = request(&mut p, 3.0);
    assert_eq!(answer(&mut p, 3.1, 200, &[("ETag", "h")], "TERMINATE_ON_HOST_MAINTENANCE"), None);
}

#[test]
fn gce_long_poll_that_returns_at_once_with_the_same_etag_is_paced() {
    let mut p = GcePoller::new(GceEndpoint::Preempted, timing());
    let _ = request(&mut p, 0.0);
    assert_eq!(answer(&mut p, 0.0, 200, &[("ETag", "e1")], "FALSE"), None);
    let _ = request(&mut p, 0.0);
    assert_eq!(answer(&mut p, 0.01, 200, &[("ETag", "e1")], "FALSE"), None);
    assert_eq!(sleeps_until(&mut p, 0.01), 0.5);
    let r = request(&mut p, 0.5);
    assert!(r.path.contains("wait_for_change=true&last_etag=e1"), "{}", r.path);
}

#[test]
fn gce_failed_long_poll_falls_back_to_plain_gets_and_gives_up_after_three() {
    let mut p = GcePoller::new(GceEndpoint::Preempted, timing());
    let mut now = 0.0;
    for round in 0..GCE_LONG_POLL_GIVE_UP {
        let r = request(&mut p, now);
        assert_eq!(r.path, PREEMPTED, "round {round}: a plain GET");
        assert_eq!(answer(&mut p, now + 0.01, 200, &[("ETag", "e")], "FALSE"), None);
        let r = request(&mut p, now + 0.01);
        assert!(r.path.contains("wait_for_change"), "round {round}: a long poll");
        // Three ways for a long poll to fail.
        let event = match round {
            0 => p.on_failure(now + 0.02, "timed out"),
            1 => answer(&mut p, now + 0.02, 400, &[("ETag", "e")], "bad request"),
            _ => answer(&mut p, now + 0.02, 200, &[], "FALSE"),
        };
        assert!(is_trouble(&event, "GCE preempted long poll", false), "{event:?}");
        // Back to plain GETs, one interval after the long poll started.
        assert_eq!(sleeps_until(&mut p, now + 0.02), now + 0.01 + 0.5);
        now += 0.51;
    }
    // Given up: plain GETs every interval even with an ETag.
    let r = request(&mut p, now);
    assert_eq!(r.path, PREEMPTED);
    assert_eq!(answer(&mut p, now + 0.01, 200, &[("ETag", "e")], "FALSE"), None);
    assert_eq!(sleeps_until(&mut p, now + 0.01), now + 0.5);
    let r = request(&mut p, now + 0.5);
    assert_eq!(r.path, PREEMPTED);
    // A plain GET answering TRUE is still a notice: 30 s from the wall clock.
    let n = notice(answer(&mut p, now + 0.6, 200, &[], " TRUE\n"));
    assert_eq!(n.description, "GCE preempted");
    assert!((n.deadline.unwrap() - (1000.0 + now + 0.6 + 30.0)).abs() < 1e-9);
}

#[test]
fn gce_long_poll_without_etag_still_reports_a_notice() {
    let mut p = GcePoller::new(GceEndpoint::Preempted, timing());
    let _ = request(&mut p, 0.0);
    assert_eq!(answer(&mut p, 0.0, 200, &[("ETag", "e")], "FALSE"), None);
    let _ = request(&mut p, 0.0);
    let n = notice(answer(&mut p, 1.0, 200, &[], "TRUE"));
    assert_eq!(n.deadline, Some(1031.0));
}

#[test]
fn gce_only_status_200_with_a_known_value_counts() {
    // (status, headers, body, the trouble expected: endpoint and malformed)
    type Row<'a> = (u16, &'a [(&'a str, &'a str)], &'a str, Option<(&'a str, bool)>);
    let table: &[Row<'_>] = &[
        (404, &[], "TRUE", Some(("GCE preempted", false))),
        (500, &[], "TRUE", Some(("GCE preempted", false))),
        (503, &[("ETag", "x")], "", Some(("GCE preempted", false))),
        (200, &[], "FALSE", None),
        (200, &[], "true", Some(("GCE preempted", true))),
        (200, &[], "TRUEISH", Some(("GCE preempted", true))),
        (200, &[], "", Some(("GCE preempted", true))),
        (200, &[], "{\"TRUE\": 1}", Some(("GCE preempted", true))),
    ];
    for (status, headers, body, expected) in table {
        let mut p = GcePoller::new(GceEndpoint::Preempted, timing());
        let _ = request(&mut p, 0.0);
        let event = answer(&mut p, 0.1, *status, headers, body);
        match expected {
            None => assert_eq!(event, None, "{status} {body:?}"),
            Some((what, malformed)) => assert!(is_trouble(&event, what, *malformed), "{status} {body:?}: {event:?}"),
        }
        // Polling goes on at the interval.
        assert_eq!(sleeps_until(&mut p, 0.1), 0.5, "{status} {body:?}");
    }
    let mut p = GcePoller::new(GceEndpoint::MaintenanceEvent, timing());
    let _ = request(&mut p, 0.0);
    let e = p.on_response(
        0.1,
        0.0,
        &Response {
            status: 200,
            headers: &[],
            body: b"\xff\xfe",
        },
    );
    assert!(is_trouble(&e, "GCE maintenance-event", true), "{e:?}");
    let _ = request(&mut p, 0.5);
    assert!(is_trouble(
        &answer(&mut p, 0.6, 200, &[], "terminate"),
        "GCE maintenance-event",
        true
    ));
    let _ = request(&mut p, 1.1);
    let e = p.on_failure(2.5, "timed out");
    assert!(is_trouble(&e, "GCE maintenance-event", false), "{e:?}");
    // The request took longer than the interval: retried at once.
    let _ = request(&mut p, 2.5);
}

#[test]
fn gce_etags_are_percent_encoded_or_refused() {
    assert_eq!(encode_etag("W/\"x\"").as_deref(), Some("W%2F%22x%22"));
    assert_eq!(encode_etag("a&b=c#").as_deref(), Some("a%26b%3Dc%23"));
    assert_eq!(encode_etag("a b"), None);
    assert_eq!(encode_etag(""), None);
    assert_eq!(encode_etag(&"x".repeat(257)), None);
    let mut p = GcePoller::new(GceEndpoint::Preempted, timing());
    let _ = request(&mut p, 0.0);
    assert_eq!(answer(&mut p, 0.0, 200, &[("ETag", "a\tb")], "FALSE"), None);
    // Refused ETag: plain polling.
    assert_eq!(sleeps_until(&mut p, 0.0), 0.5);
}
