//! A step that failed, as events in and actions out: whether a peer is gone (issue 62).
//!
//! `run()`'s step raised. The handler reports the error to the cluster and raises it,
//! as TensorFlow does; before that, the protocol decides whether the peers are worth a
//! health probe, and what the probe's answer means:
//!
//! 1. `Event.StepFailed(code, message)`: the error's canonical code (None: not one of
//!    TensorFlow's `OpError`s) and its message. The answer is `Action.Probe` when the
//!    error can come from a peer that is gone, else `Action.Raise`. A lost peer
//!    ([`lost_peer`]) is probed; so is every other error of the codes a gone peer can
//!    cause (cancelled, deadline exceeded, aborted, internal, unavailable) or of an
//!    aborted collective, to name in the error the peers that do not answer, as
//!    before. A peer lost inside a preemption's round shows no such text: the
//!    error is the protocol's own (a call to the coordination service that gave up,
//!    or acknowledgements missing at the peer timeout), and the protocol, which
//!    raised it, suspects a lost peer itself ([`Protocol::unanswered`]).
//!    The probe then finds which.
//! 2. `Event.Probed(unreachable)`: the worker ids that did not answer. A lost peer the
//!    text suggested is **confirmed** when at least one peer did not answer: the answer
//!    is `Action.PeerLost` with the lost workers, how the loss showed itself, and
//!    whether this worker is the survivor that writes (the lowest worker id that
//!    answered, itself included: the chief when it lives). Otherwise `Action.Raise`.
//!
//! A suspicion the probe does not confirm (every peer answered) came from something
//! that is not a peer, a remote service the step reads for example, and raises as any
//! other error.
//!
//! The writers agree through the checkpoint folder itself, which every survivor reaches
//! when the chief, and the coordination service with it, is gone:
//!
//! 3. `Event.Job()`, once at the start: the chief of a cluster that holds its steps
//!    marks the folder with this job's token (`Action.MarkJob`); every other worker
//!    reads it at its first held step (`Action.ReadJob`), when the chief's mark is
//!    there (its first step's collectives needed the chief, which marked first).
//! 4. The writer reads the folder's claims of this job (`Event.Claims`): it refuses to
//!    write when a newer job has marked the folder, or when a claim already names it
//!    lost (it was paused, or cut off, and the others saved first). Else it saves its
//!    checkpoint under a name of its own, then writes its claim: `(writer, runs,
//!    lost)`, written after the checkpoint's files, so a claim names a whole checkpoint.
//! 5. It reads the claims again (`Event.Claims`), and the state file is made to name
//!    the winner, the claim of the most runs (the lowest writer on a tie), until a read
//!    after its own naming finds the same winner. Whatever order the writers' files
//!    reach the folder in, the last naming names the winner of every claim: a writer
//!    names only after its claim is there, and reads again after naming. So a network
//!    cut's two sides both save, and the state file ends naming one whole checkpoint.
//!    A writer that reads the winner's claim deletes its own checkpoint; one that
//!    settled before a later claim landed keeps its files until the next job's mark
//!    clears every claim's checkpoint the state file does not list.

use crate::failure::lost_peer::{lost_peer, Detection, LostPeer, DEADLINE_EXCEEDED, UNAVAILABLE};
use crate::grace::EXIT_GUARD_LEAD;
use crate::words::Words;

use super::{Action, Protocol};

/// TF's canonical codes (`tf.errors`) of the errors a peer that is gone can cause,
/// besides `UNAVAILABLE`: a collective cancelled or aborted, a call past its deadline,
/// a collective's internal error.
const CANCELLED: i64 = 1;
const ABORTED: i64 = 10;
const INTERNAL: i64 = 13;
const MAY_BE_A_PEER: [i64; 5] = [CANCELLED, DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNAVAILABLE];

/// What an aborted collective's message starts with, whatever its code.
const COLLECTIVE_ABORTED: &str = "Collective ops is aborted";

