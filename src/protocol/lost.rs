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
//!    before.
//! 2. `Event.Probed(unreachable)`: the worker ids that did not answer. A lost peer the
//!    text suggested is **confirmed** when at least one peer did not answer: the answer
//!    is `Action.PeerLost` with the lost workers, how the loss showed itself, and
//!    whether this worker is the survivor that writes (the lowest worker id that
//!    answered, itself included: the chief when it lives). Otherwise `Action.Raise`.
//!
//! A suspicion the probe does not confirm (every peer answered) came from something
//! that is not a peer, a remote service the step reads for example, and raises as any
//! other error.

use crate::failure::lost_peer::{lost_peer, LostPeer, UNAVAILABLE};
use crate::words::Words;

use super::{Action, Protocol};

/// TF's canonical codes (`tf.errors`) of the errors a peer that is gone can cause,
/// besides `UNAVAILABLE`: a collective cancelled or aborted, a call past its deadline,
/// a collective's internal error.
const CANCELLED: i64 = 1;
const DEADLINE_EXCEEDED: i64 = 4;
const ABORTED: i64 = 10;
const INTERNAL: i64 = 13;
const MAY_BE_A_PEER: [i64; 5] = [CANCELLED, DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNAVAILABLE];

/// What an aborted collective's message starts with, whatever its code.
const COLLECTIVE_ABORTED: &str = "Collective ops is aborted";

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
        let suspect = lost_peer(code, message);
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

    /// The probe `Action.Probe` asked for found the workers `unreachable` (their ids)
    /// not answering: `Action.PeerLost` when that confirms a lost peer, else
    /// `Action.Raise`.
    pub fn handle_probed(&mut self, unreachable: &[u32]) -> Action {
        let probing = self.probing.take();
        let (Some(Probing { suspect: Some(suspect) }), Some(config)) = (probing, self.config) else {
            return Action::Raise {};
        };
        let Some(me) = config.worker_id else {
            return Action::Raise {};
        };
        let mut lost: Vec<u32> = unreachable
            .iter()
            .copied()
            .filter(|&id| id != me && id < config.num_workers)
            .collect();
        lost.sort_unstable();
        lost.dedup();
        if lost.is_empty() {
            return Action::Raise {};
        }
        let writer = (0..config.num_workers).find(|id| !lost.contains(id));
        Action::PeerLost {
            lost,
            detection: suspect.detection.word().to_owned(),
            writes: self.lost_worker_saves && writer == Some(me),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Config;

    const RESET: &str = "Collective ops is aborted by: recvmsg:Connection reset by peer \
                         {grpc_status:14, remote target /job:worker/replica:0/task:1}";

    fn protocol(worker_id: Option<u32>, num_workers: u32) -> Protocol {
        let mut p = Protocol::new();
        p.configure(Config {
            worker_id,
            num_workers,
            grace_period: 0.0,
            save_at_current_run: false,
            peer_timeout: 30.0,
        })
        .expect("a valid configuration");
        p
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
}
