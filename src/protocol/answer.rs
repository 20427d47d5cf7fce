//! What the protocol object answers an [`Event`](super::Event) with, for the
//! training thread and the driver: each type declared once for the core and the
//! binding (`crate::wire`), flat (every field a plain value or a [`Round`]), and
//! built here from the resolver's own decisions with what the protocol adds to
//! them (the final round, the drain bound, whether a write is pending).

use crate::step_resolution::{self as resolver, Round};

crate::wire! {
    /// What to do about a termination notice (`Event.Notice`'s answer).
    pub enum NoticeAction via notice_action {
        /// Local mode, or a worker that already won the claim: lead the response.
        /// `final_round`: the preemption has a final round (a grace period), so
        /// training goes on after the first save. `writes`: the announce of it is
        /// queued (in a cluster), the notice is done with when it ends.
        Lead { final_round: bool, writes: bool },
        /// Claim `key` (TERMINATED_WORKER) with `value` (this worker's id); the
        /// claim's write is queued, its outcome comes out of `poll`.
        Claim { key: String, value: String },
        /// A tighter deadline while a notice is being handled: the final round is
        /// planned for it from now on; nothing to write.
        Replan {},
        /// A notice is already being handled (or was, and the handler exited),
        /// and this one ends no earlier: absorbed.
        Absorb {},
        /// The write of the notice before it (a claim, an announce) is pending: the
        /// notice was not taken; hand it in again once that write has ended (the
        /// driver's receive wakes for it: `poll_timeout(waiting=True)`).
        Wait {},
    }
}

crate::wire! {
    /// What to do before the next step (`Event.BeforeStep`'s answer).
    pub enum StepAction via step_action {
        /// Nothing to do: run the step.
        Proceed {},
        /// This worker leads: publish `round`'s key = `step`, write its own
        /// `own_ack_key` (None in local mode), and wait for every key in `ack_keys`
        /// (the round's calls are the `LeaderAction`s of `Event.Resume`).
        Publish { round: Round, step: u64, ack_keys: Vec<String>, own_ack_key: Option<String> },
        /// The agreed `step` of `round` is reached: save now. `drain`: the seconds a
        /// parameter-server coordinator lets the closures in flight finish first
        /// (`Protocol::drain_bound`).
        Save { round: Round, step: u64, drain: f64 },
    }
}

crate::wire! {
    /// What to do with a step key a leader published (`Event.StepKey`'s answer).
    pub enum KeyAction via key_action {
        /// Write `ack_key` (queued: the driver's); then watch `next_round`'s key
        /// (the final round), if any.
        Acknowledge { ack_key: String, next_round: Option<Round> },
        /// `STOP_WATCHER`: the protocol is over for this watcher.
        Stop {},
    }
}

crate::wire! {
    /// What follows a save (`Event.Saved`'s and `Event.SaveFailed`'s answer).
    pub enum SaveAction via save_action {
        /// Clean up and call `exit_fn`.
        Exit {},
        /// Keep training until the final round of the grace period.
        Countdown {},
        /// A failed save: raise its error.
        Raise {},
        /// A failed save in shares: exit with `code`, the unmerged exit code
        /// (`crate::shares::UNMERGED_EXIT_CODE`).
        ExitUnmerged { code: i32 },
    }
}

impl NoticeAction {
    /// The resolver's answer, with what the protocol adds to a lead: whether the
    /// preemption has a final round, and whether the answer queued a write.
    #[must_use]
    pub fn of(action: resolver::NoticeAction, final_round: bool, writes: bool) -> Self {
        match action {
            resolver::NoticeAction::Lead => NoticeAction::Lead { final_round, writes },
            resolver::NoticeAction::Claim { key, value } => NoticeAction::Claim {
                key: key.to_owned(),
                value,
            },
            resolver::NoticeAction::Replan => NoticeAction::Replan {},
            resolver::NoticeAction::Absorb => NoticeAction::Absorb {},
        }
    }
}

impl StepAction {
    /// The resolver's decision before a step, a save with the seconds the closures in
    /// flight get first (`drain`).
    #[must_use]
    pub fn of(action: resolver::StepAction, drain: f64) -> Self {
        match action {
            resolver::StepAction::Proceed => StepAction::Proceed {},
            resolver::StepAction::Publish {
                round,
                step,
                ack_keys,
                own_ack_key,
            } => StepAction::Publish {
                round,
                step,
                ack_keys,
                own_ack_key,
            },
            resolver::StepAction::Save { round, step } => StepAction::Save { round, step, drain },
        }
    }
}

impl From<resolver::KeyAction> for KeyAction {
    fn from(action: resolver::KeyAction) -> Self {
        match action {
            resolver::KeyAction::Acknowledge { ack_key, next_round } => KeyAction::Acknowledge { ack_key, next_round },
            resolver::KeyAction::Stop => KeyAction::Stop {},
        }
    }
}

impl From<resolver::SaveAction> for SaveAction {
    fn from(action: resolver::SaveAction) -> Self {
        match action {
            resolver::SaveAction::Exit => SaveAction::Exit {},
            resolver::SaveAction::Countdown => SaveAction::Countdown {},
        }
    }
}

impl From<super::SaveFailed> for SaveAction {
    fn from(action: super::SaveFailed) -> Self {
        match action {
            super::SaveFailed::Raise => SaveAction::Raise {},
            super::SaveFailed::ExitUnmerged => SaveAction::ExitUnmerged {
                code: crate::shares::UNMERGED_EXIT_CODE,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answers_carry_the_resolvers_decisions_and_what_the_protocol_adds() {
        assert_eq!(
            NoticeAction::of(resolver::NoticeAction::Lead, true, false),
            NoticeAction::Lead {
                final_round: true,
                writes: false
            }
        );
        assert_eq!(
            NoticeAction::of(resolver::NoticeAction::Absorb, true, true),
            NoticeAction::Absorb {}
        );
        let save = StepAction::of(
            resolver::StepAction::Save {
                round: Round::Final,
                step: 9,
            },
            4.5,
        );
        assert_eq!(
            save,
            StepAction::Save {
                round: Round::Final,
                step: 9,
                drain: 4.5
            }
        );
        assert_eq!(KeyAction::from(resolver::KeyAction::Stop), KeyAction::Stop {});
        assert_eq!(SaveAction::from(resolver::SaveAction::Countdown), SaveAction::Countdown {});
        assert_eq!(
            SaveAction::from(super::super::SaveFailed::ExitUnmerged),
            SaveAction::ExitUnmerged {
                code: crate::shares::UNMERGED_EXIT_CODE
            }
        );
    }
}