/// A survivor's claim, read back from the checkpoint folder: `(writer, runs, lost)`,
/// the worker that saved, the run count of the step it saved, and the workers it
/// found lost.
pub type Claim = (u32, u64, Vec<u32>);

/// Where this worker's survivors' save is (it is the writer `Action.PeerLost` named).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Writing {
    /// The folder's claims are read before anything is written.
    Checking,
    /// Its checkpoint and its claim are written: the state file was made to name
    /// `named` (writer, runs; None: not yet), `rounds` times.
    Naming { named: Option<(u32, u64)>, rounds: u32 },
}

/// Seconds between two looks for the chief's checkpoint ([`Protocol::handle_confirm`]):
/// a read of the folder's small state file.
pub const LOOK_INTERVAL: f64 = 0.1;
/// Seconds between two probes of the peers while the chief's checkpoint is awaited.
pub const CHIEF_PROBE_INTERVAL: f64 = 1.0;

/// A non-chief's wait for the chief's checkpoint of the round it saved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Confirming {
    /// When the wait started.
    started: f64,
    /// When the peers were probed last.
    probed: Option<f64>,
    /// How many probes were made.
    probes: u32,
}

/// The failed step the protocol asked to probe the peers for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Probing {
    /// The lost peer the error's text suggests, if it does.
    suspect: Option<LostPeer>,
}

impl Protocol {
    /// `run()`'s step raised an error with canonical `code` (None: not TF's) and
    /// `message`: the step is not counted, and the answer is `Action.Probe` (the peers
    /// are worth a health probe, `Event.Probed` follows) or `Action.Raise`.
    pub fn handle_step_failed(&mut self, code: Option<i64>, message: &str) -> Action {
        self.step_failed();
        self.probing = None;
        let in_cluster = self.in_cluster();
        let Some(code) = code.filter(|_| in_cluster) else {
            return Action::Raise {};
        };
        let hint = self.unanswered.take();
        let suspect = lost_peer(code, message).or_else(|| {
            hint.map(|detection| LostPeer {
                detection,
                tasks: Vec::new(),
            })
        });
        if suspect.is_none() && !MAY_BE_A_PEER.contains(&code) && !message.contains(COLLECTIVE_ABORTED) {
            return Action::Raise {};
        }
        let action = Action::Probe {
            suspects: suspect.as_ref().map(|s| s.tasks.clone()).unwrap_or_default(),
            detection: suspect.as_ref().map(|s| s.detection.word().to_owned()),
        };
        self.probing = Some(Probing { suspect });
        action
    }

    /// A call of the preemption protocol gave up, or acknowledgements were missing
    /// (`detection`): the error it raises names no peer, so the next failed step
    /// (that error, reported) suspects a lost one, which the probe confirms or not.
    pub(super) fn unanswered(&mut self, detection: Detection) {
        self.unanswered = Some(detection);
    }

    /// The probe `Action.Probe` asked for found the workers `unreachable` (their ids)
    /// not answering: `Action.PeerLost` when that confirms a lost peer, else
    /// `Action.Raise`.
    pub fn handle_probed(&mut self, unreachable: &[u32]) -> Action {
        let probing = self.probing.take();
        let Some(Probing { suspect: Some(suspect) }) = probing else {
            return Action::Raise {};
        };
        self.peer_lost(unreachable, suspect.detection)
    }

    /// The peers `unreachable` (ids) are lost, as `detection` showed: `Action.PeerLost`,
    /// naming the writer (the lowest worker id that answered, this one included), or
    /// `Action.Raise` when none of them is another worker of the cluster.
    fn peer_lost(&mut self, unreachable: &[u32], detection: Detection) -> Action {
        let Some((Some(me), num_workers)) = self.config.map(|c| (c.worker_id, c.num_workers)) else {
            return Action::Raise {};
        };
        let mut lost: Vec<u32> = unreachable.iter().copied().filter(|&id| id != me && id < num_workers).collect();
        lost.sort_unstable();
        lost.dedup();
        if lost.is_empty() {
            return Action::Raise {};
        }
        let writer = (0..num_workers).find(|id| !lost.contains(id));
        let writes = self.lost_worker_saves && writer == Some(me);
        self.writing = writes.then_some(Writing::Checking);
        Action::PeerLost {
            lost,
            detection: detection.word().to_owned(),
            writes,
        }
    }

