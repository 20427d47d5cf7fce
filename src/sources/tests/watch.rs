//! The I/O shell against fake metadata servers on 127.0.0.1.

use super::*;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use crate::sources::http::BaseUrl;

/// Far above anything these tests wait for: it only turns a wait that never
/// ends into a failure that says what it was waiting for. How fast a watch
/// fails, closes or probes is not checked here (that is a bench figure).
const HANG_BOUND: Duration = Duration::from_secs(30);

/// A request timeout beyond [`HANG_BOUND`]: a request to a silent server
/// ends within the bound only if the stop flag abandons it.
const BEYOND_THE_BOUND: f64 = 600.0;

/// Waits until `cond` holds; fails naming `what` after [`HANG_BOUND`].
fn until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG_BOUND, "{what}: not after {HANG_BOUND:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Runs `f` on a thread; its result, or a failure naming `what` if it has
/// not returned within [`HANG_BOUND`].
fn returns<R: Send + 'static>(what: &str, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(HANG_BOUND) {
        Ok(r) => r,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} had not returned after {HANG_BOUND:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// How a fake server answers one request.
enum Reply {
    /// These bytes, then close.
    Raw(Vec<u8>),
    /// Accept and never answer: the connection stays open until the client
    /// hangs up (so only the client's deadline or stop flag ends the request).
    Hang,
}

/// What a fake server saw of the requests it answered with [`Reply::Hang`].
#[derive(Default)]
struct Held {
    /// Requests held so far.
    started: AtomicUsize,
    /// Of those, the ones whose client has hung up.
    ended: AtomicUsize,
}

fn ok(status: u16, body: &str) -> Reply {
    Reply::Raw(format!("HTTP/1.1 {status} X\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes())
}

/// A fake metadata server on 127.0.0.1: `route(method, path, head)` answers
/// each request. Returns its base URL and what it saw of held requests.
fn fake_server(route: impl Fn(&str, &str, &str) -> Reply + Send + Sync + 'static) -> (String, Arc<Held>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
    let route = Arc::new(route);
    let held = Arc::new(Held::default());
    let seen = Arc::clone(&held);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let route = Arc::clone(&route);
            let held = Arc::clone(&held);
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
                        held.started.fetch_add(1, Ordering::SeqCst);
                        // The client sends nothing more: the read ends when it hangs up.
                        while matches!(stream.read(&mut byte), Ok(n) if n > 0) {}
                        held.ended.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    (base, seen)
}

/// A request timeout no answer of a fake server that answers comes near, on a
/// loaded machine too: a test that counts no failure must not count a slow
/// answer as one (CI's loaded `make test` once saw an answer come after 0.5 s).
const PATIENT: f64 = 10.0;

/// The request timeout of the hostile servers' watches: a silent server's
/// request fails at it, well within [`HANG_BOUND`].
const IMPATIENT: f64 = 0.5;

fn start(cloud: &str, base: &str, wake: Option<Wake>) -> MetadataWatch {
    start_with(cloud, base, wake, PATIENT)
}

fn start_with(cloud: &str, base: &str, wake: Option<Wake>, timeout: f64) -> MetadataWatch {
    let config = WatchConfig::new(cloud, base, 0.05, timeout).unwrap();
    MetadataWatch::start(&config, wake).unwrap()
}

#[test]
fn aws_watch_sees_a_notice_wakes_once_and_polls_on() {
    let polls = Arc::new(AtomicUsize::new(0));
    let p = Arc::clone(&polls);
    let (base, _) = fake_server(move |method, path, head| match (method, path) {
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
    let n = watch.wait(HANG_BOUND).expect("a notice");
    assert_eq!(n.deadline, Some(1_795_374_000.0));
    assert_eq!(watch.notice(), Some(n));
    assert_eq!(woken.load(Ordering::SeqCst), 1);
    // Polling goes on after the notice (a later one may end earlier); the same
    // notice again wakes nobody.
    until("two more polls after the notice", || polls.load(Ordering::SeqCst) >= 6);
    assert_eq!(woken.load(Ordering::SeqCst), 1);
    let stats = watch.stats();
    assert_eq!((stats.notices, stats.failures, stats.malformed), (1, 0, 0), "{stats:?}");
    assert_eq!(watch.rebalance(), Some(1_795_370_400.0));
    assert!(!watch.closed());
    watch.close();
    assert!(watch.closed());
    assert!(watch.join(HANG_BOUND), "the polling thread did not end at close");
    assert!(watch.wait(Duration::ZERO).is_some(), "the notice is sticky");
}

#[test]
fn gce_maintenance_then_preempted_wakes_twice_and_the_earlier_deadline_is_kept() {
    // maintenance-event TERMINATE at once (no deadline: the grace period's);
    // preempted turns TRUE a few polls later (GCE's 30 s): a second wake-up.
    let polls = Arc::new(AtomicUsize::new(0));
    let p = Arc::clone(&polls);
    let woken: Arc<Mutex<Vec<Notice>>> = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&woken);
    let (base, _) = fake_server(move |_, path, head| {
        if !head.contains("Metadata-Flavor: Google\r\n") {
            return ok(403, "");
        }
        if path.starts_with("/computeMetadata/v1/instance/preempted") {
            let n = p.fetch_add(1, Ordering::SeqCst);
            // TRUE only once the maintenance event has woken the handler: the
            // order of the two notices is the test's, not the threads'.
            let maintenance_seen = !seen.lock().is_empty();
            return ok(200, if n >= 3 && maintenance_seen { "TRUE" } else { "FALSE" });
        }
        ok(200, "TERMINATE_ON_HOST_MAINTENANCE")
    });
    let w = Arc::clone(&woken);
    let watch = start(
        "gce",
        &base,
        Some(Box::new(move |n: &Notice| {
            w.lock().push(n.clone());
        })),
    );
    until("both notices woke the handler", || woken.lock().len() >= 2);
    let seen = woken.lock().clone();
    assert_eq!(seen[0].description, "GCE maintenance-event TERMINATE_ON_HOST_MAINTENANCE");
    assert_eq!(seen[0].deadline, None);
    assert_eq!(seen[1].description, "GCE preempted");
    assert!(seen[1].deadline.is_some());
    assert_eq!(watch.notice(), Some(seen[1].clone()), "the earliest deadline is kept");
    until("more polls after the second notice", || polls.load(Ordering::SeqCst) >= 6);
    assert_eq!(woken.lock().len(), 2, "a notice no earlier than the kept one wakes nobody");
    watch.close();
    assert!(watch.join(HANG_BOUND));
}

#[test]
fn gce_watch_long_polls_against_a_fake_server() {
    // maintenance-event: ETag long polls that answer at once with a new
    // ETag (a changing value) until TERMINATE; preempted: always FALSE, no ETag.
    let step = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&step);
    let (base, _) = fake_server(move |_, path, head| {
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
    let n = watch.wait(HANG_BOUND).expect("a notice");
    assert_eq!(n.description, "GCE maintenance-event TERMINATE_ON_HOST_MAINTENANCE");
    // The notice came with the fourth answer; polling goes on after it (a later
    // notice may end earlier), so more answers may follow by now.
    assert!(step.load(Ordering::SeqCst) >= 4);
    assert_eq!(watch.stats().failures, 0);
    watch.close();
}

#[test]
fn hostile_servers_never_notice_and_close_ends_the_threads() {
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
        let (base, _) = fake_server(move |_, _, _| kind());
        for cloud in ["gce", "aws", "azure"] {
            watches.push(start_with(cloud, &base, None, IMPATIENT));
        }
    }
    // Each watch has failed at least once (a silent server's request only at
    // its IMPATIENT timeout), and none took anything for a notice.
    for (i, w) in watches.iter().enumerate() {
        until(&format!("watch {i} counts a failure"), || {
            let s = w.stats();
            s.failures + s.malformed >= 1
        });
        assert_eq!(w.notice(), None);
        let s = w.stats();
        assert!(s.requests >= 1 && s.notices == 0, "{i}: {s:?}");
    }
    // Stopped, every polling thread ends (none is left blocked): the join
    // that `close` makes succeeds instead of abandoning them.
    for w in &watches {
        w.stop();
    }
    for (i, w) in watches.iter().enumerate() {
        assert!(w.join(HANG_BOUND), "watch {i}: the polling threads did not end after stop");
        w.close();
        assert!(w.closed());
    }
    let w = watches.swap_remove(0);
    let r = returns("wait() on a closed watch", move || w.wait(Duration::from_secs(3600)));
    assert_eq!(r, None, "closed: no waiting");
}

#[test]
fn close_abandons_a_blocked_request() {
    let (base, held) = fake_server(|_, _, _| Reply::Hang);
    let config = WatchConfig::new("aws", &base, 0.5, BEYOND_THE_BOUND).unwrap();
    let watch = MetadataWatch::start(&config, None).unwrap();
    until("the watch's first request reaches the silent server", || {
        held.started.load(Ordering::SeqCst) >= 1
    });
    watch.close();
    watch.close();
    assert!(watch.closed());
    // Its request's own timeout is beyond the bound: only the stop flag
    // can have ended it (a thread close left blocked would still hold it).
    until("the blocked request is abandoned (the server sees the client hang up)", || {
        held.ended.load(Ordering::SeqCst) == held.started.load(Ordering::SeqCst)
    });
}

#[test]
fn probes() {
    let (base, _) = fake_server(|method, path, head| match (method, path) {
        ("GET", "/computeMetadata/v1/instance/hostname") if head.contains("Metadata-Flavor: Google\r\n") => ok(200, "h"),
        ("PUT", "/latest/api/token") => ok(200, "tok"),
        ("GET", "/metadata/instance?api-version=2021-02-01") if head.contains("Metadata: true\r\n") => ok(200, "{}"),
        _ => ok(404, ""),
    });
    let base = BaseUrl::parse(&base).unwrap();
    let second = Duration::from_secs(1);
    for cloud in Cloud::all() {
        assert!(probe(cloud, &base, second, None), "{cloud:?}");
    }
    // IMDSv1: the token PUT is refused, the meta-data root answers.
    let (v1, _) = fake_server(|method, path, _| match (method, path) {
        ("PUT", _) => ok(405, ""),
        ("GET", "/latest/meta-data/") => ok(200, "ami-id"),
        _ => ok(404, ""),
    });
    assert!(probe(Cloud::Aws, &BaseUrl::parse(&v1).unwrap(), second, None));
    // Something else answering: no.
    let (other, _) = fake_server(|_, _, _| ok(404, ""));
    let other = BaseUrl::parse(&other).unwrap();
    for cloud in Cloud::all() {
        assert!(!probe(cloud, &other, second, None), "{cloud:?}");
    }
    // Silence: no, at the timeout (the server holds the connection open, so
    // only the probe's deadline ends it), not before.
    let (silent, _) = fake_server(|_, _, _| Reply::Hang);
    let silent = BaseUrl::parse(&silent).unwrap();
    let start = Instant::now();
    let found = returns("a probe of a silent server (timeout 300 ms)", move || {
        probe(Cloud::Azure, &silent, Duration::from_millis(300), None)
    });
    let took = start.elapsed();
    assert!(!found);
    assert!(took >= Duration::from_millis(300), "gave up before its timeout: {took:?}");
    // Nobody listening: no.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = BaseUrl::parse(&format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port())).unwrap();
    drop(listener);
    assert!(!probe(Cloud::Gce, &closed, second, None));
}

#[test]
fn tfs_gce_termination_watcher() {
    // (maintenance-event's status and body, what the watcher says)
    let rows = [
        (200, "TERMINATE_ON_HOST_MAINTENANCE", true),
        (200, "NONE", false),
        (200, "MIGRATE_ON_HOST_MAINTENANCE", false),
        (200, "terminate_on_host_maintenance", false),
        (200, "", false),
        (503, "TERMINATE_ON_HOST_MAINTENANCE", false),
    ];
    for (status, body, terminating) in rows {
        let (base, _) = fake_server(move |method, path, head| match (method, path) {
            ("GET", "/computeMetadata/v1/instance/maintenance-event") if head.contains("Metadata-Flavor: Google\r\n") => ok(status, body),
            _ => ok(404, ""),
        });
        let base = BaseUrl::parse(&base).unwrap();
        assert_eq!(gce_terminating(&base, Duration::from_secs(1), None), terminating, "{status} {body}");
    }
    let (silent, _) = fake_server(|_, _, _| Reply::Hang);
    let silent = BaseUrl::parse(&silent).unwrap();
    let found = returns("the watcher against a silent server (timeout 300 ms)", move || {
        gce_terminating(&silent, Duration::from_millis(300), None)
    });
    assert!(!found);
}

#[test]
fn join_waits_for_stopped_threads_and_is_idempotent() {
    let (base, held) = fake_server(|_, _, _| Reply::Hang);
    let config = WatchConfig::new("gce", &base, 0.5, BEYOND_THE_BOUND).unwrap();
    let watch = MetadataWatch::start(&config, None).unwrap();
    // GCE polls two endpoints, each on its own thread: both blocked in a request.
    until("both polling threads' requests reach the silent server", || {
        held.started.load(Ordering::SeqCst) >= 2
    });
    assert!(!watch.join(Duration::from_millis(10)), "still polling: the threads have not ended");
    watch.stop();
    let start = Instant::now();
    // In slices, as the Python binding waits; the requests' own timeout is
    // beyond the bound, so only the stop flag can end them within it.
    while !watch.join(Duration::from_millis(20)) {
        assert!(start.elapsed() < HANG_BOUND, "the threads did not stop after {HANG_BOUND:?}");
    }
    assert!(watch.join(Duration::ZERO), "joined: every later join returns at once");
    watch.close();
    watch.abandon();
}

#[test]
fn a_probing_answers_in_slices_and_a_stopped_one_ends() {
    let (base, _) = fake_server(|method, path, head| match (method, path) {
        ("GET", "/computeMetadata/v1/instance/hostname") if head.contains("Metadata-Flavor: Google\r\n") => ok(200, "h"),
        _ => ok(404, ""),
    });
    let base = BaseUrl::parse(&base).unwrap();
    let mut probing = Probing::start(Cloud::Gce, base.clone(), HANG_BOUND, false).unwrap();
    let start = Instant::now();
    let found = loop {
        if let Some(found) = probing.answer(Duration::from_millis(10)) {
            break found;
        }
        assert!(start.elapsed() < HANG_BOUND, "no answer after {HANG_BOUND:?}");
    };
    assert!(found, "GCE answered as GCE");
    probing.stop(); // after the answer: nothing left to wait for

    // A silent server and a request timeout beyond the bound: only the stop ends it.
    let (silent, _) = fake_server(|_, _, _| Reply::Hang);
    let silent = BaseUrl::parse(&silent).unwrap();
    let mut probing = Probing::start(Cloud::Azure, silent, Duration::from_secs_f64(BEYOND_THE_BOUND), false).unwrap();
    assert_eq!(
        probing.answer(Duration::from_millis(50)),
        None,
        "a silent server gives no answer yet"
    );
    returns("a stopped probe of a silent server", move || probing.stop());
}
