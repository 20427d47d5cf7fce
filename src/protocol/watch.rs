//! The step watch, as events in and actions out: a step blocked on a peer that is
//! gone, when TensorFlow does not abort it (issue 62, "A hung worker").
//!
//! A worker that stops without dying (SIGSTOP, a frozen host) resets no connection,
//! and TensorFlow's collectives have no timeout of their own: the survivors' step
//! waits until the coordination service's heartbeat timeout aborts it, and forever
//! when the service is configured without one (or with a long one). The handler's own
//! bound is the peer timeout: a step of a cluster's worker still in its `run()` after
//! it is probed, and once a second after that, until it returns. A peer that does not
//! answer is lost: the watch aborts this worker's collectives (TensorFlow's
//! `abort_collective_ops`), the step raises, and the failed step takes the lost-peer
//! path (`lost.rs`: probe, the survivors' save, raise), suspecting the peer the watch
//! found ([`Protocol::unanswered`]).
//!
//! 1. `Event.Watch()`: the binding adds whether a step is in progress (a `run()` is
//!    calling its function, or a `watch_preemption_scope` is open: `Event.Scope`) and
//!    the run count. The answer is `Action.Look` (report again in `seconds`),
//!    `Action.Probe` (probe the peers, report with `Event.WatchProbed`) or
//!    `Action.Done` (not a cluster's worker: nothing to watch).
//! 2. `Event.WatchProbed(unreachable)`: `Action.Abort` (abort the collectives with
//!    `message`) when another worker did not answer, else `Action.Look`.

use crate::failure::lost_peer::Detection;
use crate::words::Words;

use super::{Action, Protocol};

/// Seconds between two looks of the step watch, and between two probes of a step
/// past the bound: a look is two atomic reads and the core's lock.
pub const WATCH_INTERVAL: f64 = 1.0;

/// The step the watch follows: its run count and when the watch first saw it running.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Watching {
    runs: u64,
    since: f64,
    /// When its peers were probed last (None: not yet).
    probed: Option<f64>,
    /// Its collectives were aborted: nothing more to do until it returns.
    aborted: bool,
}

impl Protocol {
    /// A look of the step watch at `now`: `in_run`, whether a step is in progress (a
    /// `run()` is calling its function, or a `watch_preemption_scope` is open), and
    /// `runs`, the run count (a new step when it changed).
    pub fn handle_watch(&mut self, in_run: bool, runs: u64, now: f64) -> Action {
        if !self.in_cluster() {
            return Action::Done {};
        }
        if !in_run {
            self.watching = None;
            return Action::Look { seconds: WATCH_INTERVAL };
        }
        let watching = match self.watching {
            Some(w) if w.runs == runs => w,
            _ => Watching {
                runs,
                since: now,
                probed: None,
                aborted: false,
            },
        };
        self.watching = Some(watching);
        if watching.aborted {
            return Action::Look { seconds: WATCH_INTERVAL };
        }
        let bound = self.peer_timeout;
        let due = match watching.probed {
            None => watching.since + bound,
            Some(at) => at + WATCH_INTERVAL,
        };
        if now >= due {
            if let Some(w) = self.watching.as_mut() {
                w.probed = Some(now);
            }
            return Action::Probe {
                suspects: Vec::new(),
                detection: Some(Detection::StepBlocked.word().to_owned()),
            };
        }
        Action::Look {
            seconds: (due - now).min(WATCH_INTERVAL),
        }
    }

