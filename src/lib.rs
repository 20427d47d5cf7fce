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
//! | [`step_resolution`] | who saves at which step; claims, acknowledgements, the two grace rounds |
//! | [`grace`] | when the final round of a grace period must start |
//! | [`notice`] | a termination notice (when seen, when the machine goes away), below both of the above |
//! | [`termination`] | signal plumbing that turns a delivery into one wake-up, from any thread |
//! | [`closure_queue`] | the `ClusterCoordinator`'s queue: in-flight counting, tags, put-back, errors, cancellation |
//! | [`failure`] | which errors mean "a worker failed" or "a parameter server failed" (one table) |
//! | [`sources`] | metadata-service termination sources (GCE, AWS, Azure): sans-IO pollers and the threads that run them |
//! | [`inbox`] | the driver's inputs (notices, step keys, stop) in one `crossbeam-channel` inbox |
//! | [`http`] | a minimal, strictly bounded HTTP/1.1 client for metadata servers |
//!
//! The PyO3 binding (`python` feature, on when built by maturin) is the only
//! module that knows about Python; `cargo test` needs no Python.

pub mod closure_queue;
pub mod failure;
pub mod grace;
pub mod http;
pub mod inbox;
pub mod notice;
pub mod sources;
pub mod step_resolution;
pub mod termination;

#[cfg(feature = "python")]
mod python;
