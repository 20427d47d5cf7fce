//! Azure's transitions, as tables of steps.

use super::*;

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
