//! The protocol object's own rules: its configuration, the step timing and
//! every bound it works out from the resolver and the planner.

use super::*;
use crate::grace::EXIT_RESERVE;
use crate::retry::{MIN_BOUND_BEFORE_DEADLINE, TRANSIENT_FAILURE_WINDOW};
use crate::step_resolution::{write_timeout, WriteBound, DEFAULT_PEER_TIMEOUT, LAST_RUN_TO_CHECKPOINT, RUN_TO_CHECKPOINT};
use crate::writes::Kind;

/// The peer timeout of the protocols these tests configure.
const PEER: f64 = 100.0;

/// A deterministic MWMS cluster of protocols and the properties its runs keep.
mod cluster;
/// The "Failures" table of `crate::step_resolution`, run on that cluster.
mod failures;

fn local(grace_period: f64) -> Protocol {
    let mut p = Protocol::new();
    p.configure(Config {
        worker_id: None,
        num_workers: 1,
        grace_period,
        save_at_current_run: false,
        peer_timeout: PEER,
    })
    .unwrap();
    p
}

/// Worker 1 of a cluster of 2, configured.
fn worker_1_of_2(grace_period: f64) -> Protocol {
    let mut p = Protocol::new();
    p.configure(Config {
        worker_id: Some(1),
        num_workers: 2,
        grace_period,
        save_at_current_run: false,
        peer_timeout: PEER,
    })
    .unwrap();
    p
}

fn notice(at: f64, deadline: Option<f64>) -> Notice {
    Notice::stated(at, deadline)
}

#[test]
fn configuration_table() {
    // (worker_id, num_workers, grace_period, accepted)
    type Row = (Option<u32>, u32, f64, Result<(), ConfigError>);
    let rows: &[Row] = &[
        (None, 1, 0.0, Ok(())),
        (None, 0, 30.0, Ok(())),
        (Some(0), 2, 0.0, Ok(())),
        (Some(1), 2, 3600.0, Ok(())),
        (Some(2), 2, 0.0, Err(ConfigError::WorkerId { id: 2, num_workers: 2 })),
        (Some(0), 0, 0.0, Err(ConfigError::WorkerId { id: 0, num_workers: 0 })),
        (None, 1, -1.0, Err(ConfigError::GracePeriod(-1.0))),
        (None, 1, f64::INFINITY, Err(ConfigError::GracePeriod(f64::INFINITY))),
    ];
    for &(worker_id, num_workers, grace_period, ref want) in rows {
        let mut p = Protocol::new();
        let got = p.configure(Config {
            worker_id,
            num_workers,
            grace_period,
            save_at_current_run: false,
            peer_timeout: PEER,
        });
        assert_eq!(&got, want, "{worker_id:?} of {num_workers}, grace {grace_period}");
        assert_eq!(p.resolver().is_some(), got.is_ok());
    }
    let mut p = Protocol::new();
    let nan = p.configure(Config {
        worker_id: None,
        num_workers: 1,
        grace_period: f64::NAN,
        save_at_current_run: false,
        peer_timeout: PEER,
    });
    assert!(matches!(nan, Err(ConfigError::GracePeriod(g)) if g.is_nan()));
}

#[test]
fn before_configure_every_event_is_refused_and_every_bound_says_none() {
    let mut p = Protocol::new();
    assert_eq!(p.handle_notice(notice(0.0, None)), Err(ConfigError::NotConfigured));
    assert_eq!(p.handle_claim(true), Err(ConfigError::NotConfigured));
    assert_eq!(p.before_step(0, 0.0), Err(ConfigError::NotConfigured));
    assert_eq!(p.handle_save_failed(false), Err(ConfigError::NotConfigured));
    let mut q = local(0.0);
    assert_eq!(q.handle_save_failed(false), Ok(SaveFailed::Raise));
    assert_eq!(q.handle_save_failed(true), Ok(SaveFailed::ExitUnmerged), "a save in shares");
    assert_eq!(p.shutdown_keys(), Err(ConfigError::NotConfigured));
    assert!(!p.needs_attention());
    assert!(!p.leading());
    assert_eq!(p.notice_deadline(), None);
    assert_eq!(p.fit(0.0), None);
    assert_eq!(p.drain_bound(0.0), DEFAULT_PEER_TIMEOUT);
    assert_eq!(p.retry_bound(0.0), crate::retry::bound(DEFAULT_PEER_TIMEOUT, None, 0.0));
    assert_eq!(p.set_peer_timeout(-1.0), Err(ConfigError::PeerTimeout(-1.0)));
    p.set_peer_timeout(7.0).unwrap();
    assert_eq!((p.peer_timeout(), p.drain_bound(0.0)), (7.0, 7.0));
    assert_eq!(p.snapshot().resolver, None);
    // The planner's measures are taken before: a restore, the exit reserve.
    p.handle_restored(2.0);
    assert_eq!(p.set_exit_reserve(-1.0), Err(ConfigError::ExitReserve(-1.0)));
    p.set_exit_reserve(3.0).unwrap();
    assert_eq!(p.exit_reserve(), 3.0);
}