    /// A non-chief that saved a preemption's last round looked for the chief's
    /// checkpoint of it at `now`: `seen`, whether the folder's state file names it;
    /// `unreachable`, when it probed the peers first (as `Action.Probe` asked), the
    /// ids of those that did not answer (the look came after the probe).
    ///
    /// The answer: `Action.Proceed` (seen, or nothing to confirm: the chief, a
    /// single worker, survivors that do not save), `Action.Look` (look again in
    /// `seconds`), `Action.Probe` (probe the peers, then look; once a second),
    /// `Action.PeerLost` (the chief did not answer and its checkpoint is not
    /// there: the survivors save the round's step, which every survivor holds,
    /// then exit as after the save) or `Action.GaveUp` (the chief still answers,
    /// and the peer timeout, or the platform's stated end, passed: exit without).
    pub fn handle_confirm(&mut self, seen: bool, unreachable: Option<&[u32]>, now: f64) -> Action {
        let me = self.config.and_then(|c| c.worker_id);
        if seen || !self.holds_steps() || me == Some(0) {
            self.confirming = None;
            return Action::Proceed {};
        }
        let mut confirming = self.confirming.take().unwrap_or(Confirming {
            started: now,
            probed: None,
            probes: 0,
        });
        if let Some(unreachable) = unreachable {
            confirming.probed = Some(now);
            confirming.probes += 1;
            if unreachable.contains(&0) {
                return self.peer_lost(unreachable, Detection::UnfinishedSave);
            }
        }
        let waited = now - confirming.started;
        // While the chief answers, for the peer timeout; never past the platform's end.
        let end = self.kill_deadline().map_or(self.peer_timeout, |kill| {
            (kill - EXIT_GUARD_LEAD - confirming.started).min(self.peer_timeout)
        });
        if waited >= end {
            return Action::GaveUp {
                what: "waiting for the chief's checkpoint of the round this worker saved".to_owned(),
                attempts: confirming.probes,
                seconds: waited,
            };
        }
        self.confirming = Some(confirming);
        match confirming.probed {
            Some(at) if now - at < CHIEF_PROBE_INTERVAL => Action::Look {
                seconds: LOOK_INTERVAL.min(end - waited),
            },
            _ => Action::Probe {
                suspects: Vec::new(),
                detection: None,
            },
        }
    }

    /// At the start: `Action.MarkJob` (the chief of a cluster that holds its steps
    /// marks the checkpoint folder with this job's token), `Action.ReadJob` (another
    /// worker of it reads the token at its first held step), or `Action.Proceed`.
    pub fn handle_job(&self) -> Action {
        match self.config.and_then(|c| c.worker_id) {
            Some(0) if self.holds_steps() => Action::MarkJob {},
            Some(_) if self.holds_steps() => Action::ReadJob {},
            _ => Action::Proceed {},
        }
    }

