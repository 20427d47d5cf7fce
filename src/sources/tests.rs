use super::*;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicUsize;

use proptest::prelude::*;

// ---------------------------------------------------------------------------
// Part 1: the pollers' transitions, as tables of steps.
// ---------------------------------------------------------------------------

fn timing() -> Timing {
    Timing::new(0.5, 1.0).unwrap()
}

/// `poller.next(now)`, which must be a request.
#[track_caller]
fn request(poller: &mut dyn Poller, now: f64) -> Request {
    match poller.next(now) {
        Action::Request(r) => r,
        other => panic!("expected a request at {now}, got {other:?}"),
    }
}

#[track_caller]
fn sleeps_until(poller: &mut dyn Poller, now: f64) -> f64 {
    match poller.next(now) {
        Action::SleepUntil(t) => t,
        other => panic!("expected a sleep at {now}, got {other:?}"),
    }
}

/// Feeds a response at `now` (wall clock `1000 + now`).
fn answer(poller: &mut dyn Poller, now: f64, status: u16, headers: &[(&str, &str)], body: &str) -> Option<Event> {
    let headers: Vec<(String, String)> = headers.iter().map(|(n, v)| ((*n).to_owned(), (*v).to_owned())).collect();
    poller.on_response(
        now,
        1000.0 + now,
        &Response {
            status,
            headers: &headers,
            body: body.as_bytes(),
        },
    )
}

fn header<'r>(r: &'r Request, name: &str) -> Option<&'r str> {
    r.headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

fn is_trouble(event: &Option<Event>, what: &str, malformed: bool) -> bool {
    matches!(event, Some(Event::Trouble(t)) if t.what == what && t.malformed == malformed)
}

fn notice(event: Option<Event>) -> Notice {
    match event {
        Some(Event::Notice(n)) => n,
        other => panic!("expected a notice, got {other:?}"),
    }
}

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

const TOKEN: &str = "/latest/api/token";
const ACTION: &str = "/latest/meta-data/spot/instance-action";
const REBALANCE: &str = "/latest/meta-data/events/recommendations/rebalance";

/// An AWS poller that holds token `tok` from time 0 and has polled both
/// endpoints once (404) by 0.02.
fn aws_with_token() -> AwsPoller {
    let mut p = AwsPoller::new(timing());
    let r = request(&mut p, 0.0);
    assert_eq!((r.method, r.path.as_str()), ("PUT", TOKEN));
    assert_eq!(header(&r, "X-aws-ec2-metadata-token-ttl-seconds"), Some("21600"));
    assert_eq!(answer(&mut p, 0.0, 200, &[], "tok\n"), None);
    let r = request(&mut p, 0.01);
    assert_eq!(
        (r.method, r.path.as_str(), header(&r, "X-aws-ec2-metadata-token")),
        ("GET", ACTION, Some("tok"))
    );
    assert_eq!(answer(&mut p, 0.01, 404, &[], "Not Found"), None);
    let r = request(&mut p, 0.02);
    assert_eq!((r.path.as_str(), header(&r, "X-aws-ec2-metadata-token")), (REBALANCE, Some("tok")));
    assert_eq!(answer(&mut p, 0.02, 404, &[], ""), None);
    p
}