#[test]
fn the_first_step_interval_is_warm_up_and_a_failed_step_is_no_sample() {
    let mut p = local(0.0);
    // (event, samples after it)
    p.step_started(10.0);
    assert_eq!(p.snapshot().step_samples, 0);
    p.step_started(15.0); // warm-up interval: 5 s of tracing, discarded
    assert_eq!(p.snapshot().step_samples, 0);
    p.step_started(15.5);
    p.step_started(16.0);
    assert_eq!(p.snapshot().step_samples, 2);
    assert!((p.snapshot().step_estimate - 0.5).abs() < 1e-9);
    p.step_failed();
    p.step_started(100.0); // after a failure: a new start, no interval
    assert_eq!(p.snapshot().step_samples, 2);
    // The checks before a step are no part of it.
    p.checks_done(130.0);
    p.step_started(130.5);
    assert_eq!(p.snapshot().step_samples, 3);
    assert!((p.snapshot().step_estimate - 0.5).abs() < 1e-9);
}

#[test]
fn notice_and_kill_deadline_table() {
    // For a notice at 100: (grace period, the notice's own deadline, the kill its
    // platform stated, when the saves must be done (notice_deadline), when the
    // platform kills (kill_deadline)).
    type Row = (f64, Option<f64>, Option<f64>, Option<f64>, Option<f64>);
    let rows: &[Row] = &[
        (0.0, None, None, None, None),                              // no time named
        (0.0, Some(130.0), Some(130.0), Some(130.0), Some(130.0)),  // the platform's
        (60.0, None, None, Some(160.0), None),                      // the grace period's end: no kill named
        (60.0, Some(130.0), Some(130.0), Some(130.0), Some(130.0)), // the earlier
        (60.0, Some(200.0), Some(200.0), Some(160.0), Some(200.0)), // the kill, though the saves end by 160
        // An assumed deadline (Kubernetes without the pod's grace period): planned
        // against, never a kill.
        (0.0, Some(130.0), None, Some(130.0), None),
        // SLURM's time limit: the saves by the job's end, the kill KillWait later.
        (0.0, Some(130.0), Some(160.0), Some(130.0), Some(160.0)),
    ];
    for &(grace, deadline, kill, saves_by, killed) in rows {
        let mut p = local(grace);
        assert_eq!((p.notice_deadline(), p.kill_deadline()), (None, None));
        p.handle_notice(Notice { at: 100.0, deadline, kill }).unwrap();
        let what = format!("grace {grace}, deadline {deadline:?}, kill {kill:?}");
        assert_eq!(p.notice_deadline(), saves_by, "{what}");
        assert_eq!(p.kill_deadline(), killed, "{what}");
    }
}

#[test]
fn a_later_statement_of_the_end_moves_the_kill_earlier_only() {
    // SLURM's time limit: the job ends at 130, SIGKILL 30 s later; the handler's
    // requeue at 110 moves it to 140; a later statement (150) does not move it back.
    let mut p = local(0.0);
    p.handle_platform_end(10.0);
    assert_eq!(p.kill_deadline(), None, "no notice: nothing to end");
    let mut p = local(0.0);
    p.handle_notice(Notice {
        at: 100.0,
        deadline: Some(130.0),
        kill: Some(160.0),
    })
    .unwrap();
    p.handle_platform_end(140.0);
    assert_eq!(p.kill_deadline(), Some(140.0));
    p.handle_platform_end(150.0);
    p.handle_platform_end(f64::NAN);
    assert_eq!(p.kill_deadline(), Some(140.0));
    // A notice whose kill was not stated: the requeue's is the one known.
    let mut q = local(0.0);
    q.handle_notice(Notice {
        at: 100.0,
        deadline: Some(130.0),
        kill: None,
    })
    .unwrap();
    q.handle_platform_end(140.0);
    assert_eq!(q.kill_deadline(), Some(140.0));
}

#[test]
fn retry_bound_reads_only_the_leading_notice() {
    let peer = PEER;
    let mut p = worker_1_of_2(60.0);
    let free = p.retry_bound(0.0);
    assert_eq!(free, peer.min(TRANSIENT_FAILURE_WINDOW));
    // A worker's own notice it has not won the claim for: no deadline of its own yet.
    p.handle_notice(notice(10.0, Some(14.0))).unwrap();
    assert!(!p.leading());
    assert_eq!(p.retry_bound(10.0), free);
    p.handle_claim(true).unwrap();
    assert!(p.leading());
    // The platform's deadline, earlier than the grace period's end; past it, the floor.
    assert_eq!(p.retry_bound(10.0), 4.0);
    assert_eq!(p.retry_bound(20.0), MIN_BOUND_BEFORE_DEADLINE);
    // No grace period: the save is due at the notice (`GracePlanner::deadline`),
    // so the retries have the floor.
    let mut q = local(0.0);
    q.handle_notice(notice(10.0, Some(40.0))).unwrap();
    assert_eq!(q.retry_bound(10.0), MIN_BOUND_BEFORE_DEADLINE);
}