    /// The writer read the folder: `current`, whether its job's mark is still the
    /// folder's (no newer job started), and `claims`, the claims of its job, at
    /// `unix_now` (the time a naming records in the state file).
    ///
    /// Before it wrote: `Action.SaveLastStep` (save, then write the claim, then read
    /// again) or `Action.Refuse`. After: `Action.NameLatest` (make the state file
    /// name that claim's checkpoint, then read again), `Action.Settled` (a read after
    /// the last naming found the same winner) or `Action.Refuse`. Not the writer:
    /// `Action.Raise`.
    pub fn handle_claims(&mut self, current: bool, claims: &[Claim], unix_now: f64) -> Action {
        let (Some(writing), Some(config)) = (self.writing.take(), self.config) else {
            return Action::Raise {};
        };
        let Some(me) = config.worker_id else {
            return Action::Raise {};
        };
        let newer = || "a newer job has marked the checkpoint folder since (this worker was paused or cut off)".to_owned();
        match writing {
            Writing::Checking => {
                if !current {
                    return Action::Refuse {
                        why: newer(),
                        discard: false,
                    };
                }
                if let Some((writer, ..)) = claims.iter().find(|(writer, _, lost)| *writer != me && lost.contains(&me)) {
                    return Action::Refuse {
                        why: format!("worker {writer} found this worker lost and saved first (it was paused or cut off)"),
                        discard: false,
                    };
                }
                self.writing = Some(Writing::Naming { named: None, rounds: 0 });
                Action::SaveLastStep {}
            }
            Writing::Naming { named, rounds } => {
                if !current {
                    return Action::Refuse {
                        why: newer(),
                        discard: true,
                    };
                }
                let Some(winner) = winner(claims) else {
                    return Action::Refuse {
                        why: "its claim is not in the checkpoint folder".to_owned(),
                        discard: true,
                    };
                };
                if named == Some(winner) {
                    return Action::Settled {
                        writer: winner.0,
                        discard: winner.0 != me,
                    };
                }
                // Each naming after the first follows a claim that was not there
                // before, and a job has at most one claim per worker.
                if rounds > config.num_workers {
                    return Action::Refuse {
                        why: format!("the claims did not settle after {rounds} namings"),
                        discard: false,
                    };
                }
                self.writing = Some(Writing::Naming {
                    named: Some(winner),
                    rounds: rounds + 1,
                });
                Action::NameLatest {
                    writer: winner.0,
                    runs: winner.1,
                    unix_time: unix_now,
                }
            }
        }
    }
}

