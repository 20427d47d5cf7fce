//! The records' schema, each fold rule and malformed input, as tables; a
//! proptest that no input makes reading fail and every whole valid line is used.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::schema::{conforms, kind, Kind, Shape, FIELDS, LATEST, REQUIRED};
use super::*;

/// A valid `exit` line with `changes` applied (`null` removes a field).
fn line(changes: Value) -> Value {
    let mut base = json!({
        "schema": 1, "stage": "exit", "time": 1_700_000_000.0, "job": "worker",
        "task": 0, "preemption": "p", "code": 42,
    });
    for (k, v) in changes.as_object().unwrap() {
        if v.is_null() {
            base.as_object_mut().unwrap().remove(k);
        } else {
            base[k] = v.clone();
        }
    }
    base
}

fn file(lines: &[Value]) -> Vec<u8> {
    lines.iter().map(|l| format!("{l}\n")).collect::<String>().into_bytes()
}

fn read_one(data: &[u8]) -> Records {
    read([("f", Some(data))])
}

#[test]
fn every_kind_accepts_what_python_s_checks_accepted() {
    use Shape::{Bool, Float, Int, Null, Other, Str};
    let inf = f64::INFINITY;
    // (kind, shape, accepted): `FIELDS` of records.py before it moved here.
    let table = [
        (Kind::Int, Int(3.0), true),
        (Kind::Int, Int(-3.0), true),
        (Kind::Int, Int(inf), true), // an integer too large for a float is still one
        (Kind::Int, Float(3.0), false),
        (Kind::Int, Bool, false),
        (Kind::Int, Str, false),
        (Kind::Str, Str, true),
        (Kind::Str, Int(1.0), false),
        (Kind::Str, Other, false),
        (Kind::IntOrStr, Int(0.0), true),
        (Kind::IntOrStr, Str, true),
        (Kind::IntOrStr, Float(0.0), false),
        (Kind::IntOrStr, Bool, false),
        (Kind::IntOrStr, Other, false),
        (Kind::Number, Float(-1.5), true),
        (Kind::Number, Int(7.0), true),
        (Kind::Number, Float(f64::NAN), false),
        (Kind::Number, Float(inf), false),
        (Kind::Number, Int(inf), false),
        (Kind::Number, Bool, false),
        (Kind::Number, Other, false),
        (Kind::NonNegative, Float(0.0), true),
        (Kind::NonNegative, Float(-0.0), true),
        (Kind::NonNegative, Float(-1.0), false),
        (Kind::NonNegative, Str, false),
        (Kind::Time, Float(0.0), true),
        (Kind::Time, Int(1_700_000_000.0), true),
        (Kind::Time, Float(LATEST), true),
        (Kind::Time, Float(LATEST + 1.0), false),
        (Kind::Time, Float(1e300), false),
        (Kind::Time, Int(-5.0), false),
        (Kind::Time, Float(f64::NAN), false),
        (Kind::Time, Bool, false),
        (Kind::Time, Str, false),
    ];
    for (kind, shape, accepted) in table {
        assert_eq!(kind.accepts(shape), accepted, "{kind:?} {shape:?}");
        assert!(kind.accepts(Null), "null is absent: {kind:?}");
    }
}

#[test]
fn the_schema_names_python_s_fields_in_its_order() {
    let names: Vec<&str> = FIELDS.iter().map(|(n, _)| *n).collect();
    assert_eq!(
        names,
        [
            "schema",
            "stage",
            "time",
            "job",
            "task",
            "host",
            "pid",
            "preemption",
            "platform",
            "source",
            "deadline",
            "grace_period",
            "step",
            "proposer",
            "path",
            "code",
            "error",
            "lost",
            "downtime"
        ]
    );
    assert!(REQUIRED.iter().all(|r| kind(r).is_some()));
    assert_eq!(kind("time"), Some(Kind::Time));
    assert_eq!(kind("shiny"), None);
    assert!(!conforms(|_| Shape::Null), "an empty object");
}