#[test]
fn drain_bound_table() {
    // (grace, deadline, now, save measured, reserve, expected) for a notice at 0.
    type Row = (f64, Option<f64>, f64, Option<f64>, f64, f64);
    let rows: &[Row] = &[
        (0.0, None, 1.0, None, 0.0, 42.0),              // no time named: the peer timeout
        (0.0, Some(30.0), 1.0, Some(5.0), 0.0, 0.0),    // no grace: the save is due at the notice
        (60.0, Some(30.0), 10.0, Some(5.0), 0.0, 15.0), // 30 - 10 - 5
        (60.0, Some(30.0), 10.0, Some(5.0), 2.0, 13.0), // and the exit's reserve
        (60.0, None, 0.0, Some(10.0), 0.0, 50.0),       // the grace period's end
        (60.0, Some(30.0), 29.0, Some(5.0), 0.0, 0.0),  // never below 0
    ];
    for &(grace, deadline, now, save, reserve, want) in rows {
        let mut p = local(grace);
        p.set_exit_reserve(reserve).unwrap();
        if let Some(s) = save {
            p.handle_restored(s);
        }
        p.handle_notice(notice(0.0, deadline)).unwrap();
        p.set_peer_timeout(42.0).unwrap();
        let got = p.drain_bound(now);
        assert!((got - want).abs() < 1e-9, "{grace} {deadline:?} {now}: {got} != {want}");
    }
}

#[test]
fn shares_wait_bound_keeps_the_exit_reserve_before_the_notice_deadline() {
    let mut p = local(0.0);
    let rule = shares::wait_bound(1.0, 5.0);
    assert_eq!(p.shares_wait_bound(1.0, 0.0, 5.0, Waiter::Chief), rule);
    assert_eq!(p.shares_wait_bound(1.0, 0.0, 5.0, Waiter::NonChief), 2.0 * rule);
    p.handle_notice(notice(0.0, Some(4.0))).unwrap();
    let want = (4.0 - 1.0 - EXIT_RESERVE).max(0.0).min(rule);
    assert_eq!(p.shares_wait_bound(1.0, 1.0, 5.0, Waiter::Chief), want);
}

#[test]
fn the_shares_merge_starts_only_when_the_longest_measured_merge_fits_before_the_reserve() {
    use shares::MergeStart::{Keep, Start};
    let mut p = local(0.0);
    // No notice, no deadline: it starts.
    assert_eq!(
        p.shares_merge_start(1.0, 0.0, 5.0),
        Start {
            bound: shares::wait_bound(1.0, 5.0)
        }
    );
    // A deadline 20 s on: 20 - 1 s gone - the reserve left; unmeasured, the estimate is
    // the chief's own part (1 s).
    p.handle_notice(notice(0.0, Some(20.0))).unwrap();
    let left = 20.0 - 1.0 - EXIT_RESERVE;
    assert_eq!(
        p.shares_merge_start(1.0, 1.0, 5.0),
        Start {
            bound: shares::wait_bound(1.0, 5.0).min(left)
        }
    );
    // A merge measured longer than what is left: not started.
    p.handle_shares_merged(left + 1.0);
    p.handle_shares_merged(2.0); // the longest measured counts, not the last
    p.handle_shares_merged(f64::NAN); // no measure
    assert_eq!(p.shares_merge_start(1.0, 1.0, 5.0), Keep { needed: left + 1.0, left });
}

#[test]
fn fit_is_the_planners_answer_for_the_planned_notice() {
    let mut p = local(0.0);
    assert_eq!(p.fit(0.0), None);
    p.handle_restored(1.0);
    p.handle_notice(notice(0.0, Some(100.0))).unwrap();
    let report = p.fit(10.0).unwrap();
    let r = p.resolver().unwrap();
    let (fit, left, needed) = p.planner.fit(r.planned_notice().unwrap(), 0.0, 10.0);
    assert_eq!(report, FitReport { fit, left, needed });
    assert_eq!(report.left, 90.0);
}

#[test]
fn a_save_is_timed_only_when_the_resolver_accepts_it() {
    let mut p = local(0.0);
    p.handle_notice(notice(0.0, None)).unwrap();
    // No save agreed: refused, and not a sample of the save time.
    assert!(p.handle_saved(Round::Initial, 9.0).unwrap().is_err());
    assert_eq!(p.snapshot().longest_save, None);
    let action = p.before_step(5, 1.0).unwrap();
    assert!(matches!(action, StepAction::Publish { .. } | StepAction::Save { .. }), "{action:?}");
    if matches!(action, StepAction::Publish { .. }) {
        assert!(matches!(p.before_step(6, 1.1).unwrap(), StepAction::Save { .. }));
    }
    assert_eq!(p.handle_saved(Round::Initial, 2.0).unwrap(), Ok(SaveAction::Exit));
    assert_eq!(p.snapshot().longest_save, Some(2.0));
}

#[test]
fn a_timed_save_and_restore_record_what_the_protocol_timed() {
    let mut p = local(0.0);
    // A restore timed from 10 to 13: the save estimate until a save is measured.
    p.handle_timing(10.0);
    assert_eq!(p.handle_timed(13.0), 3.0);
    p.handle_restored_timed();
    assert_eq!(p.snapshot().longest_save, None, "a restore is no save measured");
    assert_eq!(p.planner.save_estimate(), 3.0);
    // Nothing started: no time passed (and a clock that went back is no negative time).
    assert_eq!(p.handle_timed(20.0), 0.0);
    p.handle_timing(30.0);
    assert_eq!(p.handle_timed(29.0), 0.0);
    // A save agreed and timed from 40 to 45: the longest save.
    p.handle_notice(notice(0.0, None)).unwrap();
    if matches!(p.before_step(5, 1.0).unwrap(), StepAction::Publish { .. }) {
        p.before_step(6, 1.1).unwrap();
    }
    p.handle_timing(40.0);
    assert_eq!(p.handle_timed(45.0), 5.0);
    assert_eq!(p.handle_saved_timed(Round::Initial).unwrap(), Ok(SaveAction::Exit));
    assert_eq!(p.snapshot().longest_save, Some(5.0));
}