/// The claim whose checkpoint the state file names: the most runs, then the lowest
/// writer. `(writer, runs)`; None without a claim.
fn winner(claims: &[Claim]) -> Option<(u32, u64)> {
    claims
        .iter()
        .map(|(writer, runs, _)| (*writer, *runs))
        .max_by_key(|&(writer, runs)| (runs, std::cmp::Reverse(writer)))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::protocol::Config;

    const RESET: &str = "Collective ops is aborted by: recvmsg:Connection reset by peer \
                         {grpc_status:14, remote target /job:worker/replica:0/task:1}";

    /// Worker `worker_id` of `num_workers`, no grace period, `peer_timeout` seconds.
    pub(in crate::protocol) fn configured(worker_id: Option<u32>, num_workers: u32, peer_timeout: f64) -> Protocol {
        let mut p = Protocol::new();
        p.configure(Config {
            worker_id,
            num_workers,
            grace_period: 0.0,
            save_at_current_run: false,
            peer_timeout,
        })
        .expect("a valid configuration");
        p
    }

    fn protocol(worker_id: Option<u32>, num_workers: u32) -> Protocol {
        configured(worker_id, num_workers, 30.0)
    }

    #[test]
    fn a_lost_peer_is_probed_and_confirmed_by_the_probe() {
        let mut p = protocol(Some(0), 3);
        assert_eq!(
            p.handle_step_failed(Some(UNAVAILABLE), RESET),
            Action::Probe {
                suspects: vec!["/job:worker/replica:0/task:1".to_owned()],
                detection: Some("connection lost".to_owned()),
            }
        );
        assert_eq!(
            p.handle_probed(&[1]),
            Action::PeerLost {
                lost: vec![1],
                detection: "connection lost".to_owned(),
                writes: true,
            }
        );
        // One answer per failed step.
        assert_eq!(p.handle_probed(&[1]), Action::Raise {});
    }

    #[test]
    fn the_lowest_worker_that_answered_writes() {
        // The chief (0) is lost: worker 1 writes, worker 2 does not.
        for (me, writes) in [(1, true), (2, false)] {
            let mut p = protocol(Some(me), 3);
            let _ = p.handle_step_failed(Some(UNAVAILABLE), RESET);
            assert_eq!(
                p.handle_probed(&[0, 0, me, 7]),
                Action::PeerLost {
                    lost: vec![0],
                    detection: "connection lost".to_owned(),
                    writes,
                },
                "worker {me}"
            );
        }
    }

    #[test]
    fn a_suspicion_every_peer_answers_raises() {
        let mut p = protocol(Some(1), 2);
        assert!(matches!(p.handle_step_failed(Some(UNAVAILABLE), RESET), Action::Probe { .. }));
        assert_eq!(p.handle_probed(&[]), Action::Raise {});
    }

    #[test]
    fn errors_a_gone_peer_can_cause_are_probed_to_name_it_but_lose_no_peer() {
        let mut p = protocol(Some(0), 2);
        for (code, message) in [
            (DEADLINE_EXCEEDED, "deadline exceeded"),
            (ABORTED, "aborted"),
            (3, "Collective ops is aborted by: Error reported from /job:worker/task:1: bad input"),
        ] {
            assert_eq!(
                p.handle_step_failed(Some(code), message),
                Action::Probe {
                    suspects: vec![],
                    detection: None
                },
                "{code} {message}"
            );
            assert_eq!(p.handle_probed(&[1]), Action::Raise {}, "{code} {message}");
        }
    }

    #[test]
    fn the_last_whole_step_is_held_in_a_cluster_of_several_workers_only() {
        assert!(protocol(Some(1), 2).holds_steps());
        assert!(!protocol(Some(0), 1).holds_steps());
        assert!(!protocol(None, 1).holds_steps());
        assert!(!Protocol::new().holds_steps());
        // Configured not to save: nothing held, the loss named, nobody writes.
        let mut p = protocol(Some(0), 2);
        p.set_lost_worker_saves(false);
        assert!(!p.holds_steps());
        let _ = p.handle_step_failed(Some(UNAVAILABLE), RESET);
        assert!(matches!(p.handle_probed(&[1]), Action::PeerLost { writes: false, .. }));
    }

    #[test]
    fn a_bug_a_non_tf_error_and_local_mode_raise_without_a_probe() {
        let mut p = protocol(Some(0), 2);
        assert_eq!(p.handle_step_failed(Some(3), "Incompatible shapes"), Action::Raise {});
        assert_eq!(p.handle_step_failed(Some(8), "OOM when allocating tensor"), Action::Raise {});
        assert_eq!(p.handle_step_failed(None, "ValueError"), Action::Raise {});
        for mut p in [protocol(None, 1), protocol(Some(0), 1), Protocol::new()] {
            assert_eq!(p.handle_step_failed(Some(UNAVAILABLE), RESET), Action::Raise {});
            assert_eq!(p.handle_probed(&[1]), Action::Raise {});
        }
    }

    /// The Unix time of the tests' folder reads.
    const T: f64 = 1.0e9;

    /// Worker `me` of `n`, named the writer after losing `lost`.
    fn writer(me: u32, n: u32, lost: &[u32]) -> Protocol {
        let mut p = protocol(Some(me), n);
        let _ = p.handle_step_failed(Some(UNAVAILABLE), RESET);
        assert!(matches!(p.handle_probed(lost), Action::PeerLost { writes: true, .. }));
        p
    }

    #[test]
    fn the_chief_marks_the_job_and_the_others_read_the_mark() {
        assert_eq!(protocol(Some(0), 2).handle_job(), Action::MarkJob {});
        assert_eq!(protocol(Some(1), 2).handle_job(), Action::ReadJob {});
        assert_eq!(protocol(Some(0), 1).handle_job(), Action::Proceed {});
        let mut p = protocol(Some(0), 2);
        p.set_lost_worker_saves(false);
        assert_eq!(p.handle_job(), Action::Proceed {});
    }

    #[test]
    fn a_lone_writer_saves_names_its_own_checkpoint_and_settles() {
        let mut p = writer(0, 2, &[1]);
        assert_eq!(p.handle_claims(true, &[], T), Action::SaveLastStep {});
        let mine = [(0, 50, vec![1])];
        assert_eq!(
            p.handle_claims(true, &mine, T),
            Action::NameLatest {
                writer: 0,
                runs: 50,
                unix_time: T
            }
        );
        assert_eq!(p.handle_claims(true, &mine, T), Action::Settled { writer: 0, discard: false });
        // Over: another read answers nothing to do.
        assert_eq!(p.handle_claims(true, &mine, T), Action::Raise {});
    }

    #[test]
    fn a_worker_that_is_not_the_writer_is_not_asked_about_claims() {
        let mut p = protocol(Some(2), 3);
        let _ = p.handle_step_failed(Some(UNAVAILABLE), RESET);
        assert!(matches!(p.handle_probed(&[0]), Action::PeerLost { writes: false, .. }));
        assert_eq!(p.handle_claims(true, &[], T), Action::Raise {});
    }

    #[test]
    fn a_newer_job_or_a_claim_that_names_the_writer_lost_refuses_the_save() {
        let mut p = writer(0, 2, &[1]);
        assert!(matches!(p.handle_claims(false, &[], T), Action::Refuse { discard: false, .. }));
        // Paused, then resumed: worker 1 found it lost and saved first.
        let mut p = writer(0, 2, &[1]);
        match p.handle_claims(true, &[(1, 49, vec![0])], T) {
            Action::Refuse { why, discard } => {
                assert!(why.contains("worker 1 found this worker lost"), "{why}");
                assert!(!discard);
            }
            other => panic!("{other:?}"),
        }
        // A claim that does not name this worker does not stop it.
        let mut p = writer(0, 3, &[1]);
        assert_eq!(p.handle_claims(true, &[(2, 49, vec![1])], T), Action::SaveLastStep {});
        // A newer job marked the folder while this writer saved: it deletes its own.
        assert!(matches!(
            p.handle_claims(false, &[(0, 50, vec![1])], T),
            Action::Refuse { discard: true, .. }
        ));
    }

    #[test]
    fn both_sides_of_a_cut_end_naming_the_same_claim_in_any_order() {
        // Side A: worker 0 (lost 1); side B: worker 1 (lost 0). Both checked before
        // either claim was there.
        let a_claim = (0, 50, vec![1]);
        let b_claim = (1, 49, vec![0]);
        let mut a = writer(0, 2, &[1]);
        let mut b = writer(1, 2, &[0]);
        assert_eq!(a.handle_claims(true, &[], T), Action::SaveLastStep {});
        assert_eq!(b.handle_claims(true, &[], T), Action::SaveLastStep {});
        // B reads before A's claim lands and names its own; A then sees both.
        assert_eq!(
            b.handle_claims(true, std::slice::from_ref(&b_claim), T),
            Action::NameLatest {
                writer: 1,
                runs: 49,
                unix_time: T
            }
        );
        let both = [a_claim.clone(), b_claim.clone()];
        assert_eq!(
            a.handle_claims(true, &both, T),
            Action::NameLatest {
                writer: 0,
                runs: 50,
                unix_time: T
            }
        );
        assert_eq!(a.handle_claims(true, &both, T), Action::Settled { writer: 0, discard: false });
        // B's naming may land after A's: B's next read sees A's claim and names it.
        assert_eq!(
            b.handle_claims(true, &both, T),
            Action::NameLatest {
                writer: 0,
                runs: 50,
                unix_time: T
            }
        );
        assert_eq!(b.handle_claims(true, &both, T), Action::Settled { writer: 0, discard: true });
    }

    #[test]
    fn a_tie_in_runs_goes_to_the_lowest_writer() {
        let mut p = writer(2, 3, &[0, 1]);
        assert_eq!(p.handle_claims(true, &[], T), Action::SaveLastStep {});
        let claims = [(2, 50, vec![0, 1]), (1, 50, vec![0])];
        assert_eq!(
            p.handle_claims(true, &claims, T),
            Action::NameLatest {
                writer: 1,
                runs: 50,
                unix_time: T
            }
        );
        assert_eq!(p.handle_claims(true, &claims, T), Action::Settled { writer: 1, discard: true });
    }

    #[test]
    fn a_non_chief_exits_once_the_chiefs_checkpoint_of_the_round_is_there() {
        let mut p = protocol(Some(1), 2);
        assert_eq!(p.handle_confirm(true, None, 0.0), Action::Proceed {}, "seen at the first look");
        // Not there yet: a probe first, then looks until a second has passed.
        assert_eq!(
            p.handle_confirm(false, None, 0.0),
            Action::Probe {
                suspects: vec![],
                detection: None
            }
        );
        assert_eq!(p.handle_confirm(false, Some(&[]), 0.1), Action::Look { seconds: LOOK_INTERVAL });
        assert!(matches!(p.handle_confirm(false, None, 0.5), Action::Look { .. }));
        assert!(matches!(p.handle_confirm(false, None, 1.2), Action::Probe { .. }));
        assert_eq!(p.handle_confirm(true, Some(&[]), 1.3), Action::Proceed {});
        // The chief, a single worker and survivors that do not save confirm nothing.
        assert_eq!(protocol(Some(0), 2).handle_confirm(false, None, 0.0), Action::Proceed {});
        assert_eq!(protocol(Some(0), 1).handle_confirm(false, None, 0.0), Action::Proceed {});
        let mut q = protocol(Some(1), 2);
        q.set_lost_worker_saves(false);
        assert_eq!(q.handle_confirm(false, None, 0.0), Action::Proceed {});
    }

    #[test]
    fn a_chief_gone_inside_its_save_makes_the_survivors_save_the_round() {
        // Worker 1 of 3 writes; worker 2 does not; the look after the probe decides.
        for (me, writes) in [(1, true), (2, false)] {
            let mut p = protocol(Some(me), 3);
            assert!(matches!(p.handle_confirm(false, None, 0.0), Action::Probe { .. }));
            assert_eq!(
                p.handle_confirm(false, Some(&[0]), 0.2),
                Action::PeerLost {
                    lost: vec![0],
                    detection: "the chief's save of the round not written".to_owned(),
                    writes,
                }
            );
        }
        // The chief named its checkpoint and ended between the look and the probe: seen.
        let mut p = protocol(Some(1), 2);
        let _ = p.handle_confirm(false, None, 0.0);
        assert_eq!(p.handle_confirm(true, Some(&[0]), 0.2), Action::Proceed {});
        // Another non-chief gone, the chief answering: the wait goes on.
        let mut p = protocol(Some(1), 3);
        let _ = p.handle_confirm(false, None, 0.0);
        assert!(matches!(p.handle_confirm(false, Some(&[2]), 0.2), Action::Look { .. }));
    }

    #[test]
    fn a_chief_that_answers_is_waited_for_the_peer_timeout_then_not() {
        let mut p = protocol(Some(1), 2); // peer timeout 30 s
        let mut now = 0.0;
        let mut event: Option<Vec<u32>> = None;
        let end = loop {
            match p.handle_confirm(false, event.as_deref(), now) {
                Action::Look { seconds } => {
                    assert!(seconds > 0.0 && seconds <= LOOK_INTERVAL);
                    now += seconds;
                    event = None;
                }
                Action::Probe { .. } => event = Some(vec![]),
                other => break other,
            }
        };
        match end {
            Action::GaveUp { attempts, seconds, .. } => {
                assert!((30.0..30.0 + LOOK_INTERVAL).contains(&seconds), "{seconds}");
                assert!(attempts >= 29, "a probe a second: {attempts}");
            }
            other => panic!("{other:?}"),
        }
        // A new wait starts afresh.
        assert!(matches!(p.handle_confirm(false, None, 100.0), Action::Probe { .. }));
    }

    #[test]
    fn a_writer_whose_claim_is_missing_deletes_what_it_wrote() {
        let mut p = writer(0, 2, &[1]);
        assert_eq!(p.handle_claims(true, &[], T), Action::SaveLastStep {});
        assert!(matches!(p.handle_claims(true, &[], T), Action::Refuse { discard: true, .. }));
    }
}