/// `BAD_LINES` of tests/unit/test_records.py, and more: each makes the line
/// skipped.
#[test]
fn a_line_of_the_wrong_shape_is_not_used() {
    let bad = [
        json!({"task": [0]}),
        json!({"task": 1.0}),
        json!({"task": true}),
        json!({"time": "x"}),
        json!({"time": 1e300}),
        json!({"time": -5}),
        json!({"time": true}),
        json!({"time": 253_402_300_800_u64}),
        json!({"job": 3}),
        json!({"step": "6"}),
        json!({"step": 6.5}),
        json!({"step": 6.0}),
        json!({"deadline": "soon"}),
        json!({"grace_period": -1}),
        json!({"downtime": [1]}),
        json!({"code": [42]}),
        json!({"code": 4.2}),
        json!({"pid": "1"}),
        json!({"schema": "1"}),
        json!({"source": {"a": 1}}),
        json!({"lost": false}),
    ];
    for change in bad {
        let raw = line(change.clone()).to_string();
        assert_eq!(parse_line(raw.as_bytes()), None, "{change}");
    }
    for missing in REQUIRED {
        let raw = line(json!({ missing: null })).to_string();
        assert_eq!(parse_line(raw.as_bytes()), None, "without {missing}");
        let raw = raw.replacen('{', &format!("{{\"{missing}\":null,"), 1);
        assert_eq!(parse_line(raw.as_bytes()), None, "{missing}: null");
    }
}

#[test]
fn lines_that_are_not_records_are_not_used() {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let cut = line(json!({})).to_string();
    let cases: [&[u8]; 13] = [
        b"[1, 2]",
        b"null",
        b"\"text\"",
        deep.as_bytes(),
        b"\xff\xfe{",
        b"{}",
        b"",
        b"   ",
        &cut.as_bytes()[..cut.len() - 1],
        b"{\"stage\": \"exit\", \"time\": NaN, \"job\": \"w\", \"task\": 0}",
        b"{\"stage\": \"exit\", \"time\": 1, \"job\": \"w\", \"task\": 0, \"x\": Infinity}",
        b"{\"stage\": \"exit\", \"time\": 1, \"job\": \"w\", \"task\": 0, \"x\": 1e400}",
        b"{\"stage\": \"exit\", \"time\": 1, \"job\": \"w\\ud800\", \"task\": 0}",
    ];
    for raw in cases {
        assert_eq!(parse_line(raw), None, "{:?}", String::from_utf8_lossy(raw));
    }
}