#[test]
fn the_exit_learns_the_seconds_until_the_platform_ends_the_process() {
    let mut p = local(0.0);
    assert_eq!(p.handle_exiting(100.0, None), None, "no notice: nothing stated");
    p.handle_notice(Notice {
        at: 100.0,
        deadline: Some(130.0),
        kill: Some(160.0),
    })
    .unwrap();
    assert_eq!(p.handle_exiting(110.0, None), Some(50.0));
    // A requeue that ends the process 30 s from now moves the kill earlier.
    assert_eq!(p.handle_exiting(110.0, Some(30.0)), Some(30.0));
    assert_eq!(p.kill_deadline(), Some(140.0));
}

#[test]
fn a_notice_is_a_newer_handlers_only_when_it_arrived_after_the_take_over() {
    let mut p = Protocol::new();
    assert!(p.came_after(Some(5.0)), "no take-over: every notice is this handler's");
    p.handle_take_over(100.0);
    assert!(!p.came_after(Some(99.5)));
    assert!(p.came_after(Some(100.0)) && p.came_after(Some(101.0)));
    assert!(p.came_after(None), "an arrival not known counts as after");
}

#[test]
fn a_partial_configuration_starts_from_the_last_one() {
    let mut p = Protocol::new();
    let start = p.config();
    assert_eq!((start.worker_id, start.num_workers, start.grace_period), (None, 1, 0.0));
    assert_eq!(start.peer_timeout, DEFAULT_PEER_TIMEOUT);
    p.configure(Config {
        worker_id: Some(1),
        num_workers: 2,
        ..start
    })
    .unwrap();
    p.set_peer_timeout(7.0).unwrap();
    let now = p.config();
    assert_eq!((now.worker_id, now.num_workers, now.peer_timeout), (Some(1), 2, 7.0));
}

#[test]
fn snapshot_names_the_deadlines_once_configured() {
    let mut p = local(60.0);
    let before = p.snapshot().resolver.unwrap();
    assert_eq!((before.leading, before.deadline, before.planned_deadline), (false, None, None));
    p.handle_notice(notice(10.0, None)).unwrap();
    let after = p.snapshot().resolver.unwrap();
    assert!(after.leading);
    assert_eq!(after.deadline, Some(70.0));
    assert_eq!(after.planned_deadline, Some(70.0));
    assert_eq!(after.final_round_at, Some(70.0 - p.margin()));
    assert!(p.needs_attention());
}

/// The rounds are decided once, from the grace period: a reader watches what
/// `round_keys` names, a step key's acknowledgement names the round after it.
#[test]
fn rounds_table() {
    // (grace period, round keys, has a final round)
    type Row = (f64, &'static [&'static str], bool);
    let rows: &[Row] = &[
        (0.0, &[RUN_TO_CHECKPOINT], false),
        (0.5, &[RUN_TO_CHECKPOINT, LAST_RUN_TO_CHECKPOINT], true),
        (3600.0, &[RUN_TO_CHECKPOINT, LAST_RUN_TO_CHECKPOINT], true),
    ];
    for &(grace, keys, final_round) in rows {
        let mut p = worker_1_of_2(grace);
        assert_eq!(p.round_keys().unwrap(), keys, "grace {grace}");
        assert_eq!(p.has_final_round().unwrap(), final_round, "grace {grace}");
        let first = p.handle_step_key(Round::Initial, "7").unwrap().unwrap();
        let want = final_round.then_some(Round::Final);
        assert!(
            matches!(first, KeyAction::Acknowledge { next_round, .. } if next_round == want),
            "grace {grace}: {first:?}"
        );
        if final_round {
            let last = p.handle_step_key(Round::Final, "9").unwrap().unwrap();
            assert!(matches!(last, KeyAction::Acknowledge { next_round: None, .. }), "{last:?}");
        }
    }
    let unconfigured = Protocol::new();
    assert_eq!(unconfigured.round_keys(), Err(ConfigError::NotConfigured));
    assert_eq!(unconfigured.has_final_round(), Err(ConfigError::NotConfigured));
}

