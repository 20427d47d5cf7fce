//! The inbox's contract: order, deadlines, stop, posters gone, bounds.

use std::time::{Duration, Instant};

use super::*;

fn notice(source: &str) -> Input {
    Input::Notice {
        source: Some(source.to_owned()),
        signal: None,
        at: 1.0,
        deadline: None,
        kill: None,
    }
}

fn key(round: Round, value: &str) -> Input {
    Input::StepKey {
        round,
        value: value.to_owned(),
    }
}

/// Generous: only turns a lost wake-up into a failure.
const HANG: Duration = Duration::from_secs(30);

fn soon() -> Option<Instant> {
    Some(Instant::now() + HANG)
}

#[test]
fn each_kind_is_first_in_first_out_and_step_keys_come_before_notices() {
    let (inbox, poster) = Inbox::new();
    poster.post(notice("first")).unwrap();
    poster.post(notice("second")).unwrap();
    poster.post(key(Round::Initial, "7")).unwrap();
    poster.post(Input::KeyReadFailed { round: Round::Final }).unwrap();
    poster.notice(Origin::Signal(15), 2.0, Some(3.0), None).unwrap();
    let order: Vec<Input> = (0..5).map(|_| inbox.recv_deadline(soon()).unwrap()).collect();
    assert_eq!(
        order,
        vec![
            key(Round::Initial, "7"),
            Input::KeyReadFailed { round: Round::Final },
            notice("first"),
            notice("second"),
            Input::Notice {
                source: None,
                signal: Some(15),
                at: 2.0,
                deadline: Some(3.0),
                kill: None,
            },
        ]
    );
}

#[test]
fn a_deadline_ends_an_empty_wait_and_never_beats_a_queued_input() {
    let (inbox, poster) = Inbox::new();
    let start = Instant::now();
    let deadline = start + Duration::from_millis(50);
    assert_eq!(inbox.recv_deadline(Some(deadline)), Err(RecvError::Timeout));
    assert!(Instant::now() >= deadline, "returned before its deadline");
    // A deadline already passed: an empty inbox answers at once...
    assert_eq!(inbox.recv_deadline(Some(start)), Err(RecvError::Timeout));
    assert_eq!(inbox.recv_timeout(Duration::ZERO), Err(RecvError::Timeout));
    // ...and a queued input still wins over it.
    poster.post(notice("late")).unwrap();
    assert_eq!(inbox.recv_deadline(Some(start)), Ok(notice("late")));
}

#[test]
fn an_input_from_another_thread_wakes_a_blocked_receive() {
    let (inbox, poster) = Inbox::new();
    let posting = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        poster.post(key(Round::Final, "9")).unwrap();
        poster
    });
    // No deadline: only the post can end this wait.
    assert_eq!(inbox.recv_deadline(None), Ok(key(Round::Final, "9")));
    drop(posting.join().unwrap());
}

#[test]
fn stop_wins_over_queued_inputs_is_sticky_and_refuses_posts() {
    let (inbox, poster) = Inbox::new();
    poster.post(notice("queued")).unwrap();
    poster.post(key(Round::Initial, "3")).unwrap();
    assert!(!inbox.stopped());
    inbox.stop();
    inbox.stop(); // idempotent
    assert!(inbox.stopped());
    for _ in 0..3 {
        assert_eq!(inbox.recv_deadline(Some(Instant::now())), Ok(Input::Stop {}));
    }
    assert_eq!(poster.post(notice("after")), Err(PostError::Stopped));
    // What arrived before the stop is still there for a last look.
    assert_eq!(inbox.drain(), vec![key(Round::Initial, "3"), notice("queued")]);
    assert_eq!(inbox.drain(), vec![]);
    assert_eq!(inbox.recv_deadline(None), Ok(Input::Stop {}));
}

#[test]
fn stop_wakes_every_blocked_receive_and_a_poster_can_post_it() {
    let (inbox, poster) = Inbox::new();
    let inbox = Arc::new(inbox);
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let inbox = Arc::clone(&inbox);
            std::thread::spawn(move || inbox.recv_deadline(soon()))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(20));
    // `close()` posts Stop through the same handle every source has.
    poster.post(Input::Stop {}).unwrap();
    for w in waiters {
        assert_eq!(w.join().unwrap(), Ok(Input::Stop {}));
    }
    assert!(inbox.stopped());
}

#[test]
fn with_every_poster_gone_the_queue_drains_then_reports_disconnected() {
    let (inbox, poster) = Inbox::new();
    let second = poster.clone();
    poster.post(notice("kept")).unwrap();
    second.post(key(Round::Initial, "4")).unwrap();
    drop(poster);
    assert_eq!(inbox.recv_deadline(soon()), Ok(key(Round::Initial, "4")), "one poster is left");
    drop(second);
    assert_eq!(
        inbox.recv_deadline(soon()),
        Ok(notice("kept")),
        "queued inputs outlive their posters"
    );
    let start = Instant::now();
    assert_eq!(inbox.recv_deadline(None), Err(RecvError::Disconnected));
    assert_eq!(inbox.recv_deadline(soon()), Err(RecvError::Disconnected));
    assert!(start.elapsed() < HANG, "a disconnected inbox must not wait");
}

#[test]
fn a_poster_outliving_its_inbox_reports_disconnected() {
    let (inbox, poster) = Inbox::new();
    drop(inbox);
    assert_eq!(poster.post(notice("nobody")), Err(PostError::Disconnected));
    assert_eq!(poster.post(key(Round::Initial, "1")), Err(PostError::Disconnected));
}

#[test]
fn notices_beyond_the_capacity_are_dropped_and_counted_but_step_keys_never() {
    let (inbox, poster) = Inbox::new();
    for i in 0..NOTICE_CAPACITY {
        poster.post(notice(&i.to_string())).unwrap();
    }
    assert_eq!(poster.post(notice("one too many")), Err(PostError::Full));
    assert_eq!(inbox.dropped_notices(), 1);
    poster.post(key(Round::Initial, "5")).unwrap();
    assert_eq!(
        inbox.recv_deadline(soon()),
        Ok(key(Round::Initial, "5")),
        "a step key is never dropped"
    );
    assert_eq!(inbox.recv_deadline(soon()), Ok(notice("0")));
    poster.post(notice("room again")).unwrap();
}