#[test]
fn a_valid_line_keeps_its_types_and_its_other_fields() {
    let raw = br#"{"schema": 2, "stage": "exit", "time": 5, "job": "w", "task": "3", "code": "x", "pid": null, "shiny": [1, {"a": null}], "step": 18446744073709551615}"#;
    let l = parse_line(raw).unwrap();
    assert!(l.time.is_u64(), "5 stays an integer");
    assert_eq!(l.task, IntOrStr::Str("3".into()));
    assert_eq!(l.code, Some(IntOrStr::Str("x".into())));
    assert_eq!(l.pid, None, "null is absent");
    assert_eq!(l.step.unwrap().as_u64(), Some(u64::MAX));
    assert_eq!(
        Value::Object(l.extra),
        json!({"shiny": [1, {"a": null}]}),
        "known fields never in extra"
    );
    // A BOM (which Python's json.loads of bytes skips), spaces and a \r around.
    let with_bom = [b"\xef\xbb\xbf".as_slice(), b"  ", line(json!({})).to_string().as_bytes(), b" \r"].concat();
    assert!(parse_line(&with_bom).is_some());
    // The same key twice: the last one, as Python's json.
    let twice = br#"{"stage": "exit", "time": "x", "time": 1.0, "job": "w", "task": 0}"#;
    assert_eq!(parse_line(twice).unwrap().time.as_f64(), Some(1.0));
    assert!(parse_line(br#"{"stage": "exit", "time": -0.0, "job": "w", "task": 0}"#).is_some());
    // The one number read differently from Python: serde_json reads `-0` as
    // the float -0.0 (Python: the integer 0), so a `-0` task is not used.
    // `json.dumps` never writes `-0`.
    assert!(parse_line(br#"{"stage": "exit", "time": 1, "job": "w", "task": -0}"#).is_none());
}

#[test]
fn the_cut_off_last_line_and_each_bad_line_are_counted_by_number() {
    let good = line(json!({})).to_string();
    // (file, skipped line numbers, lines used)
    let table: [(String, Vec<usize>, usize); 8] = [
        (String::new(), vec![], 0),
        ("\n".into(), vec![1], 0),
        (good.clone(), vec![1], 0),
        (format!("{good}\n"), vec![], 1),
        (format!("{good}\n{good}"), vec![2], 1),
        (format!("{good}\ngarbage\n{good}\n"), vec![2], 2),
        (format!("{good}\n\n{good}\n{{\"sta"), vec![2, 4], 2),
        (format!("x\ny\n{good}\n\n"), vec![1, 2, 4], 1),
    ];
    for (data, skipped, used) in table {
        let found: Vec<_> = lines(data.as_bytes()).collect();
        let bad: Vec<usize> = found.iter().filter_map(|r| r.as_ref().err().copied()).collect();
        assert_eq!(bad, skipped, "{data:?}");
        assert_eq!(found.len() - bad.len(), used, "{data:?}");
    }
}

#[test]
fn skipped_lines_are_kept_per_file_and_an_unreadable_file_is_line_0() {
    let good = file(&[line(json!({}))]);
    let found = read([
        ("a", Some(b"x\n".as_slice())),
        ("b", None),
        ("c", Some(good.as_slice())),
        ("a", Some(b"y")),
    ]);
    assert_eq!(found.skipped, vec![("a".to_owned(), vec![1, 1]), ("b".to_owned(), vec![0])]);
    assert_eq!(found.preemptions.len(), 1);
}

#[test]
fn each_stage_folds_into_its_fields() {
    let lines = [
        line(json!({"stage": "save_start", "time": 3.0, "step": null, "host": "h1", "pid": 7, "a": 1})),
        line(
            json!({"stage": "notice", "time": 1.0, "source": "SIGTERM", "platform": "gce", "deadline": 31.0, "grace_period": 30, "host": "h2", "a": 2, "b": 1}),
        ),
        line(json!({"stage": "notice", "time": 1.5, "source": "peer", "deadline": 9.0})),
        line(json!({"stage": "agreement", "time": 2.0, "step": 6, "proposer": "worker 1"})),
        line(json!({"stage": "save_start", "time": 3.5, "step": 7})),
        line(json!({"stage": "save_start", "time": 3.6})),
        line(json!({"stage": "save_end", "time": 4.0, "path": "/c/ckpt-7"})),
        line(json!({"stage": "error", "time": 4.5, "error": "save failed"})),
        line(json!({"stage": "requeue", "time": 4.6, "job_id": "12"})),
        line(json!({"stage": "exit", "time": 5.0, "code": 42})),
    ];
    let found = read_one(&file(&lines));
    let [p] = found.preemptions.as_slice() else { panic!("{found:?}") };
    assert_eq!(
        (p.host.as_deref(), p.pid.as_ref().and_then(Number::as_i64)),
        (Some("h1"), Some(7)),
        "from the first line"
    );
    assert_eq!(p.id.as_deref(), Some("p"));
    let f = |n: &Option<Number>| n.as_ref().and_then(Number::as_f64);
    assert_eq!(f(&p.notice_time), Some(1.0), "the first notice only");
    assert_eq!((p.source.as_deref(), p.platform.as_deref()), (Some("SIGTERM"), Some("gce")));
    assert_eq!((f(&p.deadline), f(&p.grace_period)), (Some(31.0), Some(30.0)));
    assert!(p.grace_period.as_ref().unwrap().is_u64(), "30 stays an integer");
    assert_eq!((f(&p.agreement_time), p.proposer.as_deref()), (Some(2.0), Some("worker 1")));
    assert_eq!(
        f(&p.agreed_step),
        Some(7.0),
        "a save_start with a step overrides, one without does not"
    );
    assert_eq!(f(&p.save_start), Some(3.6), "the last save_start");
    assert_eq!((f(&p.save_end), p.checkpoint_path.as_deref()), (Some(4.0), Some("/c/ckpt-7")));
    assert_eq!(p.error.as_deref(), Some("save failed"));
    assert_eq!(
        (f(&p.exit_time), p.exit_code.as_ref().map(ToString::to_string)),
        (Some(5.0), Some("42".into()))
    );
    assert_eq!(
        Value::Object(p.extra.clone()),
        json!({"a": 2, "b": 1, "job_id": "12"}),
        "later lines win"
    );
    assert!(found.resumes.is_empty() && found.skipped.is_empty());
}

#[test]
fn a_later_line_of_a_stage_overwrites_even_with_nothing() {
    let lines = [
        line(json!({"stage": "agreement", "time": 1.0, "step": 6, "proposer": "worker 1"})),
        line(json!({"stage": "agreement", "time": 2.0})),
        line(json!({"stage": "save_end", "time": 3.0, "path": "/c"})),
        line(json!({"stage": "save_end", "time": 4.0})),
        line(json!({"stage": "error", "time": 5.0, "error": "x"})),
        line(json!({"stage": "error", "time": 6.0})),
        line(json!({"stage": "exit", "time": 7.0, "code": 42})),
        line(json!({"stage": "exit", "time": 8.0, "code": null})),
    ];
    let found = read_one(&file(&lines));
    let p = &found.preemptions[0];
    assert_eq!(
        (p.agreed_step.clone(), p.proposer.clone(), p.checkpoint_path.clone()),
        (None, None, None)
    );
    assert_eq!((p.error.clone(), p.exit_code.clone()), (None, None));
    assert_eq!(p.exit_time.as_ref().and_then(Number::as_f64), Some(8.0));
}

#[test]
fn preemptions_are_keyed_by_job_task_as_text_and_id() {
    let lines = [
        line(json!({"stage": "notice", "time": 1.0, "task": 0})),
        line(json!({"stage": "exit", "time": 2.0, "task": "0"})), // the same task
        line(json!({"stage": "exit", "time": 2.0, "preemption": "q"})),
        line(json!({"stage": "exit", "time": 2.0, "preemption": null})),
        line(json!({"stage": "exit", "time": 2.0, "job": "ps"})),
    ];
    let found = read_one(&file(&lines));
    assert_eq!(found.preemptions.len(), 4);
    let first = found.preemptions.iter().find(|p| p.notice_time.is_some()).unwrap();
    assert_eq!(first.task, IntOrStr::Int(0.into()), "the first line's task");
    assert!(first.exit_time.is_some());
}

#[test]
fn preemptions_sort_by_notice_then_label_and_resumes_by_time_stably() {
    let lines = [
        line(json!({"stage": "exit", "time": 9.0, "job": "b", "preemption": "1"})),
        line(json!({"stage": "notice", "time": 5.0, "job": "z", "preemption": "2"})),
        line(json!({"stage": "notice", "time": 5.0, "job": "a", "preemption": "3"})),
        line(json!({"stage": "exit", "time": 1.0, "job": "a", "preemption": "4"})),
        line(json!({"stage": "notice", "time": 0.0, "job": "a", "preemption": "5"})),
        line(json!({"stage": "notice", "time": -0.0, "job": "a", "preemption": "6"})),
        line(json!({"stage": "resumed", "time": 3.0, "job": "r1"})),
        line(json!({"stage": "resumed", "time": 1, "job": "r2"})),
        line(json!({"stage": "resumed", "time": 1.0, "job": "r3"})),
    ];
    let found = read_one(&file(&lines));
    let order: Vec<&str> = found.preemptions.iter().map(|p| p.id.as_deref().unwrap()).collect();
    // No notice, 0 and -0 are all 0: "a 0" (4, 5, 6 in file order) before "b 0" (1).
    assert_eq!(order, ["4", "5", "6", "1", "3", "2"]);
    let resumes: Vec<&str> = found.resumes.iter().map(|r| r.job.as_str()).collect();
    assert_eq!(resumes, ["r2", "r3", "r1"]);
}

#[test]
fn a_resumed_line_is_a_resume_of_its_own() {
    let l = line(json!({"stage": "resumed", "time": 10.5, "step": 6, "lost": 0, "downtime": 2.5, "host": "h", "zone": "z"}));
    let found = read_one(&file(&[l]));
    assert!(found.preemptions.is_empty());
    let [r] = found.resumes.as_slice() else { panic!() };
    assert_eq!(
        (r.job.as_str(), r.task.to_string(), r.time.as_f64()),
        ("worker", "0".into(), Some(10.5))
    );
    assert_eq!(
        (
            r.step.as_ref().and_then(Number::as_i64),
            r.lost.as_ref().and_then(Number::as_i64),
            r.downtime.as_ref().and_then(Number::as_f64)
        ),
        (Some(6), Some(0), Some(2.5))
    );
    assert_eq!(
        (r.host.as_deref(), Value::Object(r.extra.clone())),
        (Some("h"), json!({"zone": "z"}))
    );
}

#[test]
fn the_last_exit_is_the_task_s_own_latest_not_yet_resumed() {
    let exit = |job: &str, task: Value, id: &str, t: f64| line(json!({"job": job, "task": task, "preemption": id, "time": t}));
    let resumed = |job: &str, t: f64| line(json!({"stage": "resumed", "job": job, "time": t}));
    let notice = |id: &str| line(json!({"stage": "notice", "preemption": id, "time": 1.0}));
    // (lines, job, task, the id of the answer)
    let table: Vec<(Vec<Value>, &str, &str, Option<&str>)> = vec![
        (vec![], "worker", "0", None),
        (vec![notice("a")], "worker", "0", None),
        (vec![exit("worker", json!(0), "a", 10.0)], "worker", "0", Some("a")),
        (vec![exit("worker", json!("0"), "a", 10.0)], "worker", "0", Some("a")),
        (
            vec![exit("worker", json!(0), "a", 10.0), exit("worker", json!(0), "b", 20.0)],
            "worker",
            "0",
            Some("b"),
        ),
        (
            vec![exit("worker", json!(0), "b", 20.0), exit("worker", json!(0), "a", 10.0)],
            "worker",
            "0",
            Some("b"),
        ),
        (
            vec![exit("worker", json!(0), "a", 20.0), exit("worker", json!(0), "b", 20.0)],
            "worker",
            "0",
            Some("a"),
        ),
        (
            vec![exit("worker", json!(0), "a", 10.0), resumed("worker", 10.0)],
            "worker",
            "0",
            None,
        ),
        (
            vec![exit("worker", json!(0), "a", 10.0), resumed("worker", 9.0)],
            "worker",
            "0",
            Some("a"),
        ),
        (
            vec![exit("worker", json!(0), "a", 10.0), resumed("chief", 11.0)],
            "worker",
            "0",
            Some("a"),
        ),
        // A coordinator's file: its worker's exit is not its own.
        (
            vec![exit("chief", json!(0), "c", 100.0), exit("worker", json!(1), "w", 200.0)],
            "chief",
            "0",
            Some("c"),
        ),
        (vec![exit("worker", json!(1), "w", 200.0)], "chief", "0", None),
        (vec![exit("worker", json!(1), "w", 200.0)], "worker", "0", None),
    ];
    for (lines, job, task, expected) in table {
        let found = read_one(&file(&lines));
        let got = last_exit(&found, job, task).and_then(|p| p.id.as_deref());
        assert_eq!(got, expected, "{job} {task} in {lines:?}");
    }
}

#[test]
fn a_preemption_is_claimed_once() {
    let mut claims = Claims::new();
    assert!(claims.claim("/r", "worker", "0", Some("a")));
    assert!(!claims.claim("/r", "worker", "0", Some("a")));
    assert!(claims.claim("/r", "worker", "0", None));
    assert!(!claims.claim("/r", "worker", "0", None));
    assert!(claims.claim("/r", "worker", "1", Some("a")));
    assert!(claims.claim("/s", "worker", "0", Some("a")));
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        (0.0..LATEST * 1.1).prop_map(Value::from),
        "[a-z0-9 ]{0,4}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,3}", inner, 0..3).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_line() -> impl Strategy<Value = Vec<u8>> {
    let names: Vec<&str> = FIELDS.iter().map(|(n, _)| *n).chain(["extra_field"]).collect();
    let object = prop::collection::btree_map(prop::sample::select(names), arb_value(), 0..10).prop_map(|m| {
        let mut o: serde_json::Map<String, Value> = m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        o.entry("stage").or_insert_with(|| json!("exit"));
        serde_json::to_vec(&Value::Object(o)).unwrap()
    });
    prop_oneof![3 => object, 1 => prop::collection::vec(any::<u8>(), 0..40).prop_map(|mut b| { b.retain(|c| *c != b'\n'); b })]
}

proptest! {
    /// Any bytes: reading never fails; each whole line is used exactly when it
    /// is a JSON object that conforms to the schema, and counted otherwise; a
    /// non-empty part after the last newline is counted too.
    #[test]
    fn every_line_is_used_or_counted(raw in prop::collection::vec(arb_line(), 0..12), cut in any::<bool>()) {
        let mut data = raw.join(&b'\n');
        let (whole, tail): (Vec<&[u8]>, &[u8]) = if cut {
            match raw.split_last() {
                Some((last, rest)) => (rest.iter().map(Vec::as_slice).collect(), last),
                None => (vec![], b""),
            }
        } else {
            data.push(b'\n');
            let whole = if raw.is_empty() { vec![b"".as_slice()] } else { raw.iter().map(Vec::as_slice).collect() };
            (whole, b"")
        };
        let conforming = whole.iter().filter(|l| {
            matches!(serde_json::from_slice::<Value>(l), Ok(Value::Object(m)) if conforms(|n| Shape::of(m.get(n))))
        }).count();
        let (used, bad): (Vec<_>, Vec<_>) = lines(&data).partition(Result::is_ok);
        prop_assert_eq!(used.len(), conforming);
        prop_assert_eq!(bad.len(), whole.len() - conforming + usize::from(!tail.is_empty()));
        let found = read_one(&data);
        prop_assert_eq!(found.skipped.first().map_or(0, |(_, n)| n.len()), bad.len());
        prop_assert!(found.preemptions.len() + found.resumes.len() <= used.len());
    }
}

proptest! {
    /// A time reads back as the float Python wrote (`repr`, the shortest form
    /// that round-trips): serde_json's `float_roundtrip`.
    #[test]
    fn a_time_reads_back_exactly(t in 0.0..LATEST) {
        let raw = format!(r#"{{"stage": "exit", "time": {t:?}, "job": "w", "task": 0}}"#);
        prop_assert_eq!(parse_line(raw.as_bytes()).unwrap().time.as_f64(), Some(t));
    }
}

#[test]
fn a_task_s_preemption_joins_the_one_before_until_it_ended_or_within_the_window() {
    // (t, first, end, same)
    let rows: [(f64, f64, Option<f64>, bool); 6] = [
        (150.0, 100.0, Some(200.0), true),
        (200.0, 100.0, Some(200.0), true),
        (200.5, 100.0, Some(200.0), false),
        // No exit yet: the window from the first notice.
        (100.0 + REPORT_GROUP_WINDOW, 100.0, None, true),
        (100.5 + REPORT_GROUP_WINDOW, 100.0, None, false),
        // An end binds even past the window.
        (5000.0, 100.0, Some(6000.0), true),
    ];
    for (t, first, end, same) in rows {
        assert_eq!(same_preemption(t, first, end), same, "{t} {first} {end:?}");
    }
}

#[test]
fn the_json_for_python_keeps_each_number_s_kind_and_the_files_order() {
    let data = file(&[
        line(json!({"stage": "notice", "time": 1_700_000_000.5, "deadline": 1_700_000_030, "task": "1", "x": {"n": [1, 2.0]}})),
        line(json!({"stage": "resumed", "time": 1_700_000_100, "step": 7, "downtime": 99.5})),
    ]);
    let found = read([("b", Some(&data[..])), ("a", None)]);
    let back: Value = serde_json::from_str(&found.to_json()).unwrap();
    let p = &back["preemptions"][0];
    assert_eq!(p["task"], json!("1"), "a task written as text stays text");
    assert_eq!(p["notice_time"], json!(1_700_000_000.5));
    assert!(p["deadline"].is_u64(), "an integer stays an integer");
    assert_eq!(p["extra"], json!({"x": {"n": [1, 2.0]}}));
    assert!(p["extra"]["x"]["n"][1].is_f64(), "2.0 stays a float");
    assert_eq!(p["exit_code"], Value::Null);
    let r = &back["resumes"][0];
    assert!(r["time"].is_u64());
    assert_eq!((r["step"].clone(), r["downtime"].clone()), (json!(7), json!(99.5)));
    assert_eq!(back["skipped"], json!([["a", [0]]]), "pairs, in the order read");
    let only = last_exit(&found, "worker", "1").map(Preemption::to_json);
    assert_eq!(only, None, "resumed at or after its exit (it has none)");
    assert_eq!(downtime(1_700_000_100.0, 1_700_000_040.0), 60.0);
}

#[test]
fn preemptions_group_into_cluster_wide_ones_by_notice_and_last_exit() {
    let at = |task: u64, stage: &str, t: f64| line(json!({"stage": stage, "time": t, "task": task, "preemption": format!("p{task}")}));
    let data = file(&[
        at(0, "notice", 100.0),
        at(0, "exit", 150.0),
        at(1, "save_start", 140.0), // no notice: its save's start, before the end
        at(2, "notice", 151.0),     // after the last exit: a new one
        at(3, "notice", 160.0),     // none of the new one exited: within the window
    ]);
    let found = read_one(&data);
    assert_eq!(groups(&found), vec![vec![0, 1], vec![2, 3]]);
    assert_eq!(groups(&Records::default()), Vec::<Vec<usize>>::new());
}