/// A write is retried for the retry bound at its queueing, worked out on the
/// protocol's clock (`now`), while its schedule counts on the driver's (`at`):
/// in a simulation the first is virtual and the second real.
#[test]
fn a_write_is_retried_for_the_retry_bound_at_its_queueing() {
    let mut p = worker_1_of_2(60.0);
    let at = 5000.0;
    // Before a notice leads, the window.
    p.step_key(Round::Initial, "3", false, 0.0, at).unwrap().unwrap();
    let Some(DriverAction::Write { id: ack, call }) = p.poll(at) else {
        panic!("the acknowledgement is due at once")
    };
    assert_eq!(
        (call.kind.clone(), call.key.as_str(), call.value.as_str(), call.subject.as_str()),
        (
            Kind::Acknowledge {},
            "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_1",
            "1",
            "RUN_TO_CHECKPOINT=3"
        )
    );
    assert_eq!(
        call.what(),
        "acknowledging RUN_TO_CHECKPOINT=3 with RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_1"
    );
    assert_eq!(call.timeout, write_timeout(PEER, WriteBound::Protocol));
    assert_eq!(p.poll_timeout(), Some(at));
    p.write_failed(ack, at, false);
    assert_eq!(p.poll_timeout(), Some(f64::NEG_INFINITY), "a report waits");
    let Some(DriverAction::Retrying {
        id,
        attempts: 1,
        pause,
        left,
        ..
    }) = p.poll(at)
    else {
        panic!("a first failure is retried")
    };
    assert!(
        id == ack && pause > 0.0 && (left - PEER.min(TRANSIENT_FAILURE_WINDOW)).abs() < 1e-9,
        "{pause} {left}"
    );
    assert_eq!(p.poll(at), None, "not due before its pause");
    assert_eq!(p.poll_timeout(), Some(at + pause));
    assert!(matches!(p.poll(at + pause), Some(DriverAction::Write { id, .. }) if id == ack));
    p.written(ack, true, 0.0, at);
    assert!(matches!(
        p.poll(at),
        Some(DriverAction::Finished {
            end: WriteEnd::Written { won: true },
            ends_notice: false,
            ..
        })
    ));
    assert_eq!((p.poll(at), p.poll_timeout()), (None, None));

    // Once this worker leads a notice with a deadline 4 s away, 4 s.
    let mut p = worker_1_of_2(60.0);
    p.notice(notice(10.0, Some(14.0)), "a source", "m", 10.0, at).unwrap();
    let claim = p.newest_write().unwrap();
    p.written(claim, true, 10.0, at);
    assert!(matches!(p.poll(at), Some(DriverAction::Finished { .. })));
    assert!(p.writes_busy(), "a won claim is announced");
    let Some(DriverAction::Write { id: announce, call }) = p.poll(at) else {
        panic!("the announce is due at once")
    };
    assert_eq!(
        (call.kind.clone(), call.value.as_str(), call.what()),
        (Kind::Announce {}, "m", "publishing TF_DEFAULT_PREEMPTION_NOTICE_KEY".to_owned())
    );
    p.write_failed(announce, at, false);
    let Some(DriverAction::Retrying { left, .. }) = p.poll(at) else {
        panic!("a first failure is retried")
    };
    assert!((left - 4.0).abs() < 1e-9, "the leading notice's deadline bounds it: {left}");
    p.close(at + 1.0);
    assert!(
        matches!(p.poll(at + 1.0), Some(DriverAction::Write { id, .. }) if id == announce),
        "its last attempt"
    );
    p.write_failed(announce, at + 1.0, false);
    assert!(matches!(
        p.poll(at + 1.0),
        Some(DriverAction::Finished {
            end: WriteEnd::GaveUp { .. },
            ends_notice: true,
            ..
        })
    ));
}

/// A write's call is the protocol's until it is written, given up, raised or
/// dropped at close; a superseded handler acknowledges nothing.
#[test]
fn a_writes_call_is_kept_until_it_ends() {
    use crate::step_resolution::SHUTDOWN_WRITE_TIMEOUT;
    let at = 5000.0;
    let mut p = worker_1_of_2(60.0);
    p.step_key(Round::Initial, "3", true, 0.0, at).unwrap().unwrap();
    assert_eq!(p.poll(at), None, "a newer handler acknowledges");

    // Given up: a peer timeout of 0 retries nothing.
    let mut p = worker_1_of_2(60.0);
    p.set_peer_timeout(0.0).unwrap();
    p.notice(notice(0.0, None), "s", "m", 0.0, at).unwrap();
    let Some(DriverAction::Write { id: claim, call }) = p.poll(at) else {
        panic!("the claim is due")
    };
    assert_eq!(call.what(), "claiming TERMINATED_WORKER after the notice from s");
    p.write_failed(claim, at, false);
    assert!(matches!(
        p.poll(at),
        Some(DriverAction::Finished {
            end: WriteEnd::GaveUp { attempts: 1, .. },
            ends_notice: true,
            ..
        })
    ));
    assert!(p.write_call(claim).is_none() && !p.writes_busy() && !p.leading());

    // Raised: forgotten, a claim not won.
    let mut p = worker_1_of_2(60.0);
    p.notice(notice(0.0, None), "s", "m", 0.0, at).unwrap();
    let claim = p.newest_write().unwrap();
    p.write_raised(claim);
    assert!(matches!(p.poll(at), Some(DriverAction::Finished { end: WriteEnd::Raised, .. })));
    assert!(p.write_call(claim).is_none() && !p.writes_busy() && !p.leading());

    // Dropped at close: a claim; an acknowledgement gets its last attempt.
    let mut p = worker_1_of_2(60.0);
    p.notice(notice(0.0, None), "s", "m", 0.0, at).unwrap();
    let claim = p.newest_write().unwrap();
    p.step_key(Round::Initial, "3", false, 0.0, at).unwrap().unwrap();
    let ack = p.newest_write().unwrap();
    p.close(at);
    assert!(matches!(p.poll(at), Some(DriverAction::Dropped { call }) if call.kind == Kind::Claim {}));
    assert!(p.write_call(claim).is_none());
    assert!(matches!(p.poll(at), Some(DriverAction::Write { id, .. }) if id == ack));
    p.write_failed(ack, at, false);
    assert!(matches!(
        p.poll(at),
        Some(DriverAction::Finished {
            end: WriteEnd::GaveUp { .. },
            ..
        })
    ));
    assert_eq!(p.poll(at), None, "nothing else");
    let announce_call = SetCall::new(Kind::Announce {}, "TF_DEFAULT_PREEMPTION_NOTICE_KEY", "m", "s", PEER);
    assert!(announce_call.timeout <= SHUTDOWN_WRITE_TIMEOUT);
}

