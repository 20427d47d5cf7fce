//! The I/O shell against fake metadata servers on 127.0.0.1.

use super::*;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::http::BaseUrl;

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
        Some(Box::new(move |_: &Notice| {
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

#[test]
fn join_waits_for_stopped_threads_and_is_idempotent() {
    let base = fake_server(|_, _, _| Reply::Hang);
    let config = WatchConfig::new("gce", &base, 0.5, 30.0).unwrap();
    let watch = MetadataWatch::start(&config, None).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!watch.join(Duration::from_millis(10)), "still polling: the threads have not ended");
    watch.stop();
    let start = Instant::now();
    // In slices, as the Python binding waits.
    while !watch.join(Duration::from_millis(20)) {
        assert!(start.elapsed() < Duration::from_secs(2), "the threads did not stop");
    }
    assert!(start.elapsed() < Duration::from_millis(600), "{:?}", start.elapsed());
    assert!(watch.join(Duration::ZERO), "joined: every later join returns at once");
    watch.close();
    watch.abandon();
}
