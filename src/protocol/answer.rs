//! What the protocol object answers an [`Event`](super::Event) with, whichever
//! thread asks (the driver, the training thread, the leader's round, the
//! step-key reader): one [`Action`], declared once for the core and the binding
//! (`crate::wire`), flat (every field a plain value or a [`Round`]). The answers
//! to a notice, a step key, a step check and a save are built here from the
//! resolver's own decisions with what the protocol adds to them (the final
//! round, the drain bound, whether a write is pending); the leader's, the
//! reader's and the driver's in `agree.rs`, `reader.rs` and `driver.rs`.

use crate::step_resolution::{self as resolver, Round};

crate::wire! {
    /// What the handler's protocol object tells Python to do: the one answer of
    /// `ProtocolCore.handle` and `ProtocolCore.poll`, whichever thread asks. Each
    /// variant says which event it answers.
    pub enum Action via action {
        // A termination notice (`Event.Notice`).
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

        // The check before a step (`Event.BeforeStep`).
        /// Nothing to do: run the step.
        Proceed {},
        /// This worker leads: publish `round`'s key = `step`, write its own
        /// `own_ack_key` (None in local mode), and wait for every key in `ack_keys`
        /// (the round's calls are the answers to `Event.Resume`).
        Publish { round: Round, step: u64, ack_keys: Vec<String>, own_ack_key: Option<String> },
        /// The agreed `step` of `round` is reached: save now. `drain`: the seconds a
        /// parameter-server coordinator lets the closures in flight finish first
        /// (`Protocol::drain_bound`).
        Save { round: Round, step: u64, drain: f64 },

        // A step key a leader published (`Event.StepKey`).
        /// Write `ack_key` (queued: the driver's); then watch `next_round`'s key
        /// (the final round), if any.
        Acknowledge { ack_key: String, next_round: Option<Round> },
        /// `STOP_WATCHER`: the protocol is over for this watcher.
        Stop {},

        // A save's end (`Event.Saved`, `Event.SaveFailed`).
        /// Clean up and call `exit_fn`.
        Exit {},
        /// Keep training until the final round of the grace period.
        Countdown {},
        /// A failed save, or a failed step that lost no peer (`Event.StepFailed`,
        /// `Event.Probed`): raise its error.
        Raise {},
        /// A failed save in shares: exit with `code`, the unmerged exit code
        /// (`crate::shares::UNMERGED_EXIT_CODE`).
        ExitUnmerged { code: i32 },

        // A failed step (`Event.StepFailed`, `Event.Probed`; `lost.rs`).
        /// The error can come from a peer that is gone: probe the peers' health
        /// and report the ids of those that do not answer (`Event.Probed`).
        /// `suspects`: the tasks the error names; `detection`: how a lost peer
        /// showed itself in the error (None: the error only may come from one).
        Probe { suspects: Vec<String>, detection: Option<String> },
        /// The workers `lost` (ids) are gone without notice, as the probe
        /// confirmed; `detection` says how it showed. `writes`: this worker is
        /// the survivor that writes (the lowest id that answered).
        PeerLost { lost: Vec<u32>, detection: String, writes: bool },

        // A non-chief's wait for the chief's checkpoint of its last round
        // (`Event.Confirm`; `lost.rs`; also `Proceed`, `Probe`, `PeerLost`, `GaveUp`).
        /// Look at the checkpoint folder's state file again in `seconds` (the
        /// step watch: report again then, `Event.Watch`).
        Look { seconds: f64 },

        // The step watch (`Event.Watch`, `Event.WatchProbed`; `watch.rs`; also
        // `Look`, `Probe`, `Done`).
        /// Abort this worker's collectives (TensorFlow's `abort_collective_ops`)
        /// with `message`: a peer did not answer while the step was blocked.
        Abort { message: String },

        // The survivors' save (`Event.Job`, `Event.Claims`; `lost.rs`).
        /// The chief: write this job's token into the checkpoint folder now.
        MarkJob {},
        /// Read the job's token from the checkpoint folder at the first held step.
        ReadJob {},
        /// Nothing in the folder objected: save the last whole step under this
        /// writer's own name, write its claim after it, and read the claims again.
        SaveLastStep {},
        /// Make the state file name the checkpoint of `writer`'s claim (`runs`),
        /// stamped `unix_time` (as `tf.train.CheckpointManager` stamps a save), then
        /// read the claims again.
        NameLatest { writer: u32, runs: u64, unix_time: f64 },
        /// The state file names `writer`'s checkpoint, and a read after the last
        /// naming agreed. `discard`: this writer's own checkpoint lost; delete it.
        Settled { writer: u32, discard: bool },
        /// Do not write (or stop): `why`. `discard`: delete what this writer wrote.
        Refuse { why: String, discard: bool },

        // The leader's round (`Event.Resume`, `Set`, `Got`, `CallFailed`;
        // [`Protocol::leader_next`](super::Protocol::leader_next)).
        /// Set `key` to `value` within `timeout` seconds; report whether it was
        /// written (`Event.Set`).
        Set { key: String, value: String, timeout: f64, what: String },
        /// Read `key` for at most `timeout` seconds; report its value
        /// (`Event.Got`). `ack`: an acknowledgement (logged when found).
        Get { key: String, timeout: f64, what: String, ack: bool },
        /// The last call (the leader's or the reader's) failed: wait `seconds`
        /// (the retry rule's pause; `left` of its bound remained, `attempts`
        /// failed so far), then resume (`Event.Resume`, `Event.Reading`).
        Pause { seconds: f64, what: String, attempts: u32, left: f64 },
        /// The round's step is published (and this worker acknowledged it):
        /// record it, then resume.
        Published { round: Round, step: u64 },
        /// Another worker published the round first: `value` (read back; None
        /// when it was gone) is the agreed step, and no acknowledgement is
        /// waited for.
        Lost { round: Round, value: Option<String> },
        /// Every worker acknowledged (or local mode): the round is agreed.
        Agreed {},
        /// The retry rule gave up on the leader's or the reader's `what` after
        /// `attempts` failures over `seconds`: raise the last error, named.
        GaveUp { what: String, attempts: u32, seconds: f64 },
        /// The peer timeout passed with the `missing` acknowledgements
        /// unwritten.
        Missing { round: Round, step: u64, missing: Vec<String> },

        // The step-key reader (`Event.Reading`, `Read`, `ReadFailed`).
        /// Read `key` for at most `timeout` seconds; report its value
        /// (`Event.Read`).
        Read { key: String, timeout: f64 },
        /// Post `value` of `round`'s key into the driver's inbox, then go on.
        Post { round: Round, value: String },
        /// Nothing more to read.
        Done {},

        // The driver's writes (`ProtocolCore.poll`; a
        // [`DriverAction`](super::DriverAction) with its call's fields).
        /// Set `key` to `value` within `timeout` seconds (the coordination client's
        /// `set`, whose False is a lost claim); report the outcome as an `Event`
        /// with the handle `id`. `what` names the write in logs and errors.
        Write { id: u64, kind: crate::writes::Kind, key: String, value: String, timeout: f64, what: String, subject: String },
        /// The write `id` failed and is attempted again in `pause` seconds
        /// (`left` of its bound remained, `attempts` failed so far): for the log.
        Retrying { id: u64, what: String, attempts: u32, pause: f64, left: f64 },
        /// The write ended, written (`won`: a claim written first; True for the
        /// other kinds). `ends_notice`: the notice it was for is done with.
        Written { kind: crate::writes::Kind, key: String, value: String, what: String, subject: String, won: bool, ends_notice: bool },
        /// The retry rule gave up on the write after `attempts` failed attempts over
        /// `seconds`: raise the last error, named.
        WriteGaveUp { kind: crate::writes::Kind, key: String, value: String, what: String, subject: String, attempts: u32, seconds: f64, ends_notice: bool },
        /// The write's attempt raised a bug: hand it on as it is.
        Raised { kind: crate::writes::Kind, key: String, value: String, what: String, subject: String, ends_notice: bool },
        /// A claim dropped at close (logged).
        Dropped { what: String },
    }
}