/// A claim's follow-up is the protocol's: won, it queues the announce of the message it
/// was queued with; lost, nothing.
#[test]
fn a_won_claim_queues_its_announce_and_a_lost_one_does_not() {
    use crate::step_resolution::PREEMPTION_NOTICE_KEY;
    let at = 5000.0;
    let mut p = worker_1_of_2(60.0);
    assert!(matches!(
        p.notice(notice(10.0, None), "s", "worker 1: notice", 10.0, at).unwrap(),
        NoticeAction::Claim { .. }
    ));
    let claim = p.newest_write().unwrap();
    p.written(claim, true, 10.0, at);
    assert!(matches!(
        p.poll(at),
        Some(DriverAction::Finished {
            end: WriteEnd::Written { won: true },
            ends_notice: false,
            ..
        })
    ));
    let Some(DriverAction::Write { call, .. }) = p.poll(at) else {
        panic!("the announce is due at once")
    };
    assert_eq!(
        (call.kind, call.key.as_str(), call.value.as_str()),
        (Kind::Announce {}, PREEMPTION_NOTICE_KEY, "worker 1: notice")
    );
    assert!(p.leading());

    let mut p = worker_1_of_2(60.0);
    p.notice(notice(10.0, None), "s", "m", 10.0, at).unwrap();
    let claim = p.newest_write().unwrap();
    p.written(claim, false, 10.0, at);
    assert!(matches!(
        p.poll(at),
        Some(DriverAction::Finished {
            end: WriteEnd::Written { won: false },
            ends_notice: true,
            ..
        })
    ));
    assert!(!p.writes_busy() && !p.leading() && p.poll(at).is_none());
    p.written(claim, true, 10.0, at);
    assert!(p.poll(at).is_none() && !p.leading(), "a stale handle changes nothing");

    // Local mode leads at once, with nothing to write.
    let mut q = local(0.0);
    assert_eq!(q.notice(notice(0.0, None), "s", "m", 0.0, at).unwrap(), NoticeAction::Lead);
    assert!(q.poll(at).is_none());
}

/// A leader of worker 1 of 2 whose round `before_step` just published at `now`.
fn leader_publishing(now: f64) -> Protocol {
    let mut p = worker_1_of_2(0.0);
    p.handle_notice(notice(now, None)).unwrap();
    p.handle_claim(true).unwrap();
    assert!(matches!(p.before_step(0, now).unwrap(), StepAction::Publish { step: 1, .. }));
    p
}

/// How the protocol suspects a lost peer from the error the protocol's own call raised
/// (`Event.StepFailed` with its code, as `reporting` asks; the text names no peer):
/// the `Action.Probe`'s detection, or None when it would raise without a suspicion.
fn suspected(p: &mut Protocol) -> Option<String> {
    match p.handle_step_failed(Some(crate::failure::lost_peer::DEADLINE_EXCEEDED), "named by the protocol") {
        Action::Probe { detection, .. } => detection,
        _ => None,
    }
}

