//! AWS's transitions, as tables of steps.

use super::*;

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