#[test]
fn aws_token_then_404s_then_a_notice() {
    let mut p = aws_with_token();
    // Next: the action at 0.51 (one interval after it started), then rebalance at 0.52.
    assert_eq!(sleeps_until(&mut p, 0.03), 0.51);
    assert_eq!(request(&mut p, 0.51).path, ACTION);
    assert_eq!(answer(&mut p, 0.51, 404, &[], ""), None);
    assert_eq!(request(&mut p, 0.52).path, REBALANCE);
    assert_eq!(answer(&mut p, 0.52, 404, &[], ""), None);
    assert_eq!(request(&mut p, 1.01).path, ACTION);
    let n = notice(answer(
        &mut p,
        1.02,
        200,
        &[],
        r#"{"action": "terminate", "time": "2017-09-18T08:22:00Z"}"#,
    ));
    assert_eq!(n.description, "AWS spot instance-action terminate at 2017-09-18T08:22:00Z");
    assert_eq!(n.deadline, Some(1_505_722_920.0));
    // Reported once.
    assert_eq!(request(&mut p, 1.02).path, REBALANCE);
    let _ = answer(&mut p, 1.02, 404, &[], "");
    let _ = request(&mut p, 1.51);
    assert_eq!(
        answer(&mut p, 1.52, 200, &[], r#"{"action": "terminate", "time": "2017-09-18T08:22:00Z"}"#),
        None
    );
}

#[test]
fn aws_spot_action_documents() {
    // (body, Ok((description, deadline)) for a notice or Err(()))
    type Row<'a> = (&'a str, Result<(&'a str, Option<f64>), ()>);
    let table: &[Row<'_>] = &[
        (
            r#"{"action":"stop","time":"1970-01-01T00:00:00Z"}"#,
            Ok(("AWS spot instance-action stop at 1970-01-01T00:00:00Z", Some(0.0))),
        ),
        (
            r#"{"action":"hibernate","time":"2017-09-18T08:22:00.5+00:00"}"#,
            Ok((
                "AWS spot instance-action hibernate at 2017-09-18T08:22:00.5+00:00",
                Some(1_505_722_920.5),
            )),
        ),
        (
            r#"{"action":"terminate"}"#,
            Ok(("AWS spot instance-action terminate (no valid time)", None)),
        ),
        (
            r#"{"action":"terminate","time":"soon"}"#,
            Ok(("AWS spot instance-action terminate (no valid time)", None)),
        ),
        (
            r#"{"action":"terminate","time":17}"#,
            Ok(("AWS spot instance-action terminate (no valid time)", None)),
        ),
        (r#"{"action":"reboot","time":"2017-09-18T08:22:00Z"}"#, Err(())),
        (r#"{"action":"Terminate"}"#, Err(())),
        (r#"{"action":5}"#, Err(())),
        (r#"{"time":"2017-09-18T08:22:00Z"}"#, Err(())),
        (r#"["terminate"]"#, Err(())),
        (r#""terminate""#, Err(())),
        ("terminate", Err(())),
        (r#"{"action":"terminate""#, Err(())),
        (r#"{"action":"terminate"} trailing"#, Err(())),
        ("", Err(())),
        ("\u{0}\u{1}binary", Err(())),
    ];
    for (body, expected) in table {
        let got = parse_spot_action(body.as_bytes());
        match expected {
            Ok((description, deadline)) => {
                let n = got.unwrap_or_else(|e| panic!("{body}: {e}"));
                assert_eq!((n.description.as_str(), n.deadline), (*description, *deadline), "{body}");
            }
            Err(()) => assert!(got.is_err(), "{body}: {got:?}"),
        }
    }
    // Deep nesting: serde_json's recursion limit turns it into an error.
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert!(parse_spot_action(deep.as_bytes()).is_err());
    let deep_object = format!("{}{{\"action\":\"terminate\"}}{}", "{\"a\":".repeat(10_000), "}".repeat(10_000));
    assert!(parse_spot_action(deep_object.as_bytes()).is_err());
}

#[test]
fn aws_malformed_and_failing_answers_never_notice_and_polling_goes_on() {
    for (status, body, malformed) in [
        (200, "garbage", true),
        (200, r#"{"action":"reboot"}"#, true),
        (500, r#"{"action":"terminate"}"#, false),
        (503, "", false),
        (403, r#"{"action":"terminate"}"#, false),
    ] {
        let mut p = aws_with_token();
        let _ = request(&mut p, 0.51);
        let e = answer(&mut p, 0.55, status, &[], body);
        assert!(is_trouble(&e, "AWS spot instance-action", malformed), "{status} {body}: {e:?}");
        assert_eq!(request(&mut p, 0.55).path, REBALANCE);
        let _ = answer(&mut p, 0.56, 404, &[], "");
        assert_eq!(sleeps_until(&mut p, 0.56), 1.01);
    }
    let mut p = aws_with_token();
    let _ = request(&mut p, 0.51);
    let e = p.on_failure(1.51, "timed out");
    assert!(is_trouble(&e, "AWS spot instance-action", false), "{e:?}");
}

#[test]
fn aws_401_drops_the_token_and_fetches_a_new_one() {
    let mut p = aws_with_token();
    let _ = request(&mut p, 0.51);
    let e = answer(&mut p, 0.52, 401, &[], "");
    assert!(is_trouble(&e, "AWS spot instance-action", false), "{e:?}");
    let r = request(&mut p, 0.52);
    assert_eq!((r.method, r.path.as_str()), ("PUT", TOKEN));
    assert_eq!(answer(&mut p, 0.53, 200, &[], "tok2"), None);
    // The rebalance poll was due first (0.52), then the action (1.01).
    let r = request(&mut p, 0.53);
    assert_eq!((r.path.as_str(), header(&r, "X-aws-ec2-metadata-token")), (REBALANCE, Some("tok2")));
    let _ = answer(&mut p, 0.54, 404, &[], "");
    assert_eq!(sleeps_until(&mut p, 0.54), 1.01);
    assert_eq!(header(&request(&mut p, 1.01), "X-aws-ec2-metadata-token"), Some("tok2"));
}

#[test]
fn aws_token_refused_means_imdsv1() {
    for status in [403, 404, 405] {
        let mut p = AwsPoller::new(timing());
        let _ = request(&mut p, 0.0);
        assert_eq!(answer(&mut p, 0.0, status, &[], ""), Some(Event::Note(NOTE_IMDSV1)));
        let r = request(&mut p, 0.0);
        assert_eq!((r.path.as_str(), header(&r, "X-aws-ec2-metadata-token")), (ACTION, None));
        assert_eq!(answer(&mut p, 0.0, 404, &[], ""), None);
        let _ = request(&mut p, 0.0);
        let _ = answer(&mut p, 0.0, 404, &[], "");
        // No token is asked for again, even much later.
        let r = request(&mut p, 100_000.0);
        assert_eq!((r.method, header(&r, "X-aws-ec2-metadata-token")), ("GET", None));
        // Until the server asks for one with a 401.
        let _ = answer(&mut p, 100_000.0, 401, &[], "");
        assert_eq!(request(&mut p, 100_000.0).method, "PUT");
    }
}

#[test]
fn aws_token_refresh_and_failures() {
    // Refreshed at 90 % of the TTL the server granted.
    let mut p = AwsPoller::new(timing());
    let _ = request(&mut p, 0.0);
    assert_eq!(
        answer(&mut p, 0.0, 200, &[("X-aws-ec2-metadata-token-ttl-seconds", "100")], "tok"),
        None
    );
    let r = request(&mut p, 89.0);
    assert_eq!(header(&r, "X-aws-ec2-metadata-token"), Some("tok"));
    let _ = answer(&mut p, 89.0, 404, &[], "");
    assert_eq!(request(&mut p, 90.0).method, "PUT");
    // The refresh fails: the old token, still valid, is kept.
    let e = p.on_failure(90.5, "timed out");
    assert!(is_trouble(&e, "AWS IMDSv2 token", false), "{e:?}");
    let r = request(&mut p, 90.5);
    assert_eq!(header(&r, "X-aws-ec2-metadata-token"), Some("tok"));
    let _ = answer(&mut p, 90.5, 404, &[], "");
    // Retried before it expires.
    assert_eq!(request(&mut p, 100.0).method, "PUT");
    let e = answer(&mut p, 100.0, 503, &[], "");
    assert!(is_trouble(&e, "AWS IMDSv2 token", false), "{e:?}");
    // Expired now: polling goes on without a token, and the token is tried
    // again after AWS_TOKEN_RETRY.
    let r = request(&mut p, 100.0);
    assert_eq!((r.method, header(&r, "X-aws-ec2-metadata-token")), ("GET", None));
    let _ = answer(&mut p, 100.0, 404, &[], "");
    let _ = request(&mut p, 100.5);
    let _ = answer(&mut p, 100.5, 404, &[], "");
    assert_eq!(request(&mut p, 100.0 + AWS_TOKEN_RETRY).method, "PUT");

    // A first token request that times out (a container's hop limit): poll
    // without a token meanwhile.
    let mut p = AwsPoller::new(timing());
    let _ = request(&mut p, 0.0);
    let _ = p.on_failure(1.0, "timed out");
    let r = request(&mut p, 1.0);
    assert_eq!((r.path.as_str(), header(&r, "X-aws-ec2-metadata-token")), (ACTION, None));
    let n = notice(answer(&mut p, 1.0, 200, &[], r#"{"action":"stop"}"#));
    assert_eq!(n.deadline, None);

    // A 200 that is not a token (a header injection attempt, empty, binary).
    for body in ["a\r\nX-Injected: 1", "", "   ", "\u{7f}"] {
        let mut p = AwsPoller::new(timing());
        let _ = request(&mut p, 0.0);
        let e = answer(&mut p, 0.0, 200, &[], body);
        assert!(is_trouble(&e, "AWS IMDSv2 token", true), "{body:?}: {e:?}");
        assert_eq!(header(&request(&mut p, 0.0), "X-aws-ec2-metadata-token"), None);
    }
}

#[test]
fn aws_rebalance_is_reported_once_and_is_not_a_notice() {
    let mut p = aws_with_token();
    let _ = request(&mut p, 0.51);
    let _ = answer(&mut p, 0.51, 404, &[], "");
    assert_eq!(request(&mut p, 0.52).path, REBALANCE);
    assert_eq!(
        answer(&mut p, 0.52, 200, &[], r#"{"noticeTime": "2020-10-27T08:22:00Z"}"#),
        Some(Event::Rebalance(1_603_786_920.0))
    );
    // No more rebalance polls: only the action, every interval.
    for k in 0..4 {
        let now = 1.01 + 0.5 * f64::from(k);
        assert_eq!(request(&mut p, now).path, ACTION);
        let _ = answer(&mut p, now, 404, &[], "");
        assert_eq!(sleeps_until(&mut p, now), now + 0.5);
    }
    for body in ["{}", r#"{"noticeTime": "yesterday"}"#, "nope", r#"{"noticeTime": 5}"#] {
        let mut p = aws_with_token();
        let _ = request(&mut p, 0.51);
        let _ = answer(&mut p, 0.51, 404, &[], "");
        let _ = request(&mut p, 0.52);
        let e = answer(&mut p, 0.52, 200, &[], body);
        assert!(is_trouble(&e, "AWS rebalance recommendation", true), "{body}: {e:?}");
    }
}

#[test]
fn aws_rebalance_is_polled_at_least_every_second_with_a_long_interval() {
    let mut p = AwsPoller::new(Timing::new(5.0, 1.0).unwrap());
    let _ = request(&mut p, 0.0);
    let _ = answer(&mut p, 0.0, 200, &[], "tok");
    let mut paths = Vec::new();
    let mut now = 0.0;
    while now < 10.0 {
        match p.next(now) {
            Action::Request(r) => {
                paths.push((now, r.path));
                let _ = answer(&mut p, now, 404, &[], "");
            }
            Action::SleepUntil(t) => now = t,
        }
    }
    let rebalance: Vec<f64> = paths.iter().filter(|(_, p)| p == REBALANCE).map(|(t, _)| *t).collect();
    let action: Vec<f64> = paths.iter().filter(|(_, p)| p == ACTION).map(|(t, _)| *t).collect();
    assert_eq!(action, [0.0, 5.0]);
    assert_eq!(rebalance, [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
}

const AZ_NAME: &str = "/metadata/instance/compute/name?api-version=2021-02-01&format=text";
const AZ_EVENTS: &str = "/metadata/scheduledevents?api-version=2020-07-01";

fn azure_named(name: Option<&str>) -> AzurePoller {
    let mut p = AzurePoller::new(timing());
    let r = request(&mut p, 0.0);
    assert_eq!((r.path.as_str(), header(&r, "Metadata")), (AZ_NAME, Some("true")));
    match name {
        Some(n) => assert_eq!(answer(&mut p, 0.0, 200, &[], n), None),
        None => assert!(is_trouble(&p.on_failure(0.0, "timed out"), "Azure VM name", false)),
    }
    p
}

fn events(list: &str) -> String {
    format!(r#"{{"DocumentIncarnation": 3, "Events": [{list}]}}"#)
}

fn event(kind: &str, resources: &str, not_before: &str) -> String {
    format!(
        r#"{{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "{kind}", "ResourceType": "VirtualMachine",
            "Resources": [{resources}], "EventStatus": "Scheduled", "NotBefore": "{not_before}",
            "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}}"#
    )
}

#[test]
fn azure_events_for_this_vm_only() {
    let mut p = azure_named(Some("myVM\n"));
    let r = request(&mut p, 0.0);
    assert_eq!((r.path.as_str(), header(&r, "Metadata")), (AZ_EVENTS, Some("true")));
    assert_eq!(answer(&mut p, 0.0, 200, &[], &events("")), None);
    assert_eq!(sleeps_until(&mut p, 0.0), 0.5);
    let other = event("Preempt", r#""otherVM""#, "Mon, 19 Sep 2016 18:29:47 GMT");
    let _ = request(&mut p, 0.5);
    assert_eq!(answer(&mut p, 0.5, 200, &[], &events(&other)), None);
    let mut now = 1.0;
    for kind in ["Reboot", "Redeploy", "Freeze", "Live Migration", "preempt"] {
        let _ = request(&mut p, now);
        assert_eq!(
            answer(&mut p, now, 200, &[], &events(&event(kind, r#""myVM""#, ""))),
            None,
            "{kind}"
        );
        now += 0.5;
    }
    let mine = event("Preempt", r#""otherVM", "MYVM""#, "Mon, 19 Sep 2016 18:29:47 GMT");
    let _ = request(&mut p, now);
    let n = notice(answer(&mut p, now, 200, &[], &events(&format!("{other}, {mine}"))));
    assert_eq!(
        n.description,
        "Azure scheduled event Preempt (NotBefore Mon, 19 Sep 2016 18:29:47 GMT)"
    );
    assert_eq!(n.deadline, Some(1_474_309_787.0));
    let _ = request(&mut p, now + 0.5);
    assert_eq!(answer(&mut p, now + 0.5, 200, &[], &events(&mine)), None, "reported once");
}

#[test]
fn azure_empty_not_before_is_now_and_terminate_counts() {
    let mut p = azure_named(Some("vm1"));
    let _ = request(&mut p, 0.0);
    let n = notice(answer(&mut p, 5.0, 200, &[], &events(&event("Terminate", r#""vm1""#, ""))));
    assert_eq!(n.description, "Azure scheduled event Terminate (already started)");
    assert_eq!(n.deadline, Some(1005.0));
}

#[test]
fn azure_without_a_name_accepts_any_resource() {
    let mut p = azure_named(None);
    let _ = request(&mut p, 0.0);
    let n = notice(answer(
        &mut p,
        0.0,
        200,
        &[],
        &events(&event("Preempt", r#""whatever""#, "Tue, 01 Jan 2030 00:00:00 GMT")),
    ));
    assert_eq!(n.deadline, Some(1_893_456_000.0));
    // But not to events naming no resource, or with non-string resources.
    assert_eq!(
        parse_scheduled_events(events(&event("Preempt", "", "")).as_bytes(), None, 0.0),
        Ok(None)
    );
    assert!(parse_scheduled_events(events(&event("Preempt", "7", "")).as_bytes(), None, 0.0).is_err());
    // A name answer that is not a name counts as unknown too.
    let mut p = AzurePoller::new(timing());
    let _ = request(&mut p, 0.0);
    assert!(is_trouble(&answer(&mut p, 0.0, 404, &[], "myvm"), "Azure VM name", false));
    let mut p = AzurePoller::new(timing());
    let _ = request(&mut p, 0.0);
    assert!(is_trouble(&answer(&mut p, 0.0, 200, &[], "a\u{1}b"), "Azure VM name", true));
    assert_eq!(request(&mut p, 0.0).path, AZ_EVENTS);
}

#[test]
fn azure_documents() {
    let at = |t: &str| event("Preempt", r#""vm""#, t);
    // (body, Ok(Some(deadline)) for a notice, Ok(None) for none, Err(()))
    type Row = (String, Result<Option<Option<f64>>, ()>);
    let table: Vec<Row> = vec![
        (events(""), Ok(None)),
        (r#"{"DocumentIncarnation": 0, "Events": []}"#.into(), Ok(None)),
        // The earliest deadline wins; an unparsable NotBefore gives none.
        (
            events(&format!(
                "{}, {}",
                at("Tue, 01 Jan 2030 00:00:00 GMT"),
                at("Thu, 01 Jan 1970 00:00:10 GMT")
            )),
            Ok(Some(Some(10.0))),
        ),
        (events(&at("tomorrow")), Ok(Some(None))),
        (
            events(&format!("{}, {}", at("tomorrow"), at("Thu, 01 Jan 1970 00:00:10 GMT"))),
            Ok(Some(Some(10.0))),
        ),
        // Not documents.
        ("[]".into(), Err(())),
        ("{}".into(), Err(())),
        (r#"{"Events": {}}"#.into(), Err(())),
        (events("5"), Err(())),
        (events(r#"{"EventType": "Preempt"}"#), Err(())),
        (events(r#"{"Resources": ["vm"]}"#), Err(())),
        (events(r#"{"EventType": "Preempt", "Resources": ["vm"]}"#), Err(())),
        (
            events(r#"{"EventType": "Preempt", "Resources": ["vm", 7], "NotBefore": ""}"#),
            Err(()),
        ),
        (events(r#"{"EventType": "Preempt", "Resources": "vm", "NotBefore": ""}"#), Err(())),
        (events(r#"{"EventType": "Preempt", "Resources": ["vm"], "NotBefore": 5}"#), Err(())),
        // Other event types are not looked into.
        (events(r#"{"EventType": "Freeze", "Resources": 7}"#), Ok(None)),
        (events(&at("Mon, 19 Sep 2016 18:29:47 GMT"))[..40].to_owned(), Err(())),
        ("\u{0}garbage".into(), Err(())),
        // A bad entry next to a good one: the good one counts.
        (events(&format!("5, {}", at("Thu, 01 Jan 1970 00:00:10 GMT"))), Ok(Some(Some(10.0)))),
    ];
    for (body, expected) in table {
        let got = parse_scheduled_events(body.as_bytes(), Some("vm"), 0.0);
        match expected {
            Ok(e) => assert_eq!(got.map(|n| n.map(|n| n.deadline)), Ok(e), "{body}"),
            Err(()) => assert!(got.is_err(), "{body}: {got:?}"),
        }
    }
    // Failures and malformed answers through the poller.
    let mut p = azure_named(Some("vm"));
    let _ = request(&mut p, 0.0);
    assert!(is_trouble(&answer(&mut p, 0.0, 200, &[], "nope"), "Azure scheduled events", true));
    let _ = request(&mut p, 0.5);
    assert!(is_trouble(
        &answer(&mut p, 0.5, 500, &[], &events(&at(""))),
        "Azure scheduled events",
        false
    ));
    let _ = request(&mut p, 1.0);
    assert!(is_trouble(&p.on_failure(2.0, "timed out"), "Azure scheduled events", false));
    assert_eq!(request(&mut p, 2.0).path, AZ_EVENTS);
}

#[test]
fn answers_without_a_request_are_ignored() {
    let mut polls: Vec<Box<dyn Poller>> = vec![
        Box::new(GcePoller::new(GceEndpoint::Preempted, timing())),
        Box::new(AwsPoller::new(timing())),
        Box::new(AzurePoller::new(timing())),
    ];
    for p in &mut polls {
        assert_eq!(answer(p.as_mut(), 0.0, 200, &[], r#"TRUE"#), None);
        assert_eq!(p.on_failure(0.0, "x"), None);
    }
}

#[test]
fn config_validation() {
    assert!(WatchConfig::new("gce", "http://127.0.0.1:1/", 0.5, 1.0).is_ok());
    assert!(matches!(
        WatchConfig::new("GCE", "http://x", 0.5, 1.0),
        Err(WatchError::UnknownCloud(_))
    ));
    assert!(matches!(WatchConfig::new("aws", "https://x", 0.5, 1.0), Err(WatchError::BadUrl(_))));
    assert!(matches!(
        WatchConfig::new("aws", "http://x/latest", 0.5, 1.0),
        Err(WatchError::BadUrl(_))
    ));
    for (i, t) in [
        (0.0, 1.0),
        (-1.0, 1.0),
        (f64::NAN, 1.0),
        (f64::INFINITY, 1.0),
        (0.5, 0.0),
        (0.5, f64::NAN),
    ] {
        assert!(
            matches!(WatchConfig::new("azure", "http://x", i, t), Err(WatchError::BadDuration { .. })),
            "{i} {t}"
        );
    }
    assert_eq!(Timing::new(1e-9, 1.0).unwrap().interval, MIN_INTERVAL);
}

// ---------------------------------------------------------------------------
// Part 2: dates.
// ---------------------------------------------------------------------------

#[test]
fn rfc3339_known_values_and_junk() {
    for (text, expected) in [
        ("1970-01-01T00:00:00Z", 0.0),
        ("2017-09-18T08:22:00Z", 1_505_722_920.0),
        ("2017-09-18T08:22:00+00:00", 1_505_722_920.0),
        ("2017-09-18t08:22:00z", 1_505_722_920.0),
        ("2017-09-18T10:22:00+02:00", 1_505_722_920.0),
        ("2017-09-18T06:52:00-01:30", 1_505_722_920.0),
        ("2017-09-18T08:22:00.25Z", 1_505_722_920.25),
        ("2000-02-29T00:00:00Z", 951_782_400.0),
        ("2026-11-22T19:00:00Z", 1_795_374_000.0),
        ("1969-12-31T23:59:59Z", -1.0),
        ("2016-12-31T23:59:60Z", 1_483_228_800.0),
        ("9999-12-31T23:59:59Z", 253_402_300_799.0),
    ] {
        assert_eq!(parse_rfc3339(text), Some(expected), "{text}");
    }
    // Digits past nanoseconds are validated, not used.
    let t = parse_rfc3339("2017-09-18T08:22:00.123456789123Z").unwrap();
    assert!((t - 1_505_722_920.123_456_8).abs() < 1e-6, "{t}");
    for junk in [
        "",
        "2017-09-18",
        "2017-09-18T08:22:00",
        "2017-09-18 08:22:00Z",
        "2017-09-18T08:22Z",
        "2017-09-18T08:22:00.Z",
        "2017-09-18T08:22:00ZZ",
        "2017-09-18T08:22:00+0000",
        "2017-09-18T08:22:00+24:00",
        "2017-09-18T08:22:00 Z",
        " 2017-09-18T08:22:00Z",
        "2017-13-18T08:22:00Z",
        "2017-00-18T08:22:00Z",
        "2017-02-29T08:22:00Z",
        "1900-02-29T08:22:00Z",
        "2017-09-31T08:22:00Z",
        "2017-09-18T24:00:00Z",
        "2017-09-18T08:60:00Z",
        "2017-09-18T08:22:61Z",
        "+017-09-18T08:22:00Z",
        "２０17-09-18T08:22:00Z",
        "2017-09-18T08:22:00.１Z",
        "Mon, 19 Sep 2016 18:29:47 GMT",
    ] {
        assert_eq!(parse_rfc3339(junk), None, "{junk}");
    }
}

#[test]
fn rfc1123_known_values_and_junk() {
    for (text, expected) in [
        ("Mon, 19 Sep 2016 18:29:47 GMT", 1_474_309_787.0),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
        ("Thu, 1 Jan 1970 00:00:00 UTC", 0.0),
        ("Sun, 06 Nov 1994 08:49:37 +0000", 784_111_777.0),
        ("Tue, 29 Feb 2000 12:00:00 GMT", 951_825_600.0),
    ] {
        assert_eq!(parse_rfc1123(text), Some(expected), "{text}");
    }
    for junk in [
        "",
        "19 Sep 2016 18:29:47 GMT",
        "Mon 19 Sep 2016 18:29:47 GMT",
        "Monday, 19 Sep 2016 18:29:47 GMT",
        "Mon, 19 Sep 2016 18:29:47",
        "Mon, 19 Sep 2016 18:29:47 PST",
        "Mon, 19 Sep 2016 18:29:47 GMT ",
        "Mon,  19 Sep 2016 18:29:47 GMT",
        "Mon, 19 sep 2016 18:29:47 GMT",
        "Mon, 19 Sept 2016 18:29:47 GMT",
        "Mon, 31 Sep 2016 18:29:47 GMT",
        "Mon, 00 Sep 2016 18:29:47 GMT",
        "Mon, 190 Sep 2016 18:29:47 GMT",
        "Mon, 19 Sep 16 18:29:47 GMT",
        "Mon, 19 Sep 2016 18:29 GMT",
        "Mon, 19 Sep 2016 18-29-47 GMT",
        "Mon, 19 Sep 2016 25:29:47 GMT",
        "Mon, 19 Sep 2016 1a:29:47 GMT",
        "Mon, 19 Sep 2016 18:29:4７ GMT",
        "2016-09-19T18:29:47Z",
    ] {
        assert_eq!(parse_rfc1123(junk), None, "{junk}");
    }
}

/// The inverse of `days_from_civil` (Howard Hinnant's `civil_from_days`),
/// to generate dates for the round trip.
fn civil(seconds: i64) -> (i64, u32, u32, u32, u32, u32) {
    let days = seconds.div_euclid(86_400);
    let rest = seconds.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let n = |x: i64| u32::try_from(x).unwrap();
    (y, n(m), n(d), n(rest / 3600), n(rest % 3600 / 60), n(rest % 60))
}

proptest! {
    #[test]
    fn date_parsers_never_panic(text in ".{0,40}") {
        let _ = parse_rfc3339(&text);
        let _ = parse_rfc1123(&text);
    }

    #[test]
    fn date_parsers_never_panic_on_near_misses(text in "[0-9A-Za-z:.+, -]{0,34}") {
        let _ = parse_rfc3339(&text);
        let _ = parse_rfc1123(&text);
    }

    #[test]
    fn dates_round_trip(seconds in 0i64..253_402_300_800, weekday in 0usize..7) {
        let (y, mo, d, h, mi, s) = civil(seconds);
        let expected = Some(seconds as f64);
        let rfc3339 = format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z");
        prop_assert_eq!(parse_rfc3339(&rfc3339), expected, "{}", rfc3339);
        let rfc1123 = format!("{}, {d:02} {} {y:04} {h:02}:{mi:02}:{s:02} GMT", WEEKDAYS[weekday], MONTHS[mo as usize - 1]);
        prop_assert_eq!(parse_rfc1123(&rfc1123), expected, "{}", rfc1123);
    }
}

// ---------------------------------------------------------------------------
// Part 3: hostile bytes never panic and never announce.
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Part 4: the I/O shell against fake metadata servers on 127.0.0.1.
// ---------------------------------------------------------------------------

/// How a fake server answers one request.
enum Reply {
    /// These bytes, then close.
    Raw(Vec<u8>),
    /// Accept and never answer.
    Hang,
}

fn ok(status: u16, body: &str) -> Reply {
    Reply::Raw(format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes())
}

/// A fake metadata server on 127.0.0.1: `route(method, path, head)` answers
/// each request. Returns its base URL.
fn fake_server(route: impl Fn(&str, &str, &str) -> Reply + Send + Sync + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let route = Arc::new(route);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let route = Arc::clone(&route);
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if stream.read(&mut byte).unwrap_or(0) == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                let mut words = head.split(' ');
                let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
                match route(method, path, &head) {
                    Reply::Raw(bytes) => {
                        let _ = stream.write_all(&bytes);
                    }
                    Reply::Hang => {
                        std::thread::sleep(Duration::from_secs(5));
                        drop::<TcpStream>(stream);
                    }
                }
            });
        }
    });
    base
}

fn start(cloud: &str, base: &str, wake: Option<Wake>) -> MetadataWatch {
    let config = WatchConfig::new(cloud, base, 0.05, 0.5).unwrap();
    MetadataWatch::start(&config, wake).unwrap()
}

#[test]
fn aws_watch_sees_a_notice_wakes_once_and_stops_polling() {
    let polls = Arc::new(AtomicUsize::new(0));
    let p = Arc::clone(&polls);
    let base = fake_server(move |method, path, head| match (method, path) {
        ("PUT", "/latest/api/token") => ok(200, "tok"),
        ("GET", "/latest/meta-data/spot/instance-action") if head.contains("X-aws-ec2-metadata-token: tok\r\n") => {
            if p.fetch_add(1, Ordering::SeqCst) < 3 {
                ok(404, "")
            } else {
                ok(200, r#"{"action": "terminate", "time": "2026-11-22T19:00:00Z"}"#)
            }
        }
        ("GET", "/latest/meta-data/events/recommendations/rebalance") => ok(200, r#"{"noticeTime": "2026-11-22T18:00:00Z"}"#),
        _ => ok(400, ""),
    });
    let woken = Arc::new(AtomicUsize::new(0));
    let w = Arc::clone(&woken);
    let watch = start(
        "aws",
        &base,
        Some(Box::new(move || {
            w.fetch_add(1, Ordering::SeqCst);
        })),
    );
    let n = watch.wait(Duration::from_secs(5)).expect("a notice");
    assert_eq!(n.deadline, Some(1_795_374_000.0));
    assert_eq!(watch.notice(), Some(n));
    assert_eq!(woken.load(Ordering::SeqCst), 1);
    std::thread::sleep(Duration::from_millis(200));
    let stats = watch.stats();
    assert_eq!((stats.notices, stats.failures, stats.malformed), (1, 0, 0), "{stats:?}");
    assert_eq!(polls.load(Ordering::SeqCst), 4, "polling stops after the notice");
    assert_eq!(watch.rebalance(), Some(1_795_370_400.0));
    assert!(!watch.closed());
    watch.close();
    assert!(watch.closed());
    assert!(watch.wait(Duration::ZERO).is_some(), "the notice is sticky");
}

#[test]
fn gce_watch_long_polls_against_a_fake_server() {
    // maintenance-event: ETag long polls that answer at once with a new
    // ETag (a changing value) until TERMINATE; preempted: always FALSE, no ETag.
    let step = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&step);
    let base = fake_server(move |_, path, head| {
        if !head.contains("Metadata-Flavor: Google\r\n") {
            return ok(403, "");
        }
        if path.starts_with("/computeMetadata/v1/instance/preempted") {
            return ok(200, "FALSE");
        }
        let n = s.fetch_add(1, Ordering::SeqCst);
        let value = if n >= 3 { "TERMINATE_ON_HOST_MAINTENANCE" } else { "NONE" };
        if n > 0 && !path.contains(&format!("wait_for_change=true&last_etag=e{}&", n - 1)) {
            return ok(400, "");
        }
        Reply::Raw(format!("HTTP/1.1 200 OK\r\nETag: e{n}\r\nContent-Length: {}\r\n\r\n{value}", value.len()).into_bytes())
    });
    let watch = start("gce", &base, None);
    let n = watch.wait(Duration::from_secs(5)).expect("a notice");
    assert_eq!(n.description, "GCE maintenance-event TERMINATE_ON_HOST_MAINTENANCE");
    assert_eq!(step.load(Ordering::SeqCst), 4);
    assert_eq!(watch.stats().failures, 0);
    watch.close();
}

#[test]
fn hostile_servers_never_notice_and_close_is_prompt() {
    let kinds: Vec<Box<dyn Fn() -> Reply + Send + Sync>> = vec![
        Box::new(|| ok(500, r#"{"action": "terminate"}"#)),
        Box::new(|| ok(200, "{\"action\": \"terminate\"")),
        Box::new(|| Reply::Raw(b"\x00\xffgarbage\r\n\r\n".to_vec())),
        Box::new(|| Reply::Raw(b"HTTP/1.1 200 OK\r\nContent-Len".to_vec())),
        Box::new(|| Reply::Raw([&b"HTTP/1.1 200 OK\r\n\r\n"[..], &vec![b'{'; 200_000]].concat())),
        Box::new(|| Reply::Hang),
    ];
    let mut watches = Vec::new();
    for kind in kinds {
        let base = fake_server(move |_, _, _| kind());
        for cloud in ["gce", "aws", "azure"] {
            watches.push(start(cloud, &base, None));
        }
    }
    std::thread::sleep(Duration::from_millis(700));
    for (i, w) in watches.iter().enumerate() {
        assert_eq!(w.notice(), None);
        let s = w.stats();
        assert!(s.requests >= 1 && s.failures + s.malformed >= 1 && s.notices == 0, "{i}: {s:?}");
    }
    let start = Instant::now();
    for w in &watches {
        w.close();
    }
    assert!(start.elapsed() < Duration::from_millis(700), "{:?}", start.elapsed());
    let start = Instant::now();
    assert_eq!(watches[0].wait(Duration::from_secs(5)), None, "closed: no waiting");
    assert!(start.elapsed() < Duration::from_millis(50));
}

#[test]
fn close_abandons_a_blocked_request_quickly() {
    let base = fake_server(|_, _, _| Reply::Hang);
    let config = WatchConfig::new("aws", &base, 0.5, 30.0).unwrap();
    let watch = MetadataWatch::start(&config, None).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let start = Instant::now();
    watch.close();
    watch.close();
    assert!(start.elapsed() < Duration::from_millis(400), "{:?}", start.elapsed());
}

#[test]
fn probes() {
    let base = fake_server(|method, path, head| match (method, path) {
        ("GET", "/computeMetadata/v1/instance/hostname") if head.contains("Metadata-Flavor: Google\r\n") => ok(200, "h"),
        ("PUT", "/latest/api/token") => ok(200, "tok"),
        ("GET", "/metadata/instance?api-version=2021-02-01") if head.contains("Metadata: true\r\n") => ok(200, "{}"),
        _ => ok(404, ""),
    });
    let base = BaseUrl::parse(&base).unwrap();
    let second = Duration::from_secs(1);
    for cloud in [Cloud::Gce, Cloud::Aws, Cloud::Azure] {
        assert!(probe(cloud, &base, second, None), "{cloud:?}");
    }
    // IMDSv1: the token PUT is refused, the meta-data root answers.
    let v1 = fake_server(|method, path, _| match (method, path) {
        ("PUT", _) => ok(405, ""),
        ("GET", "/latest/meta-data/") => ok(200, "ami-id"),
        _ => ok(404, ""),
    });
    assert!(probe(Cloud::Aws, &BaseUrl::parse(&v1).unwrap(), second, None));
    // Something else answering: no.
    let other = fake_server(|_, _, _| ok(404, ""));
    let other = BaseUrl::parse(&other).unwrap();
    for cloud in [Cloud::Gce, Cloud::Aws, Cloud::Azure] {
        assert!(!probe(cloud, &other, second, None), "{cloud:?}");
    }
    // Silence: no, within the timeout.
    let silent = BaseUrl::parse(&fake_server(|_, _, _| Reply::Hang)).unwrap();
    let start = Instant::now();
    assert!(!probe(Cloud::Azure, &silent, Duration::from_millis(300), None));
    assert!(start.elapsed() < Duration::from_millis(500));
    // Nobody listening: no.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = BaseUrl::parse(&format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port())).unwrap();
    drop(listener);
    assert!(!probe(Cloud::Gce, &closed, second, None));
}