/// A peer lost inside a preemption's round (issue 62): the round's call that gave up,
/// or the acknowledgements missing, make the next failed step suspect a lost peer,
/// once; without them the same error suspects none.
#[test]
fn a_round_that_gave_up_or_missed_acknowledgements_suspects_a_lost_peer() {
    let unanswered = Some("no answer to the preemption protocol's calls".to_owned());
    // The leader's publish given up.
    let mut p = leader_publishing(10.0);
    p.leader_next(10.0, 0.0);
    let mut at = 0.0;
    let gave_up = loop {
        match p.leader_call_failed(10.0, at, false) {
            Action::Pause { seconds, .. } => at += seconds.max(0.1),
            other => break other,
        }
    };
    assert!(matches!(gave_up, Action::GaveUp { .. }), "{gave_up:?}");
    assert_eq!(suspected(&mut p), unanswered);
    assert_eq!(suspected(&mut p), None, "one failed step takes the suspicion");
    // The reader given up.
    let mut p = worker_1_of_2(0.0);
    p.set_peer_timeout(1.0).unwrap();
    let mut at = 0.0;
    while !matches!(p.reader_failed(at, at, false), Action::GaveUp { .. }) {
        at += 0.6;
    }
    assert_eq!(suspected(&mut p), unanswered);
    // The driver's acknowledgement given up.
    let mut p = worker_1_of_2(0.0);
    p.set_peer_timeout(1.0).unwrap();
    p.step_key(Round::Initial, "3", false, 0.0, 0.0).unwrap().unwrap();
    let ack = p.newest_write().unwrap();
    let mut at = 0.0;
    loop {
        assert!(matches!(p.poll(at), Some(DriverAction::Write { .. })), "the acknowledgement is due");
        p.write_failed(ack, at, false);
        match p.poll(at) {
            Some(DriverAction::Finished {
                end: WriteEnd::GaveUp { .. },
                ..
            }) => break,
            Some(DriverAction::Retrying { pause, .. }) => at += pause.max(0.1),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(suspected(&mut p), unanswered);
    // The leader's wait past the peer timeout, a worker missing.
    let mut p = leader_publishing(10.0);
    p.set_peer_timeout(5.0).unwrap();
    p.leader_next(10.0, 0.0);
    p.leader_called(Some("1"), 10.0, 0.0).unwrap();
    p.leader_called(Some("1"), 10.0, 0.0).unwrap();
    p.leader_next(10.0, 0.0);
    p.leader_called(None, 20.0, 6.0).unwrap();
    p.leader_called(None, 20.0, 6.0).unwrap();
    assert!(matches!(p.leader_called(None, 20.0, 6.0).unwrap(), Action::Missing { .. }));
    assert_eq!(suspected(&mut p), Some("the agreed step not acknowledged".to_owned()));
    // Without either, the same error suspects none (the probe only names who is gone).
    let mut p = worker_1_of_2(0.0);
    assert_eq!(suspected(&mut p), None);
}

fn set_key(a: &Action) -> (&str, &str) {
    match a {
        Action::Set { key, value, .. } => (key.as_str(), value.as_str()),
        other => panic!("expected a write: {other:?}"),
    }
}

/// The leader's round: publish, own acknowledgement, recorded, the wait, agreed.
#[test]
fn a_leaders_round_publishes_acknowledges_waits_and_is_agreed() {
    let at = 500.0;
    let mut p = leader_publishing(10.0);
    let publish = p.leader_next(10.0, at);
    assert_eq!(set_key(&publish), (RUN_TO_CHECKPOINT, "1"));
    assert!(matches!(&publish, Action::Set { timeout, what, .. }
        if *timeout == write_timeout(PEER, WriteBound::Protocol) && what == "publishing RUN_TO_CHECKPOINT=1"));
    let own = p.leader_called(Some("1"), 10.0, at).unwrap();
    assert_eq!(set_key(&own), ("RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_1", "1"));
    assert_eq!(
        p.leader_called(Some("1"), 10.0, at).unwrap(),
        Action::Published {
            round: Round::Initial,
            step: 1
        }
    );
    let Action::Get {
        key, ack: true, timeout, ..
    } = p.leader_next(10.0, at)
    else {
        panic!("the wait reads the first key")
    };
    assert_eq!(key, "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_0");
    assert!(timeout > 0.0 && timeout <= crate::acks::ACK_READ_SLICE);
    // Not yet, then written; then its own key, written.
    assert!(matches!(p.leader_called(None, 10.0, at).unwrap(), Action::Get { .. }));
    let next = p.leader_called(Some("1"), 10.0, at).unwrap();
    assert!(matches!(&next, Action::Get { key, .. } if key == "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_1"));
    assert_eq!(p.leader_called(Some("1"), 12.0, at).unwrap(), Action::Agreed {});
    assert_eq!(p.leader_next(12.0, at), Action::Agreed {}, "nothing in progress");
}

/// Local mode records the round and is agreed: nothing is written or waited for.
#[test]
fn a_local_round_is_recorded_and_agreed() {
    let mut p = local(0.0);
    p.handle_notice(notice(0.0, None)).unwrap();
    assert!(matches!(p.before_step(0, 0.0).unwrap(), StepAction::Publish { .. }));
    assert!(matches!(p.leader_next(0.0, 0.0), Action::Published { step: 1, .. }));
    assert_eq!(p.leader_next(0.0, 0.0), Action::Agreed {});
}

/// A publish another worker made first: the key read back is the agreed step.
#[test]
fn a_lost_publish_reads_the_key_back_and_follows_it() {
    let mut p = leader_publishing(10.0);
    p.leader_next(10.0, 0.0);
    let Action::Get {
        key, timeout, ack: false, ..
    } = p.leader_called(None, 10.0, 0.0).unwrap()
    else {
        panic!("the key is read back")
    };
    assert_eq!((key.as_str(), timeout), (RUN_TO_CHECKPOINT, READ_BACK_TIMEOUT));
    assert_eq!(
        p.leader_called(Some("7"), 10.0, 0.0).unwrap(),
        Action::Lost {
            round: Round::Initial,
            value: Some("7".into())
        }
    );
    assert_eq!(p.snapshot().resolver.unwrap().agreed_step, Some(7));
    // A value the protocol cannot read is refused.
    let mut q = leader_publishing(10.0);
    q.leader_next(10.0, 0.0);
    q.leader_called(None, 10.0, 0.0).unwrap();
    assert!(matches!(q.leader_called(Some("x"), 10.0, 0.0), Err(ConfigError::StepKey(_))));
}

/// A failing call is paused by the retry rule, and given up when closing.
#[test]
fn a_failing_call_of_the_round_is_paused_then_given_up() {
    let mut p = leader_publishing(10.0);
    p.leader_next(10.0, 0.0);
    let Action::Pause {
        seconds,
        attempts: 1,
        what,
        ..
    } = p.leader_call_failed(10.0, 0.0, false)
    else {
        panic!("a first failure is retried")
    };
    assert!(seconds > 0.0 && what == "publishing RUN_TO_CHECKPOINT=1");
    assert_eq!(set_key(&p.leader_next(10.0, seconds)), (RUN_TO_CHECKPOINT, "1"));
    assert!(matches!(
        p.leader_call_failed(10.0, seconds, true),
        Action::GaveUp { attempts: 2, .. }
    ));
    assert_eq!(p.leader_next(10.0, seconds), Action::Agreed {}, "the round ended");
}

/// The peer timeout passes: one last read of each missing key, then they are named.
#[test]
fn a_wait_past_the_peer_timeout_names_who_is_missing() {
    let mut p = leader_publishing(10.0);
    p.set_peer_timeout(5.0).unwrap();
    p.leader_next(10.0, 0.0);
    p.leader_called(Some("1"), 10.0, 0.0).unwrap(); // published
    p.leader_called(Some("1"), 10.0, 0.0).unwrap(); // own acknowledgement
    assert!(matches!(p.leader_next(10.0, 0.0), Action::Get { ack: true, .. }));
    // Past the end: the last look, key by key.
    let Action::Get {
        key, timeout, ack: false, ..
    } = p.leader_called(None, 20.0, 6.0).unwrap()
    else {
        panic!("the last look")
    };
    assert_eq!((key.as_str(), timeout), ("RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_0", LAST_LOOK_TIMEOUT));
    assert!(matches!(p.leader_called(None, 20.0, 6.0).unwrap(), Action::Get { .. }));
    assert_eq!(
        p.leader_called(Some("1"), 20.0, 6.0).unwrap(),
        Action::Missing {
            round: Round::Initial,
            step: 1,
            missing: vec!["RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_0".into()]
        }
    );
}

/// The reader reads each round's key in slices, posts what it finds, and stops
/// after the last round or `STOP_WATCHER`.
#[test]
fn the_reader_reads_each_rounds_key_and_posts_its_value() {
    use crate::step_resolution::PEER_WATCH_SLICE;
    let mut p = worker_1_of_2(60.0);
    let get = |key: &str| Action::Read {
        key: key.to_owned(),
        timeout: PEER_WATCH_SLICE,
    };
    assert_eq!(p.reader_next(), get(RUN_TO_CHECKPOINT));
    assert_eq!(p.reader_read(None), get(RUN_TO_CHECKPOINT), "not set yet: read again");
    assert_eq!(
        p.reader_read(Some("4")),
        Action::Post {
            round: Round::Initial,
            value: "4".into()
        }
    );
    assert_eq!(p.reader_next(), get(LAST_RUN_TO_CHECKPOINT), "with a grace period, the final round");
    assert!(matches!(p.reader_read(Some("9")), Action::Post { round: Round::Final, .. }));
    assert_eq!(p.reader_next(), Action::Done {});
    // STOP_WATCHER ends it at once; no grace period, one round.
    let mut q = worker_1_of_2(60.0);
    q.reader_read(Some("STOP_WATCHER"));
    assert_eq!(q.reader_next(), Action::Done {});
    let mut r = worker_1_of_2(0.0);
    r.reader_read(Some("3"));
    assert_eq!(r.reader_next(), Action::Done {});
}

/// A failed read is paused by the retry rule from its first failure, a read that
/// answers ends the run, and the rule gives up; closing ends the reader.
#[test]
fn a_failing_read_is_paused_given_up_or_ends_at_close() {
    let mut p = worker_1_of_2(0.0);
    p.set_peer_timeout(1.0).unwrap();
    let Action::Pause { attempts: 1, what, .. } = p.reader_failed(0.0, 0.0, false) else {
        panic!("a first failure is retried")
    };
    assert_eq!(what, "reading RUN_TO_CHECKPOINT");
    assert!(matches!(p.reader_read(None), Action::Read { .. }), "answered: the run ends");
    assert!(matches!(p.reader_failed(5.0, 5.0, false), Action::Pause { attempts: 1, .. }));
    let mut at = 5.0;
    let gave_up = loop {
        at += 0.6;
        match p.reader_failed(at, at, false) {
            Action::Pause { .. } => {}
            other => break other,
        }
    };
    assert!(matches!(gave_up, Action::GaveUp { attempts, .. } if attempts >= crate::retry::MIN_ATTEMPTS));
    assert_eq!(p.reader_next(), Action::Done {});
    let mut q = worker_1_of_2(0.0);
    assert_eq!(q.reader_failed(0.0, 0.0, true), Action::Done {});
    assert_eq!(q.reader_next(), Action::Done {});
}

/// The shutdown's writes release the readers: `STOP_WATCHER` to each step key.
#[test]
fn the_shutdown_writes_release_every_step_key() {
    use crate::step_resolution::SHUTDOWN_WRITE_TIMEOUT;
    let writes = worker_1_of_2(0.0).shutdown_writes().unwrap();
    assert_eq!(writes.len(), 2);
    assert!(matches!(&writes[0], Action::Set { key, value, timeout, .. }
        if key == RUN_TO_CHECKPOINT && value == "STOP_WATCHER" && *timeout == SHUTDOWN_WRITE_TIMEOUT));
    assert!(local(0.0).shutdown_writes().unwrap().is_empty());
}
