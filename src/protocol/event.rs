//! The handler's protocol's inputs: one type, [`Event`], declared once for the
//! core and the binding (`crate::wire`). `ProtocolCore.handle` takes each at the
//! moment the protocol's clock says (`configure(clock=...)`) and answers with
//! what the event's doc names.

use crate::step_resolution::Round;

crate::wire! {
    /// An input of the protocol (`ProtocolCore.handle`), taken at the moment the
    /// protocol's own clock says (`configure(clock=...)`).
    pub enum Event via event {
        /// A termination notice from `source`, whose deadline and kill (the moment
        /// the platform stated it ends the process; None: not stated) are Unix
        /// times, converted to the protocol's clock when it is handled
        /// (`Notice::from_unix`: the one conversion, the wall clock read then).
        /// `message` is what its announce tells the `PreemptionWatcher`s. `handle`
        /// returns an `Action` (`Lead`, `Claim`, `Replan`, `Absorb`, `Wait`), and queues the write it starts (a claim; a
        /// cluster's announce).
        Notice { source: String, message: String, unix_deadline: Option<f64> = None, unix_kill: Option<f64> = None },
        /// The key of `round` a leader published, read (`superseded`: a newer
        /// handler of this worker acknowledges). `handle` returns `Action.Acknowledge` or `Stop`,
        /// and queues the acknowledgement.
        StepKey { round: Round, value: String, superseded: bool = false },
        /// The attempt of the write `id` succeeded (`won`: a claim written first).
        Written { id: u64, won: bool = true },
        /// The attempt of `id` failed with a coordination-service error
        /// (`closing`: the handler is closing, nothing is retried).
        Failed { id: u64, closing: bool = false },
        /// The attempt of `id` raised something else (a bug).
        Raised { id: u64 },
        /// The handler closes: last attempts, and a claim dropped.
        Close {},
        /// The leader's training thread goes on: the first call of the round
        /// `BeforeStep` published, or the next after a pause or a record.
        /// `handle` returns the leader's next `Action`, as for the three below.
        Resume {},
        /// The leader's `Action.Set` answered (`written`: False when the key
        /// existed already).
        Set { written: bool },
        /// The leader's `Action.Get` answered with `value` (None: not set).
        Got { value: Option<String> = None },
        /// The leader's call failed with a coordination-service error (`closing`:
        /// nothing is retried).
        CallFailed { closing: bool = false },
        /// The step-key reader goes on: its first read, or the next after a pause
        /// or a post. `handle` returns the reader's next `Action`, as for the two below.
        Reading {},
        /// The reader's `Action.Read` answered with `value` (None: not set yet).
        Read { value: Option<String> = None },
        /// The reader's read failed with a coordination-service error (`closing`:
        /// the reader stops).
        ReadFailed { closing: bool = false },
        /// A timed operation (a save, the checkpoint's read at start) starts.
        Timing {},
        /// The timed operation ended: `handle` returns the seconds it took.
        Timed {},
        /// The checkpoint read at start, timed last, is the save estimate until a
        /// save is measured (`GracePlanner::record_restore`).
        Restored {},
        /// The save of `round`, timed last, finished: `handle` returns the
        /// `Action` (`Exit`, or `Countdown` to the final round).
        Saved { round: Round },
        /// A save failed (`shares`: written in shares by several workers): `handle`
        /// returns the `Action` (`Raise` its error, or `ExitUnmerged`).
        SaveFailed { shares: bool },
        /// The check before a step: `handle` returns `Action.Proceed`, `Publish` or `Save`.
        BeforeStep {},
        /// The check before a step ended (a publish or a save is not step time:
        /// the interval restarts now).
        ChecksDone {},
        /// The step failed with an error of canonical `code` (None: not one of
        /// TF's `OpError`s) and `message`: it is not counted, and not a step
        /// duration. `handle` returns `Action.Probe` (the error can come from a
        /// peer that is gone) or `Action.Raise`.
        StepFailed { code: Option<i64> = None, message: Option<String> = None },
        /// The peers `Action.Probe` asked about: `unreachable`, the ids of the
        /// workers that did not answer. `handle` returns `Action.PeerLost` or
        /// `Action.Raise`.
        Probed { unreachable: Vec<u32> },
        /// Once, at the start: `handle` returns what marks this job in the
        /// checkpoint folder (`Action.MarkJob`, `ReadJob` or `Proceed`).
        Job {},
        /// The writer of the survivors' save read the checkpoint folder:
        /// `current`, whether this job's mark is still the folder's, and `claims`,
        /// its job's survivors' claims, each `(writer, runs, lost)`. `handle`
        /// returns `Action.SaveLastStep`, `NameLatest`, `Settled` or `Refuse`.
        Claims { current: bool, claims: Vec<(u32, u64, Vec<u32>)> },
        /// A non-chief saved a preemption's last round (`Event.Saved` answered
        /// `Action.Exit`) and looked at the checkpoint folder: `seen`, whether its
        /// state file names the chief's checkpoint of the round; `unreachable`,
        /// after a probe `Action.Probe` asked for (made before the look), the ids
        /// of the workers that did not answer. `handle` returns `Action.Proceed`,
        /// `Look`, `Probe`, `PeerLost` or `GaveUp`.
        Confirm { seen: bool, unreachable: Option<Vec<u32>> = None },
        /// A look of the step watch (the binding adds whether a `run()` is calling
        /// its function or a `Scope` is open, and the run count): `handle` returns
        /// `Action.Look`, `Probe` or `Done`.
        Watch {},
        /// The peers the step watch's `Action.Probe` asked about: `unreachable`,
        /// the ids of those that did not answer. `handle` returns `Action.Abort`
        /// or `Look`.
        WatchProbed { unreachable: Vec<u32> },
        /// Whether the next step must take the slow path for something other than
        /// the resolver (a background thread's error).
        Pending { pending: bool },
        /// A `watch_preemption_scope` block was `entered` (or left). While one is
        /// open, the step watch (`Watch`) follows the run count as it does while a
        /// `run()` calls its function: the step of a library that counts its own
        /// (tf_keras `fit`'s batch loop, whose `_run_counter` it adds to) is watched.
        Scope { entered: bool },
        /// After a notice: `handle` returns what still fits before this worker's
        /// earliest deadline, `(fit, seconds left, seconds needed, final_round)` with
        /// `fit` one of "both", "one_save", "neither", "unknown" (the grace
        /// planner's), or None without a notice planned.
        Fit {},
        /// The process exits; the platform stated, after the notice, that it ends
        /// the process `ends_in` seconds from now (a SLURM job this handler
        /// requeued), or None. `handle` returns the seconds until the platform ends
        /// the process as it stated it (`Protocol::kill_deadline`; None: nothing
        /// stated): the exit guard's.
        Exiting { ends_in: Option<f64> = None },
        /// Shutdown: `handle` returns `(writes, join)`: the writes of `STOP_WATCHER`
        /// every worker makes (releasing the readers still blocked on the step
        /// keys), as `Action.Set`s, and the seconds each of the handler's
        /// threads is waited for (`THREAD_JOIN_TIMEOUT`).
        Shutdown {},
        /// A step's error is reported to the cluster: `handle` returns the seconds
        /// the report may block (`SHUTDOWN_WRITE_TIMEOUT`: TF's report waits for
        /// the service's leader).
        ErrorReport {},
        /// This handler takes over its worker's notices now (the wall clock read
        /// then): an older handler still open hands it every notice it sees.
        TakeOver {},
        /// A notice that arrived at `at` (Unix time, the inbox's stamp; None: not
        /// known) reached an older handler: `handle` returns whether it came after
        /// this (newer) handler took over, and so is this one's.
        Arrived { at: Option<f64> = None },
    }
}
