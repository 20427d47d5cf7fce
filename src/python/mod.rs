//! The PyO3 binding: the only module that knows about Python.
//!
//! | file | exposes |
//! | --- | --- |
//! | `blocking.rs` | the blocking-wait helpers every module below uses (GIL released in slices, signals checked on the main thread), and the rule on locks and the GIL (below every other file) |
//! | `clock.rs` | where the binding reads time, in one function (`read`, `clock_gettime`): the monotonic clock (`now_secs()`, `At`) for every deadline, wait slice and step time, the wall clock (`unix_now()`) only for a notice's stamp (and the other stamps a record or another process reads) and the conversion of a platform's wall-clock deadline; no other file reads a clock |
//! | `handler.rs` | `HandlerCore`, the native base of `PreemptionCheckpointHandler`: `run()`'s hot path and the step resolver |
//! | `inbox.rs` | `Inbox` and `Input`: the protocol driver's inputs in one place; its receive releases the GIL; the bound on joining its waiting threads at exit |
//! | `signals.rs` | `SignalWatch`: signals from any thread, chained, posted into an `Inbox`; its wait releases the GIL |
//! | `displacement.rs` | signal handlers someone replaced after ours, which both waits above look for (below both) |
//! | `closure_queue.rs` | `ClosureQueue`: the coordinator's closure queue |
//! | `closure.rs` | `Completions`, what the coordinator's `RemoteValue`s wait on; `timed`, the call that feeds TF's coordinator metrics |
//! | `exit_guard.rs` | `exit_guard`: after the last save, a Rust thread that ends a process still in its exit shortly before the kill its platform stated (`crate::grace::exit_guard_delay`) with its exit code, not the platform's SIGKILL; a step or a new handler (`exit_guard()` without a code) stands it down |
//! | `errors.rs` | the one map from the core's errors (and bad arguments) to Python's exceptions |
//! | `failure.rs` | the worker/PS failure classifier; the bounds on a worker's recovery and on the coordinator's stop |
//! | `retry.rs` | `WriteKind`: what a write of the driver is (its schedule, and the retry rule's, are `ProtocolCore`'s, `crate::protocol`) |
//! | `ps_control.rs` | the parameter-server task control (`crate::ps_control`): `CoordinatorProtocol` (the coordinator's protocol object: polls, releases, drains, the save's wait, a closure's error in TF's order), `TaskProtocol` (a served task's); each with its event and action types nested (`CoordinatorProtocol.Event`) |
//! | `host_memory.rs` | `copy_place`: whether a non-chief's whole copy of a checkpoint may go to memory (`crate::host_memory`) |
//! | `input_position.rs` | `InputResume`: where a restarted input resumes (`InputResume.of`, `InputResume.batches_given`), and `InputResume.Timing`: when a slow resume is logged (`crate::input_position`) |
//! | `logs.rs` | the global logger: pyo3-log behind a gate that keeps unattached threads out of the interpreter once `close()` leaves threads running |
//! | `layout.rs` | the type fields the stable ABI hides, read where their layout is checked |
//! | `records.rs` | the preemption records (`crate::records`): bytes in, JSON text of `records.Preemption` and `records.Resume` out; the schema's checks; the claims of `resumed` lines; each line's wall-clock stamp; the records' waits' bounds |
//! | `shares.rs` | `assign_shares`: which worker writes which tensor of a checkpoint the workers write together; `SharesWaits` (with its `Action`): every wait of the shares (the probe, a save's waits, whether the chief starts the merge) as events in, actions out (`crate::shares`) |
//! | `slurm.rs` | `SlurmJob` (with its `Event` and `Action`): the SLURM job's protocol object (`crate::sources::slurm::Job`); the requeue's pauses waited |
//! | `wire.rs` | `py_enum!`: a core `wire!` declaration (`crate::wire`) expanded into its Python class and conversions, one line per type; the conversions of core field types (a `Round` is its key) |
//! | `sources.rs` | `MetadataWatch`, `WatcherFnPoll` and `platforms`: GCE/AWS/Azure metadata termination notices, polled on Rust threads; the platforms' one table (each cloud's detection and probe, default grace periods, exit codes; Kubernetes' SIGTERM deadlines); the watcher fn's schedule |
//! | `watcher.rs` | `KeyWatch`: `PreemptionWatcher`'s watch of a coordination-service key (`crate::sources::key_watch`); the bounds of the coordination client's calls and of the peer health probes |
//!
//! Every blocking call goes through `blocking.rs`; read its rule on locks and
//! the GIL before adding a lock, a once-cell or a wait.

use pyo3::prelude::*;

mod blocking;
mod clock;
mod closure;
mod closure_queue;
mod displacement;
mod errors;
mod exit_guard;
mod failure;
mod handler;
mod host_memory;
mod inbox;
mod input_position;
mod layout;
mod logs;
mod ps_control;
mod records;
mod retry;
mod shares;
mod signals;
mod slurm;
mod sources;
mod watcher;
mod wire;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // A second initialisation (a re-import) is harmless.
    logs::install(m.py())?;
    logs::init();
    let main: u64 = blocking::py_main_thread_ident(m.py())?;
    let _ = blocking::MAIN_THREAD.set(main);
    // The once-cells filled by `dlsym` are filled here, before any other
    // thread can call in (see "Locks and the GIL" above).
    let _ = blocking::interpreter_finalizing();
    handler::resolve_vectorcall();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("RUN_TO_CHECKPOINT", crate::step_resolution::RUN_TO_CHECKPOINT)?;
    m.add("LAST_RUN_TO_CHECKPOINT", crate::step_resolution::LAST_RUN_TO_CHECKPOINT)?;
    m.add("TERMINATED_WORKER", crate::step_resolution::TERMINATED_WORKER)?;
    m.add("ACK_PREFIX", crate::step_resolution::ACK_PREFIX)?;
    m.add("ACK_VALUE", crate::step_resolution::ACK_VALUE)?;
    m.add("STOP_WATCHER", crate::step_resolution::STOP_WATCHER)?;
    m.add("PREEMPTION_NOTICE_KEY", crate::step_resolution::PREEMPTION_NOTICE_KEY)?;
    m.add("CHECKPOINTED_RUNS", crate::step_resolution::CHECKPOINTED_RUNS)?;
    m.add_class::<handler::HandlerCore>()?;
    m.add_class::<handler::ProtocolCore>()?;
    m.add_class::<handler::Event>()?;
    m.add_class::<handler::Action>()?;
    m.add("DEFAULT_GRACE_PERIOD", crate::grace::DEFAULT_GRACE_PERIOD)?;
    handler::add_run(m.py())?;
    signals::register(m)?;
    inbox::register(m)?;
    closure_queue::register(m)?;
    closure::register(m)?;
    failure::register(m)?;
    layout::register(m)?;
    records::register(m)?;
    retry::register(m)?;
    shares::register(m)?;
    host_memory::register(m)?;
    ps_control::register(m)?;
    input_position::register(m)?;
    sources::register(m)?;
    slurm::register(m)?;
    watcher::register(m)?;
    exit_guard::register(m)?;
    Ok(())
}
