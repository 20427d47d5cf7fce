//! A user's `termination_watcher_fn` (TensorFlow's `TerminationConfig`): a Python
//! callable, so a Python thread calls it (`_platforms/notice_sources.py`) and posts
//! what it finds into the handler's inbox; how often, and how long that thread is
//! waited for, is decided here.

/// Seconds between the starts of two calls of `termination_watcher_fn`
/// (TensorFlow: once a second).
pub const WATCHER_FN_INTERVAL: f64 = 1.0;
/// A call of `termination_watcher_fn` longer than this many seconds is logged
/// (once): it delays only its own polls.
pub const SLOW_WATCHER_FN: f64 = 5.0;
/// Bound, in seconds, on joining the watcher-fn thread at close: a call in progress
/// is not waited out.
pub const WATCHER_FN_JOIN_TIMEOUT: f64 = 1.0;
