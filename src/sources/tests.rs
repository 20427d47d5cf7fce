//! Tests of `sources`, one file per part: each platform's transitions as
//! tables of steps (`tests/gce.rs`, `tests/aws.rs`, `tests/azure.rs`), the
//! date parsers (`tests/dates.rs`), hostile bytes (`tests/hostile.rs`), and
//! the I/O shell against fake metadata servers on 127.0.0.1
//! (`tests/watch.rs`). The helpers below drive any [`Poller`] by hand.

use super::*;

mod aws;
mod azure;
mod dates;
mod gce;
mod hostile;
mod watch;

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
