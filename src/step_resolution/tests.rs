use super::*;

use crate::grace::GracePlanner;

// ---------------------------------------------------------------------------
// Every transition, one table; then single resolvers, the planner beside them.
// ---------------------------------------------------------------------------

/// One call into the resolver.
#[derive(Clone, Debug)]
enum Ev {
    /// `on_notice` at this time, no platform deadline.
    Notice(f64),
    /// `on_notice` at `.0` with a platform deadline `.1`.
    NoticeBy(f64, f64),
    /// `on_claim`.
    Claim(bool),
    /// `on_step_key`.
    Key(Round, &'static str),
    /// `before_step(run_count, now, table_planner())`.
    Before(u64, f64),
    /// `on_saved`.
    Saved(Round),
    /// `on_save_failed`.
    SaveFailed,
    /// `on_publish_lost`: this worker's publish found the key holding `.1`.
    Lost(Round, &'static str),
}

/// What the call returned.
#[derive(Debug, PartialEq)]
enum Out {
    Notice(NoticeAction),
    /// `on_claim` and `on_save_failed` return nothing.
    Done,
    Key(Result<KeyAction, StepKeyError>),
    Step(StepAction),
    Saved(Result<SaveAction, SaveError>),
}

/// 20 steps of 1 s and one save of 2 s: margin = 2 × 1 + 0 + 1.5 × 2 + 1 = 6 s,
/// so with a notice at 0 and a grace period of 10 s the final round is due from 4 s.
fn table_planner() -> GracePlanner {
    let mut p = GracePlanner::without_exit_reserve();
    for _ in 0..20 {
        p.record_step(1.0);
    }
    p.record_save(2.0);
    p
}

fn apply(r: &mut Resolver, ev: &Ev, planner: &GracePlanner) -> Out {
    match *ev {
        Ev::Notice(at) => Out::Notice(r.on_notice(Notice::stated(at, None))),
        Ev::NoticeBy(at, deadline) => Out::Notice(r.on_notice(Notice::stated(at, Some(deadline)))),
        Ev::Claim(won) => {
            r.on_claim(won);
            Out::Done
        }
        Ev::Key(round, value) => Out::Key(r.on_step_key(round, value)),
        Ev::Before(runs, now) => Out::Step(r.before_step(runs, now, planner)),
        Ev::Saved(round) => Out::Saved(r.on_saved(round)),
        Ev::SaveFailed => {
            r.on_save_failed();
            Out::Done
        }
        Ev::Lost(round, value) => match r.on_publish_lost(round, value) {
            Ok(()) => Out::Done,
            Err(e) => Out::Key(Err(e)),
        },
    }
}

struct Row {
    name: &'static str,
    who: Membership,
    grace: f64,
    /// Events that build the initial state (their outcomes are not checked here).
    setup: Vec<Ev>,
    /// The transition under test.
    event: Ev,
    expect: Out,
    /// `needs_attention()` after the event.
    attention: bool,
    /// `round()` and `agreed_step()` after the event.
    round: Round,
    agreed: Option<u64>,
    /// Whether the event leaves the state exactly as it was.
    same: bool,
}

const I: Round = Round::Initial;
const F: Round = Round::Final;

fn w(id: u32, num_workers: u32) -> Membership {
    Membership::Worker { id, num_workers }
}

fn ack(key: &str, next_round: Option<Round>) -> Out {
    Out::Key(Ok(KeyAction::Acknowledge {
        ack_key: key.to_owned(),
        next_round,
    }))
}

fn malformed(key: &'static str, value: &str) -> Out {
    Out::Key(Err(StepKeyError::Malformed {
        key,
        value: value.to_owned(),
    }))
}

fn publish(round: Round, step: u64, ack_keys: &[&str], own_ack_key: Option<&str>) -> Out {
    Out::Step(StepAction::Publish {
        round,
        step,
        ack_keys: ack_keys.iter().map(|k| (*k).to_owned()).collect(),
        own_ack_key: own_ack_key.map(str::to_owned),
    })
}

fn save(round: Round, step: u64) -> Out {
    Out::Step(StepAction::Save { round, step })
}

const PROCEED: Out = Out::Step(StepAction::Proceed);
const IGNORED: Out = Out::Notice(NoticeAction::Absorb);
const REPLAN: Out = Out::Notice(NoticeAction::Replan);

fn claim(id: &str) -> Out {
    Out::Notice(NoticeAction::Claim {
        key: "TERMINATED_WORKER",
        value: id.to_owned(),
    })
}

fn cat(a: &[Ev], b: &[Ev]) -> Vec<Ev> {
    a.iter().chain(b).cloned().collect()
}

#[allow(clippy::too_many_lines)]
#[rustfmt::skip] // one row per line: a table
fn transition_table() -> Vec<Row> {
    use Ev::{Before, Claim, Key, Lost, Notice, NoticeBy, SaveFailed, Saved};
    let l = || Membership::Local;
    // Local leader: notice at 0, publishes 6 before step 6, saves at 6.
    let local_lead = [Notice(0.0)];
    let local_published = [Notice(0.0), Before(5, 1.0)];
    let local_saving = [Notice(0.0), Before(5, 1.0), Before(6, 2.0)];
    let local_done = cat(&local_saving, &[Saved(I)]);
    // With grace 10: final round not due before 4 s.
    let local_countdown = cat(&local_saving, &[Saved(I)]);
    let local_final_published = cat(&local_countdown, &[Before(7, 5.0)]);
    let local_final_saving = cat(&local_final_published, &[Before(8, 6.0)]);
    let local_final_done = cat(&local_final_saving, &[Saved(F)]);
    // Worker 0 of 3 leading.
    let claiming = [Notice(0.0)];
    let leading = [Notice(0.0), Claim(true)];
    let lost = [Notice(0.0), Claim(false)];
    let led = [Notice(0.0), Claim(true), Before(5, 1.0)];
    // Worker 1 of 3 following the leader's step 6.
    let agreed = [Key(I, "6")];
    let follower_saving = [Key(I, "6"), Before(6, 2.0)];
    // Worker 3 of 4, grace 10, following.
    let f_countdown = [Key(I, "6"), Before(6, 2.0), Saved(I)];
    let f_final_agreed = cat(&f_countdown, &[Key(F, "9")]);
    let f_final_saving = cat(&f_final_agreed, &[Before(9, 3.0)]);
    // Worker 0 of 2, grace 10, leading into the countdown.
    let w_countdown = [Notice(0.0), Claim(true), Before(5, 1.0), Before(6, 2.0), Saved(I)];

    let ack_i0 = "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_0";
    let ack_i1 = "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_1";
    let ack_i2 = "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_2";
    let ack_i3 = "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_3";
    let ack_f3 = "RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_3";
    let ack_f = ["RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_0", "RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_1", "RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_2", ack_f3];

    vec![
        // --- Local, grace 0 -------------------------------------------------
        Row { name: "local, no notice: proceed, hot path", who: l(), grace: 0.0, setup: vec![], event: Before(5, 1.0), expect: PROCEED, attention: false, round: I, agreed: None, same: true },
        Row { name: "local notice: lead", who: l(), grace: 0.0, setup: vec![], event: Notice(0.0), expect: Out::Notice(NoticeAction::Lead), attention: true, round: I, agreed: None, same: false },
        Row { name: "local leader publishes runs + 1, no ack keys", who: l(), grace: 0.0, setup: local_lead.to_vec(), event: Before(5, 1.0), expect: publish(I, 6, &[], None), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "local: second notice while leading is ignored", who: l(), grace: 0.0, setup: local_lead.to_vec(), event: Notice(0.5), expect: IGNORED, attention: true, round: I, agreed: None, same: true },
        Row { name: "local: second notice after publishing is ignored", who: l(), grace: 0.0, setup: local_published.to_vec(), event: Notice(1.5), expect: IGNORED, attention: true, round: I, agreed: Some(6), same: true },
        Row { name: "local: run count below the agreed step proceeds, publishes once", who: l(), grace: 0.0, setup: local_published.to_vec(), event: Before(5, 1.5), expect: PROCEED, attention: true, round: I, agreed: Some(6), same: true },
        Row { name: "local: save at the agreed step", who: l(), grace: 0.0, setup: local_published.to_vec(), event: Before(6, 2.0), expect: save(I, 6), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "local: while the save runs, before_step proceeds", who: l(), grace: 0.0, setup: local_saving.to_vec(), event: Before(6, 2.1), expect: PROCEED, attention: true, round: I, agreed: Some(6), same: true },
        Row { name: "local grace 0: saved -> exit", who: l(), grace: 0.0, setup: local_saving.to_vec(), event: Saved(I), expect: Out::Saved(Ok(SaveAction::Exit)), attention: false, round: I, agreed: Some(6), same: false },
        Row { name: "negative grace behaves as 0: saved -> exit", who: l(), grace: -1.0, setup: local_saving.to_vec(), event: Saved(I), expect: Out::Saved(Ok(SaveAction::Exit)), attention: false, round: I, agreed: Some(6), same: false },
        Row { name: "after exit: proceed, no attention", who: l(), grace: 0.0, setup: local_done.clone(), event: Before(7, 3.0), expect: PROCEED, attention: false, round: I, agreed: Some(6), same: true },
        Row { name: "after exit: notice ignored", who: l(), grace: 0.0, setup: local_done.clone(), event: Notice(3.0), expect: IGNORED, attention: false, round: I, agreed: Some(6), same: true },
        Row { name: "after exit: a second on_saved is unexpected", who: l(), grace: 0.0, setup: local_done.clone(), event: Saved(I), expect: Out::Saved(Err(SaveError::Unexpected(I))), attention: false, round: I, agreed: Some(6), same: true },
        Row { name: "on_saved without a save", who: l(), grace: 0.0, setup: vec![], event: Saved(I), expect: Out::Saved(Err(SaveError::Unexpected(I))), attention: false, round: I, agreed: None, same: true },
        Row { name: "on_saved for the other round", who: l(), grace: 0.0, setup: local_saving.to_vec(), event: Saved(F), expect: Out::Saved(Err(SaveError::Unexpected(F))), attention: true, round: I, agreed: Some(6), same: true },
        Row { name: "on_save_failed clears the pending save", who: l(), grace: 0.0, setup: local_saving.to_vec(), event: SaveFailed, expect: Out::Done, attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "after a failed save the save is asked again", who: l(), grace: 0.0, setup: cat(&local_saving, &[SaveFailed]), event: Before(6, 2.5), expect: save(I, 6), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "after a failed save on_saved is unexpected", who: l(), grace: 0.0, setup: cat(&local_saving, &[SaveFailed]), event: Saved(I), expect: Out::Saved(Err(SaveError::Unexpected(I))), attention: true, round: I, agreed: Some(6), same: true },
        Row { name: "local ack key uses single_worker", who: l(), grace: 10.0, setup: vec![], event: Key(I, "3"), expect: ack("RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_single_worker", Some(F)), attention: true, round: I, agreed: Some(3), same: false },
        // --- Local, grace 10 ------------------------------------------------
        Row { name: "grace: first save -> countdown, leader keeps attention", who: l(), grace: 10.0, setup: local_saving.to_vec(), event: Saved(I), expect: Out::Saved(Ok(SaveAction::Countdown)), attention: true, round: F, agreed: None, same: false },
        Row { name: "countdown: final round not due", who: l(), grace: 10.0, setup: local_countdown.clone(), event: Before(7, 3.8), expect: PROCEED, attention: true, round: F, agreed: None, same: true },
        Row { name: "countdown: final round due -> publish runs + 1", who: l(), grace: 10.0, setup: local_countdown.clone(), event: Before(7, 5.0), expect: publish(F, 8, &[], None), attention: true, round: F, agreed: Some(8), same: false },
        Row { name: "countdown: notice ignored", who: l(), grace: 10.0, setup: local_countdown.clone(), event: Notice(4.0), expect: IGNORED, attention: true, round: F, agreed: None, same: true },
        Row { name: "platform deadline earlier than the grace period brings the final round forward", who: l(), grace: 10.0, setup: vec![NoticeBy(0.0, 6.0), Before(5, 0.2), Before(6, 0.4), Saved(I)], event: Before(7, 1.0), expect: publish(F, 8, &[], None), attention: true, round: F, agreed: Some(8), same: false },
        Row { name: "final round published once", who: l(), grace: 10.0, setup: local_final_published.clone(), event: Before(7, 5.5), expect: PROCEED, attention: true, round: F, agreed: Some(8), same: true },
        Row { name: "final save at the final step", who: l(), grace: 10.0, setup: local_final_published.clone(), event: Before(8, 6.0), expect: save(F, 8), attention: true, round: F, agreed: Some(8), same: false },
        Row { name: "final save done -> exit", who: l(), grace: 10.0, setup: local_final_saving.clone(), event: Saved(F), expect: Out::Saved(Ok(SaveAction::Exit)), attention: false, round: F, agreed: Some(8), same: false },
        Row { name: "after the final exit: proceed", who: l(), grace: 10.0, setup: local_final_done.clone(), event: Before(9, 7.0), expect: PROCEED, attention: false, round: F, agreed: Some(8), same: true },
        // --- Worker 0 of 3, grace 0: claims ---------------------------------
        Row { name: "worker notice claims TERMINATED_WORKER with its id", who: w(0, 3), grace: 0.0, setup: vec![], event: Notice(0.0), expect: claim("0"), attention: false, round: I, agreed: None, same: false },
        Row { name: "claim pending: step proceeds", who: w(0, 3), grace: 0.0, setup: claiming.to_vec(), event: Before(5, 1.0), expect: PROCEED, attention: false, round: I, agreed: None, same: true },
        Row { name: "claim pending: second notice ignored", who: w(0, 3), grace: 0.0, setup: claiming.to_vec(), event: Notice(0.5), expect: IGNORED, attention: false, round: I, agreed: None, same: true },
        Row { name: "claim won: lead", who: w(0, 3), grace: 0.0, setup: claiming.to_vec(), event: Claim(true), expect: Out::Done, attention: true, round: I, agreed: None, same: false },
        Row { name: "claim lost: stand down", who: w(0, 3), grace: 0.0, setup: claiming.to_vec(), event: Claim(false), expect: Out::Done, attention: false, round: I, agreed: None, same: false },
        Row { name: "claim outcome without a claim is ignored", who: w(0, 3), grace: 0.0, setup: vec![], event: Claim(true), expect: Out::Done, attention: false, round: I, agreed: None, same: true },
        Row { name: "a second claim outcome is ignored", who: w(0, 3), grace: 0.0, setup: lost.to_vec(), event: Claim(true), expect: Out::Done, attention: false, round: I, agreed: None, same: true },
        Row { name: "after a lost claim steps proceed", who: w(0, 3), grace: 0.0, setup: lost.to_vec(), event: Before(5, 1.0), expect: PROCEED, attention: false, round: I, agreed: None, same: true },
        Row { name: "after a lost claim a notice is ignored", who: w(0, 3), grace: 0.0, setup: lost.to_vec(), event: Notice(2.0), expect: IGNORED, attention: false, round: I, agreed: None, same: true },
        Row { name: "after a lost claim the leader's key is followed", who: w(0, 3), grace: 0.0, setup: lost.to_vec(), event: Key(I, "6"), expect: ack(ack_i0, None), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "claim won: second notice ignored", who: w(0, 3), grace: 0.0, setup: leading.to_vec(), event: Notice(1.0), expect: IGNORED, attention: true, round: I, agreed: None, same: true },
        Row { name: "worker leader publishes runs + 1 with every ack key", who: w(0, 3), grace: 0.0, setup: leading.to_vec(), event: Before(5, 1.0), expect: publish(I, 6, &[ack_i0, ack_i1, ack_i2], Some("RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_0")), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "leader's own watcher acks its key", who: w(0, 3), grace: 0.0, setup: led.to_vec(), event: Key(I, "6"), expect: ack(ack_i0, None), attention: true, round: I, agreed: Some(6), same: true },
        Row { name: "leader saves at the published step", who: w(0, 3), grace: 0.0, setup: led.to_vec(), event: Before(6, 2.0), expect: save(I, 6), attention: true, round: I, agreed: Some(6), same: false },
        // --- Worker 1 of 3, grace 0: following ------------------------------
        Row { name: "follower: step key -> ack, no next round with grace 0", who: w(1, 3), grace: 0.0, setup: vec![], event: Key(I, "6"), expect: ack(ack_i1, None), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "follower: below the agreed step proceed", who: w(1, 3), grace: 0.0, setup: agreed.to_vec(), event: Before(5, 1.0), expect: PROCEED, attention: true, round: I, agreed: Some(6), same: true },
        Row { name: "follower: save at the agreed step", who: w(1, 3), grace: 0.0, setup: agreed.to_vec(), event: Before(6, 1.0), expect: save(I, 6), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "follower: notice after the agreed key is ignored", who: w(1, 3), grace: 0.0, setup: agreed.to_vec(), event: Notice(1.0), expect: IGNORED, attention: true, round: I, agreed: Some(6), same: true },
        Row { name: "follower: saved -> exit", who: w(1, 3), grace: 0.0, setup: follower_saving.to_vec(), event: Saved(I), expect: Out::Saved(Ok(SaveAction::Exit)), attention: false, round: I, agreed: Some(6), same: false },
        Row { name: "follower: a later value does not move the agreed step", who: w(1, 3), grace: 0.0, setup: agreed.to_vec(), event: Key(I, "9"), expect: ack(ack_i1, None), attention: true, round: I, agreed: Some(6), same: true },
        Row { name: "follower: surrounding whitespace is tolerated", who: w(1, 3), grace: 0.0, setup: vec![], event: Key(I, " 6\n"), expect: ack(ack_i1, None), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "STOP_WATCHER -> stop", who: w(1, 3), grace: 0.0, setup: vec![], event: Key(I, "STOP_WATCHER"), expect: Out::Key(Ok(KeyAction::Stop)), attention: false, round: I, agreed: None, same: true },
        Row { name: "malformed value: error, state unchanged", who: w(1, 3), grace: 0.0, setup: vec![], event: Key(I, "six"), expect: malformed("RUN_TO_CHECKPOINT", "six"), attention: false, round: I, agreed: None, same: true },
        Row { name: "empty value is malformed", who: w(1, 3), grace: 0.0, setup: vec![], event: Key(I, ""), expect: malformed("RUN_TO_CHECKPOINT", ""), attention: false, round: I, agreed: None, same: true },
        Row { name: "negative value after agreement is malformed, agreement kept", who: w(1, 3), grace: 0.0, setup: agreed.to_vec(), event: Key(I, "-1"), expect: malformed("RUN_TO_CHECKPOINT", "-1"), attention: true, round: I, agreed: Some(6), same: true },
        // --- Worker 3 of 4, grace 10: following both rounds -----------------
        Row { name: "grace: ack and watch the final key next", who: w(3, 4), grace: 10.0, setup: vec![], event: Key(I, "6"), expect: ack(ack_i3, Some(F)), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "follower: first save -> countdown, no attention", who: w(3, 4), grace: 10.0, setup: vec![Key(I, "6"), Before(6, 2.0)], event: Saved(I), expect: Out::Saved(Ok(SaveAction::Countdown)), attention: false, round: F, agreed: None, same: false },
        Row { name: "follower countdown: steps proceed on the hot path", who: w(3, 4), grace: 10.0, setup: f_countdown.to_vec(), event: Before(7, 9.99), expect: PROCEED, attention: false, round: F, agreed: None, same: true },
        Row { name: "follower countdown: its own notice is planned for (it may publish the final round)", who: w(3, 4), grace: 10.0, setup: f_countdown.to_vec(), event: Notice(2.5), expect: REPLAN, attention: true, round: F, agreed: None, same: false },
        Row { name: "final key: ack, nothing more to watch", who: w(3, 4), grace: 10.0, setup: f_countdown.to_vec(), event: Key(F, "9"), expect: ack(ack_f3, None), attention: true, round: F, agreed: Some(9), same: false },
        Row { name: "final key STOP_WATCHER -> stop", who: w(3, 4), grace: 10.0, setup: f_countdown.to_vec(), event: Key(F, "STOP_WATCHER"), expect: Out::Key(Ok(KeyAction::Stop)), attention: false, round: F, agreed: None, same: true },
        Row { name: "malformed final value names LAST_RUN_TO_CHECKPOINT", who: w(3, 4), grace: 10.0, setup: f_countdown.to_vec(), event: Key(F, "7.5"), expect: malformed("LAST_RUN_TO_CHECKPOINT", "7.5"), attention: false, round: F, agreed: None, same: true },
        Row { name: "follower: below the final step proceed", who: w(3, 4), grace: 10.0, setup: f_final_agreed.clone(), event: Before(8, 2.9), expect: PROCEED, attention: true, round: F, agreed: Some(9), same: true },
        Row { name: "follower: final save at the final step", who: w(3, 4), grace: 10.0, setup: f_final_agreed.clone(), event: Before(9, 3.0), expect: save(F, 9), attention: true, round: F, agreed: Some(9), same: false },
        Row { name: "follower: final save -> exit", who: w(3, 4), grace: 10.0, setup: f_final_saving.clone(), event: Saved(F), expect: Out::Saved(Ok(SaveAction::Exit)), attention: false, round: F, agreed: Some(9), same: false },
        Row { name: "final key before the first save is kept for later", who: w(3, 4), grace: 10.0, setup: agreed.to_vec(), event: Key(F, "8"), expect: ack(ack_f3, None), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "first save with the final key known -> countdown with attention", who: w(3, 4), grace: 10.0, setup: vec![Key(I, "6"), Key(F, "7"), Before(6, 2.0)], event: Saved(I), expect: Out::Saved(Ok(SaveAction::Countdown)), attention: true, round: F, agreed: Some(7), same: false },
        // --- Worker 0 of 2, grace 10: leading both rounds -------------------
        Row { name: "worker leader's own watcher watches the final key", who: w(0, 2), grace: 10.0, setup: led.to_vec(), event: Key(I, "6"), expect: ack(ack_i0, Some(F)), attention: true, round: I, agreed: Some(6), same: true },
        Row { name: "worker leader: countdown, not due", who: w(0, 2), grace: 10.0, setup: w_countdown.to_vec(), event: Before(7, 3.8), expect: PROCEED, attention: true, round: F, agreed: None, same: true },
        Row { name: "worker leader: final round with the final ack keys", who: w(0, 2), grace: 10.0, setup: w_countdown.to_vec(), event: Before(7, 5.0), expect: publish(F, 8, &["RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_0", "RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_1"], Some("RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_0")), attention: true, round: F, agreed: Some(8), same: false },
        Row { name: "worker leader: notice in countdown ignored", who: w(0, 2), grace: 10.0, setup: w_countdown.to_vec(), event: Notice(3.0), expect: IGNORED, attention: true, round: F, agreed: None, same: true },
        // --- Several notices, grace 10: the earliest deadline wins ----------
        Row { name: "tighter notice while claiming: planned for", who: w(0, 3), grace: 10.0, setup: claiming.to_vec(), event: NoticeBy(0.5, 3.0), expect: REPLAN, attention: false, round: I, agreed: None, same: false },
        Row { name: "a later deadline changes nothing", who: w(0, 2), grace: 10.0, setup: leading.to_vec(), event: NoticeBy(1.0, 20.0), expect: IGNORED, attention: true, round: I, agreed: None, same: true },
        Row { name: "an equal deadline changes nothing", who: w(0, 2), grace: 10.0, setup: leading.to_vec(), event: NoticeBy(1.0, 10.0), expect: IGNORED, attention: true, round: I, agreed: None, same: true },
        Row { name: "grace 0: a tighter notice is absorbed (the save is at once anyway)", who: w(0, 3), grace: 0.0, setup: leading.to_vec(), event: NoticeBy(0.5, 1.0), expect: IGNORED, attention: true, round: I, agreed: None, same: true },
        Row { name: "after exit a tighter notice is absorbed", who: l(), grace: 10.0, setup: local_final_done.clone(), event: NoticeBy(7.5, 8.0), expect: IGNORED, attention: false, round: F, agreed: Some(8), same: true },
        Row { name: "countdown, leader: a tighter notice is planned for", who: w(0, 2), grace: 10.0, setup: w_countdown.to_vec(), event: NoticeBy(2.5, 6.0), expect: REPLAN, attention: true, round: F, agreed: None, same: false },
        Row { name: "countdown, leader: the tighter deadline brings the final round forward", who: w(0, 2), grace: 10.0, setup: cat(&w_countdown, &[NoticeBy(2.5, 6.0)]), event: Before(7, 2.6), expect: publish(F, 8, &["RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_0", "RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_1"], Some("RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_0")), attention: true, round: F, agreed: Some(8), same: false },
        Row { name: "countdown, follower: its tighter deadline not yet due", who: w(3, 4), grace: 10.0, setup: cat(&f_countdown, &[NoticeBy(2.5, 20.0)]), event: Before(7, 2.6), expect: PROCEED, attention: true, round: F, agreed: None, same: true },
        Row { name: "countdown, follower: publishes the final round for its tighter deadline", who: w(3, 4), grace: 10.0, setup: cat(&f_countdown, &[NoticeBy(2.5, 6.0)]), event: Before(7, 2.6), expect: publish(F, 8, &ack_f, Some("RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_3")), attention: true, round: F, agreed: Some(8), same: false },
        Row { name: "a lost publish takes the key's value", who: w(3, 4), grace: 10.0, setup: cat(&f_countdown, &[NoticeBy(2.5, 6.0), Before(7, 2.6)]), event: Lost(F, "9"), expect: Out::Done, attention: true, round: F, agreed: Some(9), same: false },
        Row { name: "a lost publish to STOP_WATCHER keeps this worker's step", who: w(3, 4), grace: 10.0, setup: cat(&f_countdown, &[NoticeBy(2.5, 6.0), Before(7, 2.6)]), event: Lost(F, "STOP_WATCHER"), expect: Out::Done, attention: true, round: F, agreed: Some(8), same: true },
        Row { name: "a lost publish holding no run count is malformed, state kept", who: w(3, 4), grace: 10.0, setup: cat(&f_countdown, &[NoticeBy(2.5, 6.0), Before(7, 2.6)]), event: Lost(F, "x"), expect: malformed("LAST_RUN_TO_CHECKPOINT", "x"), attention: true, round: F, agreed: Some(8), same: true },
        Row { name: "then the final save is at the key's step", who: w(3, 4), grace: 10.0, setup: cat(&f_countdown, &[NoticeBy(2.5, 6.0), Before(7, 2.6), Lost(F, "9")]), event: Before(9, 3.0), expect: save(F, 9), attention: true, round: F, agreed: Some(9), same: false },
        Row { name: "before the first save: a final round due by then is published at the first round's step", who: w(3, 4), grace: 10.0, setup: vec![Key(I, "6"), NoticeBy(1.0, 4.0)], event: Before(5, 1.5), expect: publish(F, 6, &ack_f, Some("RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_3")), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "before the first save with room for both rounds: proceed", who: w(3, 4), grace: 30.0, setup: vec![Key(I, "6"), NoticeBy(1.0, 30.0)], event: Before(5, 1.5), expect: PROCEED, attention: true, round: I, agreed: Some(6), same: true },
        Row { name: "at the first round's step the first save comes first", who: w(3, 4), grace: 10.0, setup: vec![Key(I, "6"), NoticeBy(1.0, 4.0)], event: Before(6, 1.5), expect: save(I, 6), attention: true, round: I, agreed: Some(6), same: false },
        Row { name: "one save: the first save with the final round at its step exits", who: w(3, 4), grace: 10.0, setup: vec![Key(I, "6"), Key(F, "6"), Before(6, 2.0)], event: Saved(I), expect: Out::Saved(Ok(SaveAction::Exit)), attention: false, round: F, agreed: Some(6), same: false },
        Row { name: "one save: the leader publishes both rounds before the step", who: w(0, 2), grace: 10.0, setup: vec![NoticeBy(0.0, 4.0), Claim(true), Before(5, 1.0)], event: Before(5, 1.0), expect: publish(F, 6, &["RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_0", "RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_1"], Some("RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_0")), attention: true, round: I, agreed: Some(6), same: false },
    ]
}

/// Whether `to` follows `from` by zero or more moves of [`PHASE_MOVES`] (one
/// event of a simulated cluster may make several: a publish that agrees a
/// round and the save at the same check). `pub(crate)`: the simulated
/// clusters, tests of a module above this one, check their steps with it.
pub(crate) fn reachable(from: Phase, to: Phase) -> bool {
    let mut seen = vec![from];
    let mut i = 0;
    while i < seen.len() {
        let here = seen[i];
        for &(a, _, b) in PHASE_MOVES {
            if a == here && !seen.contains(&b) {
                seen.push(b);
            }
        }
        i += 1;
    }
    seen.contains(&to)
}

/// The phases as the diagram draws them: every phase is reached from
/// Training, every phase but the exits leads on, and each move's name says
/// what makes it.
#[test]
fn phase_moves_are_the_diagram() {
    let all = [
        Phase::Training,
        Phase::Agreed(Round::Initial),
        Phase::Saving(Round::Initial),
        Phase::Countdown,
        Phase::Agreed(Round::Final),
        Phase::Saving(Round::Final),
        Phase::Exited(Round::Initial),
        Phase::Exited(Round::Final),
    ];
    for p in all {
        assert!(reachable(Phase::Training, p), "{p:?} cannot be reached");
        let leads_on = PHASE_MOVES.iter().any(|&(a, _, _)| a == p);
        assert_eq!(leads_on, !matches!(p, Phase::Exited(_)), "{p:?}");
    }
    for &(a, why, b) in PHASE_MOVES {
        assert_ne!(a, b, "{why}");
        // The one loop: a failed save is asked for again at the same step.
        let retry = matches!((a, b), (Phase::Agreed(r), Phase::Saving(q)) | (Phase::Saving(r), Phase::Agreed(q)) if r == q);
        assert!(!reachable(b, a) || retry, "{a:?} -> {b:?} ({why}) goes back");
    }
}

#[test]
fn every_transition() {
    let planner = table_planner();
    let table = transition_table();
    assert!(table.len() >= 60);
    for row in &table {
        let name = row.name;
        let mut r = Resolver::new(row.who.clone(), row.grace);
        for ev in &row.setup {
            let out = apply(&mut r, ev, &planner);
            assert!(
                !matches!(out, Out::Key(Err(_)) | Out::Saved(Err(_))),
                "{name}: setup event {ev:?} failed: {out:?}"
            );
        }
        let attention_before = r.needs_attention();
        let phase_before = r.phase();
        let before = format!("{r:?}");
        let out = apply(&mut r, &row.event, &planner);
        let after = format!("{r:?}");
        assert_eq!(out, row.expect, "{name}: outcome");
        assert_eq!(r.needs_attention(), row.attention, "{name}: needs_attention after");
        assert_eq!(r.round(), row.round, "{name}: round");
        assert_eq!(r.agreed_step(), row.agreed, "{name}: agreed step");
        let (from, to) = (phase_before, r.phase());
        assert!(
            from == to || PHASE_MOVES.iter().any(|&(a, _, b)| (a, b) == (from, to)),
            "{name}: {from:?} -> {to:?} is no move of PHASE_MOVES"
        );
        assert_eq!(
            before == after,
            row.same,
            "{name}: state changed?\n before {before}\n after  {after}"
        );
        // Errors and ignored notices never change anything.
        if matches!(out, Out::Key(Err(_)) | Out::Saved(Err(_)) | Out::Notice(NoticeAction::Absorb)) {
            assert_eq!(before, after, "{name}: a rejected event changed the state");
        }
        // The hot-path contract, checked on every row that calls before_step.
        if let (Ev::Before(..), Out::Step(d)) = (&row.event, &out) {
            if !attention_before {
                assert_eq!(*d, StepAction::Proceed, "{name}: no attention, yet not Proceed");
                assert_eq!(before, after, "{name}: no attention, yet the state changed");
            }
            if matches!(d, StepAction::Publish { .. } | StepAction::Save { .. }) {
                assert!(attention_before, "{name}: {d:?} without needs_attention");
            }
        }
    }
}

#[test]
fn key_strings_are_tensorflows() {
    assert_eq!(TERMINATED_WORKER, "TERMINATED_WORKER");
    assert_eq!(RUN_TO_CHECKPOINT, "RUN_TO_CHECKPOINT");
    assert_eq!(LAST_RUN_TO_CHECKPOINT, "LAST_RUN_TO_CHECKPOINT");
    assert_eq!(STOP_WATCHER, "STOP_WATCHER");
    assert_eq!(ACK_VALUE, "1");
    assert_eq!(PREEMPTION_NOTICE_KEY, "TF_DEFAULT_PREEMPTION_NOTICE_KEY");
    assert_eq!(CHECKPOINTED_RUNS, "checkpointed_runs");
    assert_eq!(Round::Initial.key(), "RUN_TO_CHECKPOINT");
    assert_eq!(Round::Final.key(), "LAST_RUN_TO_CHECKPOINT");
    assert_eq!(Round::Initial.ack_key("0"), "RECEIVED_SIGNAL_RUN_TO_CHECKPOINT_0");
    assert_eq!(Round::Final.ack_key("3"), "RECEIVED_SIGNAL_LAST_RUN_TO_CHECKPOINT_3");
    assert_eq!(Membership::Local.id(), "single_worker");
    assert_eq!(w(7, 8).id(), "7");
    let local = Resolver::new(Membership::Local, 0.0);
    assert_eq!(local.id(), "single_worker");
    assert_eq!(local.membership(), &Membership::Local);
    assert_eq!(local.grace_period(), 0.0);
    assert_eq!(Resolver::new(w(12, 13), 5.0).id(), "12");
}

#[test]
fn shutdown_keys_local_vs_worker() {
    assert!(Resolver::new(Membership::Local, 0.0).shutdown_keys().is_empty());
    assert!(Resolver::new(Membership::Local, 10.0).shutdown_keys().is_empty());
    for grace in [0.0, 10.0] {
        assert_eq!(
            Resolver::new(w(1, 2), grace).shutdown_keys(),
            &["RUN_TO_CHECKPOINT", "LAST_RUN_TO_CHECKPOINT"]
        );
    }
}

#[test]
fn accessors_follow_the_leader_through_both_rounds() {
    let planner = table_planner();
    let mut r = Resolver::new(w(2, 3), 10.0);
    let notice = Notice::stated(0.0, Some(50.0));
    assert_eq!(r.leading_notice(), None);
    assert!(matches!(r.on_notice(notice), NoticeAction::Claim { .. }));
    assert_eq!(r.leading_notice(), None, "not before the claim is won");
    r.on_claim(true);
    assert_eq!(r.leading_notice(), Some(notice));
    assert!(!r.counting_down());
    assert!(matches!(r.before_step(0, 0.1, &planner), StepAction::Publish { step: 1, .. }));
    assert_eq!(r.before_step(1, 0.2, &planner), StepAction::Save { round: I, step: 1 });
    assert_eq!(r.on_saved(I), Ok(SaveAction::Countdown));
    assert!(r.counting_down());
    assert!(!r.exited());
    assert!(matches!(
        r.before_step(1, 5.0, &planner),
        StepAction::Publish { round: F, step: 2, .. }
    ));
    assert_eq!(r.before_step(2, 5.1, &planner), StepAction::Save { round: F, step: 2 });
    assert_eq!(r.on_saved(F), Ok(SaveAction::Exit));
    assert!(r.exited());
    assert!(!r.needs_attention());
}

#[test]
fn no_notice_means_the_hot_path_forever() {
    let planner = GracePlanner::without_exit_reserve();
    for who in [Membership::Local, w(0, 1), w(3, 8)] {
        for grace in [0.0, 30.0] {
            let mut r = Resolver::new(who.clone(), grace);
            let before = format!("{r:?}");
            for runs in 0..10_000u64 {
                assert!(!r.needs_attention());
                #[allow(clippy::cast_precision_loss)]
                let now = runs as f64 * 0.01;
                assert_eq!(r.before_step(runs, now, &planner), StepAction::Proceed);
            }
            assert_eq!(format!("{r:?}"), before);
        }
    }
}

/// Regression: a NaN grace period once made `on_step_key` (`grace > 0`: no
/// final round) and `on_saved` (`grace <= 0`: no exit) disagree, so the
/// cluster never exited. `Resolver::new` now decides once.
#[test]
fn nan_grace_period_is_treated_consistently() {
    let mut r = Resolver::new(w(1, 2), f64::NAN);
    let KeyAction::Acknowledge { next_round, .. } = r.on_step_key(I, "6").unwrap() else {
        panic!("a run count is acknowledged");
    };
    assert_eq!(
        r.before_step(6, 1.0, &GracePlanner::without_exit_reserve()),
        StepAction::Save { round: I, step: 6 }
    );
    let after = r.on_saved(I).unwrap();
    // Either no grace period (exit now) or a final round the watcher waits for.
    assert!(
        after == SaveAction::Exit || next_round == Some(F),
        "on_saved -> {after:?} but the watcher was told next_round = {next_round:?}"
    );
}

#[test]
fn a_ps_coordinator_saves_at_the_run_count_of_the_check_that_publishes() {
    let planner = GracePlanner::without_exit_reserve();
    let mut r = Resolver::new(Membership::Local, 0.0);
    r.save_at_current_run();
    assert_eq!(r.on_notice(Notice::stated(1.0, None)), NoticeAction::Lead);
    assert_eq!(
        r.before_step(40, 1.0, &planner),
        StepAction::Publish {
            round: I,
            step: 40,
            ack_keys: vec![],
            own_ack_key: None
        }
    );
    // Asked again at the same run count (the same check): save now, at 40.
    assert_eq!(r.before_step(40, 1.0, &planner), StepAction::Save { round: I, step: 40 });
    assert_eq!(r.on_saved(I), Ok(SaveAction::Exit));
}

#[test]
fn save_at_current_run_is_for_local_mode_only() {
    let planner = GracePlanner::without_exit_reserve();
    let mut r = Resolver::new(w(0, 2), 0.0);
    r.save_at_current_run();
    assert!(matches!(r.on_notice(Notice::stated(1.0, None)), NoticeAction::Claim { .. }));
    r.on_claim(true);
    let StepAction::Publish { step, .. } = r.before_step(40, 1.0, &planner) else {
        panic!("the leader publishes");
    };
    assert_eq!(step, 41, "workers of MultiWorkerMirroredStrategy keep the next run");
}

#[test]
fn what_the_notice_says_fits_is_what_the_resolver_does() {
    // The planner's `fit` at the notice says "one save" exactly when the resolver,
    // at the first round's publish, agrees the final round at the same step.
    let mut planner = GracePlanner::without_exit_reserve();
    for _ in 0..20 {
        planner.record_step(0.1);
    }
    planner.record_save(2.0);
    for tenths in 40..120 {
        let deadline = f64::from(tenths) / 10.0;
        let notice = Notice::stated(0.0, Some(deadline));
        let mut r = Resolver::new(Membership::Local, 60.0);
        assert_eq!(r.on_notice(notice), NoticeAction::Lead);
        let StepAction::Publish { round: I, step, .. } = r.before_step(5, 0.0, &planner) else {
            panic!("the first round is published");
        };
        let merged = matches!(r.before_step(5, 0.0, &planner), StepAction::Publish { round: F, .. });
        let (fit, _, _) = planner.fit(notice, 60.0, 0.0);
        assert_eq!(merged, fit != crate::grace::Fit::Both, "deadline {deadline}: {fit:?}, step {step}");
    }
}

#[test]
fn the_users_grace_period_makes_two_saves_however_short() {
    // TensorFlow's failure_handler_test: a grace period of 1 s, shorter than a save.
    // TensorFlow saves twice; so does the resolver, the final round at the next step.
    let mut planner = GracePlanner::without_exit_reserve();
    for _ in 0..20 {
        planner.record_step(0.1);
    }
    planner.record_save(2.0);
    let notice = Notice::stated(0.0, None);
    let mut r = Resolver::new(Membership::Local, 1.0);
    assert_eq!(r.on_notice(notice), NoticeAction::Lead);
    assert_eq!(planner.fit(notice, 1.0, 0.0).0, crate::grace::Fit::Both);
    let StepAction::Publish { round: I, step, .. } = r.before_step(5, 0.0, &planner) else {
        panic!("the first round is published");
    };
    assert_eq!(r.before_step(5, 0.0, &planner), StepAction::Proceed, "the final round waits");
    assert_eq!(r.before_step(step, 0.1, &planner), StepAction::Save { round: I, step });
    assert_eq!(r.on_saved(I), Ok(SaveAction::Countdown), "the first save is not the last");
    let StepAction::Publish { round: F, step: last, .. } = r.before_step(step, 2.5, &planner) else {
        panic!("the final round is published after the first save");
    };
    assert!(last > step, "a later step: a second save");
    assert_eq!(r.before_step(last, 2.6, &planner), StepAction::Save { round: F, step: last });
    assert_eq!(r.on_saved(F), Ok(SaveAction::Exit));
}

#[test]
fn a_platform_deadline_tighter_than_the_grace_period_still_makes_one_save() {
    let mut planner = GracePlanner::without_exit_reserve();
    for _ in 0..20 {
        planner.record_step(0.1);
    }
    planner.record_save(2.0);
    // (platform deadline, the grace period binds, the first save is the last)
    let rows = [
        (Some(3.0), false, true),
        (Some(30.0), false, false),
        (Some(60.0), true, false),
        (None, true, false),
    ];
    for (deadline, binds, merged) in rows {
        let notice = Notice::stated(0.0, deadline);
        let mut r = Resolver::new(Membership::Local, 30.0);
        assert_eq!(r.on_notice(notice), NoticeAction::Lead);
        assert!(matches!(r.before_step(5, 0.0, &planner), StepAction::Publish { round: I, .. }));
        let final_at_once = matches!(r.before_step(5, 0.0, &planner), StepAction::Publish { round: F, .. });
        assert_eq!(final_at_once, merged, "deadline {deadline:?}");
        assert_eq!(GracePlanner::grace_binds(notice, 30.0), binds, "deadline {deadline:?}");
    }
}

#[test]
fn write_timeout_table() {
    // (peer timeout, bound of a claim, acknowledgement or publish, announce bound)
    let rows: &[(f64, f64, f64)] = &[
        (0.2, MIN_WRITE_TIMEOUT, MIN_WRITE_TIMEOUT),
        (1.0, 1.0, 1.0),
        (5.0, 5.0, 5.0),
        (30.0, 30.0, SHUTDOWN_WRITE_TIMEOUT),
        (300.0, COORDINATION_WRITE_TIMEOUT, SHUTDOWN_WRITE_TIMEOUT),
    ];
    for &(peer, write, announce) in rows {
        assert_eq!(write_timeout(peer, WriteBound::Protocol), write, "peer timeout {peer}");
        assert_eq!(write_timeout(peer, WriteBound::Announce), announce, "peer timeout {peer}");
    }
}