    /// The probe the watch asked for found `unreachable` (worker ids) not answering:
    /// `Action.Abort` when another worker of the cluster is among them (the next failed
    /// step suspects a lost peer), else `Action.Look`.
    pub fn handle_watch_probed(&mut self, unreachable: &[u32], now: f64) -> Action {
        let me = self.config.and_then(|c| c.worker_id);
        let mut lost: Vec<u32> = unreachable.iter().copied().filter(|&id| Some(id) != me).collect();
        lost.sort_unstable();
        lost.dedup();
        let Some(watching) = self.watching.filter(|w| !lost.is_empty() && !w.aborted) else {
            return Action::Look { seconds: WATCH_INTERVAL };
        };
        self.watching = Some(Watching { aborted: true, ..watching });
        self.unanswered(Detection::StepBlocked);
        let workers = lost.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
        Action::Abort {
            message: format!(
                "worker(s) {workers} did not answer a health probe while run {} of this worker was blocked for {:.1}s (the handler's bound, its peer timeout, is {:.1}s)",
                watching.runs + 1,
                now - watching.since,
                self.peer_timeout
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::lost::tests::configured as protocol;

    #[test]
    fn a_step_past_the_bound_is_probed_once_a_second_and_a_silent_peer_aborts_it() {
        let mut p = protocol(Some(0), 2, 5.0);
        assert_eq!(p.handle_watch(false, 0, 0.0), Action::Look { seconds: WATCH_INTERVAL });
        // Run 3 starts at 10 s: looked at until 15 s.
        assert_eq!(p.handle_watch(true, 3, 10.0), Action::Look { seconds: WATCH_INTERVAL });
        assert_eq!(p.handle_watch(true, 3, 14.5), Action::Look { seconds: 0.5 });
        assert!(matches!(p.handle_watch(true, 3, 15.0), Action::Probe { .. }));
        // Every peer answered: a slow step; probed again a second later.
        assert_eq!(p.handle_watch_probed(&[], 15.2), Action::Look { seconds: WATCH_INTERVAL });
        assert!(matches!(p.handle_watch(true, 3, 15.5), Action::Look { .. }));
        assert!(matches!(p.handle_watch(true, 3, 16.0), Action::Probe { .. }));
        match p.handle_watch_probed(&[1, 0], 16.1) {
            Action::Abort { message } => {
                assert!(message.contains("worker(s) 1 did not answer"), "{message}");
                assert!(message.contains("run 4 of this worker was blocked for 6.1s"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // Aborted once: the step is left to raise, and not probed again.
        assert_eq!(p.handle_watch(true, 3, 17.5), Action::Look { seconds: WATCH_INTERVAL });
        assert_eq!(p.handle_watch_probed(&[1], 17.6), Action::Look { seconds: WATCH_INTERVAL });
        // The step's error then suspects the lost peer.
        match p.handle_step_failed(Some(10), "Collective ops is aborted by: worker(s) 1 ...") {
            Action::Probe { detection, .. } => {
                assert_eq!(detection.as_deref(), Some(Detection::StepBlocked.word()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_step_gets_its_own_bound_and_a_returned_step_ends_the_watch() {
        let mut p = protocol(Some(1), 2, 5.0);
        let _ = p.handle_watch(true, 3, 0.0);
        // Run 4 began at 4 s: its bound ends at 9 s, not 5 s.
        assert!(matches!(p.handle_watch(true, 4, 4.0), Action::Look { .. }));
        assert!(matches!(p.handle_watch(true, 4, 8.0), Action::Look { .. }));
        assert!(matches!(p.handle_watch(true, 4, 9.0), Action::Probe { .. }));
        // Between steps nothing is probed, and a probe's answer after it aborts nothing.
        let _ = p.handle_watch(false, 5, 9.1);
        assert_eq!(p.handle_watch_probed(&[0], 9.2), Action::Look { seconds: WATCH_INTERVAL });
    }

    #[test]
    fn a_single_worker_or_local_mode_watches_nothing() {
        assert_eq!(protocol(Some(0), 1, 5.0).handle_watch(true, 0, 0.0), Action::Done {});
        assert_eq!(protocol(None, 1, 5.0).handle_watch(true, 0, 0.0), Action::Done {});
        assert_eq!(Protocol::new().handle_watch(true, 0, 0.0), Action::Done {});
    }
}