impl Action {
    /// The resolver's answer to a notice, with what the protocol adds to a lead:
    /// whether the preemption has a final round, and whether the answer queued a
    /// write.
    #[must_use]
    pub fn notice(action: resolver::NoticeAction, final_round: bool, writes: bool) -> Self {
        match action {
            resolver::NoticeAction::Lead => Action::Lead { final_round, writes },
            resolver::NoticeAction::Claim { key, value } => Action::Claim {
                key: key.to_owned(),
                value,
            },
            resolver::NoticeAction::Replan => Action::Replan {},
            resolver::NoticeAction::Absorb => Action::Absorb {},
        }
    }

    /// The resolver's decision before a step, a save with the seconds the closures in
    /// flight get first (`drain`).
    #[must_use]
    pub fn step(action: resolver::StepAction, drain: f64) -> Self {
        match action {
            resolver::StepAction::Proceed => Action::Proceed {},
            resolver::StepAction::Publish {
                round,
                step,
                ack_keys,
                own_ack_key,
            } => Action::Publish {
                round,
                step,
                ack_keys,
                own_ack_key,
            },
            resolver::StepAction::Save { round, step } => Action::Save { round, step, drain },
        }
    }
}

impl From<resolver::KeyAction> for Action {
    fn from(action: resolver::KeyAction) -> Self {
        match action {
            resolver::KeyAction::Acknowledge { ack_key, next_round } => Action::Acknowledge { ack_key, next_round },
            resolver::KeyAction::Stop => Action::Stop {},
        }
    }
}

impl From<resolver::SaveAction> for Action {
    fn from(action: resolver::SaveAction) -> Self {
        match action {
            resolver::SaveAction::Exit => Action::Exit {},
            resolver::SaveAction::Countdown => Action::Countdown {},
        }
    }
}

impl From<super::SaveFailed> for Action {
    fn from(action: super::SaveFailed) -> Self {
        match action {
            super::SaveFailed::Raise => Action::Raise {},
            super::SaveFailed::ExitUnmerged => Action::ExitUnmerged {
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
            Action::notice(resolver::NoticeAction::Lead, true, false),
            Action::Lead {
                final_round: true,
                writes: false
            }
        );
        assert_eq!(Action::notice(resolver::NoticeAction::Absorb, true, true), Action::Absorb {});
        let save = Action::step(
            resolver::StepAction::Save {
                round: Round::Final,
                step: 9,
            },
            4.5,
        );
        assert_eq!(
            save,
            Action::Save {
                round: Round::Final,
                step: 9,
                drain: 4.5
            }
        );
        assert_eq!(Action::from(resolver::KeyAction::Stop), Action::Stop {});
        assert_eq!(Action::from(resolver::SaveAction::Countdown), Action::Countdown {});
        assert_eq!(
            Action::from(super::super::SaveFailed::ExitUnmerged),
            Action::ExitUnmerged {
                code: crate::shares::UNMERGED_EXIT_CODE
            }
        );
    }
}
