//! The core of `tf-failure-handling`: preemption handling for `tf.distribute`.
//!
//! TensorFlow's `PreemptionCheckpointHandler` keeps its protocol in Python
//! threads and events. Here the protocol is a set of sans-IO state machines:
//! they take events and the current time, and return what to do. The Python
//! package (`python/tf_failure_handling`) performs those actions against
//! TensorFlow: coordination-service keys, checkpoint saves, the exit.
//!
//! | module | holds |
//! | --- | --- |
//! | [`protocol`] | the handler's protocol as one object: resolver, planner, step timing, and every bound worked out from them |
//! | [`step_resolution`] | who saves at which step; claims, acknowledgements, the two grace rounds |
//! | [`acks`] | a leader's wait for the acknowledgements of its step: which key to read, for how long, what a failed read leads to |
//! | [`grace`] | when the final round of a grace period must start |
//! | [`notice`] | a termination notice (when seen, when the machine goes away), below both of the above |
//! | [`records`] | the preemption records read: the schema of a line, the fold of lines into preemptions and restarts, the last exit a restart resumes from |
//! | [`deadline`] | a bounded wait's arithmetic (time left, passed, elapsed) for the protocol objects' waits, so that no wait works out `end - now` in Python |
//! | [`retry`] | the one retry rule of the protocol's coordination-service calls: pauses, bound, when to give up |
//! | [`writes`] | the driver's writes (acknowledge, claim, announce): which to attempt now, when to wake, what a failure or `close()` leaves (`poll_action` / `poll_timeout`) |
//! | [`shares`] | which worker writes which tensor when the workers write one checkpoint together |
//! | [`host_memory`] | whether a non-chief's whole copy of a checkpoint may be held in the host's memory (the cgroup's room, `MemAvailable`) |
//! | [`closure_queue`] | the `ClusterCoordinator`'s queue: in-flight counting, tags, put-back, errors, cancellation |
//! | [`failure`] | which errors mean "a worker failed" or "a parameter server failed" (one table) |
//! | [`type_layout`] | CPython's type and exception layout up to three fields the stable ABI hides, and the check that the running interpreter has it (the classifier's fast paths) |
//! | [`sources`] | the termination sources: signals ([`sources::signals`]: one wake-up per delivery, from any thread) and the metadata services of GCE, AWS and Azure (sans-IO pollers, the threads that run them, their bounded HTTP client [`sources::http`]) |
//! | [`ps_control`] | the parameter-server task control: which release a task accepts, which call to a task may start, what a poll's answer leads to, a worker's drain bound |
//! | [`input_position`] | where a restarted input resumes: which iterator and batch, how many iterators to make first |
//! | [`inbox`] | the driver's inputs (notices, step keys, stop) in one `crossbeam-channel` inbox |
//! | [`wire`] | one declaration for each event and action type that crosses to Python (`wire!`); the binding expands the same declaration into its classes |
//!
//! The PyO3 binding (`python` feature, on when built by maturin) is the only
//! module that knows about Python; `cargo test` needs no Python.

pub mod acks;
pub mod closure_queue;
pub mod deadline;
pub mod exit_guard;
pub mod failure;
pub mod grace;
pub mod host_memory;
pub mod inbox;
pub mod input_position;
pub mod notice;
pub mod protocol;
pub mod ps_control;
pub mod records;
pub mod retry;
pub mod shares;
pub mod sources;
pub mod step_resolution;
pub mod type_layout;
pub mod wire;
pub mod words;
pub mod writes;

#[cfg(feature = "python")]
mod python;
