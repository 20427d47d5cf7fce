//! The protocol object's own rules: its configuration, the step timing and
//! every bound it works out from the resolver and the planner.

use super::*;
use crate::grace::EXIT_RESERVE;
use crate::retry::{MIN_BOUND_BEFORE_DEADLINE, TRANSIENT_FAILURE_WINDOW};
use crate::step_resolution::{LAST_RUN_TO_CHECKPOINT, RUN_TO_CHECKPOINT};

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
    });
    assert!(matches!(nan, Err(ConfigError::GracePeriod(g)) if g.is_nan()));
}

#[test]
fn before_configure_every_event_is_refused_and_every_bound_says_none() {
    let mut p = Protocol::new();
    assert_eq!(p.handle_notice(notice(0.0, None)), Err(ConfigError::NotConfigured));
    assert_eq!(p.handle_claim(true), Err(ConfigError::NotConfigured));
    assert_eq!(p.before_step(0, 0.0), Err(ConfigError::NotConfigured));
    assert_eq!(p.handle_save_failed(), Err(ConfigError::NotConfigured));
    assert_eq!(p.shutdown_keys(), Err(ConfigError::NotConfigured));
    assert!(!p.needs_attention());
    assert!(!p.leading());
    assert_eq!(p.notice_deadline(), None);
    assert_eq!(p.fit(0.0), None);
    assert_eq!(p.drain_bound(0.0, 7.0), 7.0);
    assert_eq!(p.retry_bound(0.0, 7.0), crate::retry::bound(7.0, None, 0.0));
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
    let peer = 100.0;
    let mut p = worker_1_of_2(60.0);
    let free = p.retry_bound(0.0, peer);
    assert_eq!(free, peer.min(TRANSIENT_FAILURE_WINDOW));
    // A worker's own notice it has not won the claim for: no deadline of its own yet.
    p.handle_notice(notice(10.0, Some(14.0))).unwrap();
    assert!(!p.leading());
    assert_eq!(p.retry_bound(10.0, peer), free);
    p.handle_claim(true).unwrap();
    assert!(p.leading());
    // The platform's deadline, earlier than the grace period's end; past it, the floor.
    assert_eq!(p.retry_bound(10.0, peer), 4.0);
    assert_eq!(p.retry_bound(20.0, peer), MIN_BOUND_BEFORE_DEADLINE);
    // No grace period: the save is due at the notice (`GracePlanner::deadline`),
    // so the retries have the floor.
    let mut q = local(0.0);
    q.handle_notice(notice(10.0, Some(40.0))).unwrap();
    assert_eq!(q.retry_bound(10.0, peer), MIN_BOUND_BEFORE_DEADLINE);
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
        let got = p.drain_bound(now, 42.0);
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

/// A write is retried for the retry bound at its push, worked out on the
/// protocol's clock (`now`), while its schedule counts on the driver's (`at`):
/// in a simulation the first is virtual and the second real.
#[test]
fn a_write_is_retried_for_the_retry_bound_at_its_push() {
    let peer = 100.0;
    let mut p = worker_1_of_2(60.0);
    // (protocol's now, retry bound): before a notice leads, the window; once
    // this worker leads a notice with a deadline 4 s away, 4 s.
    let at = 5000.0;
    let ack = p
        .push_write(
            SetCall::new(writes::Kind::Acknowledge, "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_1", "1", peer),
            0.0,
            peer,
            at,
        )
        .unwrap();
    assert_eq!((p.poll_write(at), p.poll_timeout()), (Some(ack), Some(at)));
    let Some(Verdict::Again { at: again, left }) = p.handle_write_failed(ack, at, false) else {
        panic!("a first failure is retried")
    };
    assert!(
        again > at && (left - peer.min(TRANSIENT_FAILURE_WINDOW)).abs() < 1e-9,
        "{again} {left}"
    );
    assert_eq!(p.poll_write(at), None, "not due before its pause");
    assert_eq!(p.poll_timeout(), Some(again));
    assert_eq!(p.poll_write(again), Some(ack));
    assert_eq!(p.handle_write_done(ack), Some(writes::Kind::Acknowledge));

    p.handle_notice(notice(10.0, Some(14.0))).unwrap();
    p.handle_claim(true).unwrap();
    let announce = p
        .push_write(
            SetCall::new(writes::Kind::Announce, "TF_DEFAULT_PREEMPTION_NOTICE_KEY", "notice", peer),
            10.0,
            peer,
            at,
        )
        .unwrap();
    assert!(p.writes().busy());
    assert_eq!(
        p.push_write(SetCall::new(writes::Kind::Claim, "TERMINATED_WORKER", "1", peer), 10.0, peer, at),
        Err(Busy)
    );
    let Some(Verdict::Again { left, .. }) = p.handle_write_failed(announce, at, false) else {
        panic!("a first failure is retried")
    };
    assert!((left - 4.0).abs() < 1e-9, "the leading notice's deadline bounds it: {left}");
    let closing = p.close_writes(at + 1.0);
    assert_eq!((closing.last_attempts, closing.dropped), (vec![announce], None));
}

/// A write's call is the protocol's: the key and value it was pushed with, bounded as
/// its kind is (an announce, which nothing waits for, no longer than the shutdown's
/// bound), until the write is done, given up or dropped at close.
#[test]
fn a_writes_call_is_kept_until_it_is_done_given_up_or_dropped() {
    use crate::step_resolution::{SHUTDOWN_WRITE_TIMEOUT, TERMINATED_WORKER};
    let peer = 100.0;
    let mut p = worker_1_of_2(60.0);
    let at = 5000.0;
    let ack_call = SetCall::new(writes::Kind::Acknowledge, "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_1", "1", peer);
    assert_eq!(ack_call.timeout, write_timeout(peer, WriteBound::Protocol));
    let ack = p.push_write(ack_call.clone(), 0.0, peer, at).unwrap();
    assert_eq!(p.write_call(ack), Some(&ack_call));
    assert_eq!(p.handle_write_done(ack), Some(writes::Kind::Acknowledge));
    assert_eq!(p.write_call(ack), None, "done: forgotten");

    // Given up: a bound of 0 retries nothing.
    let claim = p
        .push_write_bounded(SetCall::new(writes::Kind::Claim, TERMINATED_WORKER, "1", peer), 0.0, at)
        .unwrap();
    assert!(matches!(p.handle_write_failed(claim, at, false), Some(Verdict::GiveUp { .. })));
    assert_eq!(p.write_call(claim), None, "given up: forgotten");

    // Dropped at close: a claim; an announce gets its last attempt, its call kept.
    let claim = p
        .push_write(SetCall::new(writes::Kind::Claim, TERMINATED_WORKER, "1", peer), 0.0, peer, at)
        .unwrap();
    let closing = p.close_writes(at);
    assert_eq!(closing.dropped, Some(claim));
    assert_eq!(p.write_call(claim), None, "dropped: forgotten");
    let announce_call = SetCall::new(writes::Kind::Announce, "TF_DEFAULT_PREEMPTION_NOTICE_KEY", "m", peer);
    assert!(announce_call.timeout <= SHUTDOWN_WRITE_TIMEOUT);
}

/// A claim's follow-up is the protocol's: won, it queues the announce of the message it
/// was pushed with; lost, nothing; given up, this worker does not lead.
#[test]
fn a_won_claim_queues_its_announce_and_a_lost_or_given_up_one_does_not() {
    use crate::step_resolution::{PREEMPTION_NOTICE_KEY, TERMINATED_WORKER};
    let peer = 100.0;
    let at = 5000.0;
    let mut p = worker_1_of_2(60.0);
    p.handle_notice(notice(10.0, None)).unwrap();
    let claim = p
        .push_write(SetCall::claim(TERMINATED_WORKER, "1", "worker 1: notice", peer), 10.0, peer, at)
        .unwrap();
    let announce = p
        .handle_claim_done(claim, true, 10.0, peer, at)
        .unwrap()
        .expect("a won claim announces");
    assert_eq!(p.write_call(claim), None, "the claim is done");
    let call = p.write_call(announce).expect("the announce is pending");
    assert_eq!(
        (call.kind, call.key.as_str(), call.value.as_str()),
        (writes::Kind::Announce, PREEMPTION_NOTICE_KEY, "worker 1: notice")
    );
    assert_eq!(p.poll_write(at), Some(announce), "due at once");
    assert!(p.leading());

    let mut p = worker_1_of_2(60.0);
    p.handle_notice(notice(10.0, None)).unwrap();
    let claim = p
        .push_write(SetCall::claim(TERMINATED_WORKER, "1", "m", peer), 10.0, peer, at)
        .unwrap();
    assert_eq!(p.handle_claim_done(claim, false, 10.0, peer, at).unwrap(), None);
    assert!(!p.writes().busy() && !p.leading());

    let mut p = worker_1_of_2(60.0);
    p.handle_notice(notice(10.0, None)).unwrap();
    let claim = p
        .push_write_bounded(SetCall::claim(TERMINATED_WORKER, "1", "m", peer), 0.0, at)
        .unwrap();
    assert!(matches!(p.handle_write_failed(claim, at, false), Some(Verdict::GiveUp { .. })));
    assert!(!p.writes().busy() && !p.leading());
    assert_eq!(p.poll_write(at), None, "nothing follows a claim given up");

    let mut p = worker_1_of_2(60.0);
    p.handle_notice(notice(10.0, None)).unwrap();
    let claim = p
        .push_write(SetCall::claim(TERMINATED_WORKER, "1", "m", peer), 10.0, peer, at)
        .unwrap();
    assert_eq!(p.handle_write_abandoned(claim), Some(writes::Kind::Claim));
    assert!(!p.writes().busy() && !p.leading());
}
