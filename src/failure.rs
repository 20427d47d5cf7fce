//! Failure classification: which errors mean "a worker failed", which mean "a
//! parameter server failed", and how many of them the coordinator shrugs off.
//!
//! # Actors
//!
//! A `ClusterCoordinator` runs one thread per worker. Each takes a closure
//! from the queue and runs it on its worker; when the remote call raises, the
//! thread's `WorkerPreemptionHandler.wait_on_failure` decides what the error
//! means, in this order (TF 2.21, `cluster_coordinator.py`):
//!
//! 1. **Transient PS failure?** `Cluster._record_and_ignore_transient_ps_failure`:
//!    if the error is a PS failure ([`Verdict::Ps`]), every PS task named in
//!    its message (`/job:ps/replica:0/task:N`, [`ps_task_ids`]) gets one more
//!    strike; while no named task has reached the threshold the error is
//!    ignored and the closure is put back ([`TransientFailures::record_ps_failure`]).
//! 2. **Transient timeout?** `Cluster._record_and_ignore_transient_timeouts`:
//!    a `DeadlineExceededError` is ignored until the cluster-wide count reaches
//!    its threshold ([`TransientFailures::record_timeout`]).
//! 3. A `CancelledError` whose message names a `/job:` is ignored (the
//!    caller's rule; it needs no table).
//! 4. **Worker failure?** If [`Verdict::Worker`] holds and the queue was not
//!    cancelled, the closure is put back and the thread waits for the worker
//!    to come back; anything else is re-raised to the user.
//!
//! That order is [`response`]'s: it asks the questions one at a time (two of
//! them count what they see) and says what to do, and what follows the wait.
//!
//! # The table
//!
//! [`RULES`] is TF's `_is_ps_failure` and `_is_worker_failure` written down as
//! data: one row per `return True` of those functions. A verdict holds when
//! any of its rows matches, which is exactly what TF's chains of early
//! `return False`/`return True` compute (each early `return False` is a
//! condition shared by all the rows after it, so it is repeated in each of
//! them). A row matches when
//!
//! * the error is an instance of one of the row's [`Kinds`] (isinstance
//!   semantics: `PSUnavailableError` is also an `UnavailableError`),
//! * its message (`str(error)`) contains every `all` needle, at least one
//!   `any` needle (when there are any) and no `none` needle,
//! * and the row's [`Gate`] is open (`TF_PS_HANDLE_UNKNOWN_ERROR` > 0 for the
//!   one row that has one).
//!
//! Each row also says at which [`Stage`] it looks: at the error as raised
//! ([`Stage::Outer`]) or at the error after one `ClosureInputError` /
//! `ClosureAbortedError` has been unwrapped to its `original_exception`
//! ([`Stage::Unwrapped`]). TF is not uniform here, and the difference is
//! observable:
//!
//! * `_is_ps_failure` tests `PSUnavailableError` *before* unwrapping, so a
//!   `ClosureInputError` around a `PSUnavailableError` is a PS failure only if
//!   the inner message holds the gRPC-from-PS string;
//! * `_is_worker_failure` tests the `UnknownError` / `Graph execution error`
//!   row *before* unwrapping, so a wrapped one never matches it;
//! * all other rows look at the unwrapped error only (the wrapper's own
//!   message, which repeats the inner one, is never searched).
//!
//! The strings are TF 2.21's and could change between TF versions; they live in
//! the [`needle`] module next to the name TF gives them, and nowhere else. TF
//! 2.16's `_is_worker_failure`, `_is_ps_failure` and the strings they search are
//! the same as 2.21's (`python/tf_failure_handling/_integrations/tf_versions.py` fingerprints
//! them per release; `make test-compat` checks them and the errors each release
//! raises). A release that changes them gets its own table here, chosen by the
//! release `_integrations.tf_versions` reports, not `if`s in the rows.
//!
//! # Laziness
//!
//! Rows are tried in TF's order, and the classifier asks its [`Subject`] for
//! a fact only when a row needs it: the kinds first (cheap), then the message
//! (a `str()` call in Python), then the gate (an environment read). A row
//! whose kinds do not match costs one AND; an error of an unrelated class is
//! classified without its message ever being built. Each needle is searched
//! at most once per message. The only behaviour this changes is that TF reads
//! `TF_PS_HANDLE_UNKNOWN_ERROR` on every `_is_worker_failure` call, so a
//! malformed value (`int()` fails) raises for every error; here it is read
//! (per call, never cached) only for an `UnknownError` that says
//! `Graph execution error`, the only error whose verdict it can change.
//!
//! Matching `unknown device` case-insensitively follows Python's
//! `str.lower()`, which is not ASCII-only: `KELVIN SIGN` (U+212A) lowers to
//! `k`, so `UNKNOWN DEVICE` written with it matches in TF, and here.
//!
//! # Transient tolerances
//!
//! [`TransientFailures`] holds TF's two counters. They are plain state: the
//! binding wraps them in a mutex and never holds it while Python runs (the
//! classification and the message parsing happen before it is taken). TF
//! quirks kept on purpose, because the coordinator's retry behaviour depends
//! on them:
//!
//! * strikes are counted per PS task and never reset;
//! * the tasks of one error are visited in Python `set` iteration order, and
//!   the first one to reach the threshold stops the visit, so later tasks of
//!   the same error are not counted (the caller passes the order);
//! * a PS failure whose message names no task is always ignored;
//! * a task number not below the number of PS tasks is an error
//!   ([`TransientError::UnknownPsTask`]; TF raises `IndexError`), after the
//!   tasks visited before it were counted.

pub mod lost_peer;
pub mod response;

use std::collections::BTreeSet;
use std::sync::OnceLock;

use memchr::memmem;

use thiserror::Error;

/// The error classes the classifier tells apart.
///
/// Each is a Python class (TF's where TF is installed); an error is an
/// instance of any number of them, so the classifier works on [`Kinds`], a
/// set of these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorKind {
    /// `tf.errors.CancelledError`.
    Cancelled,
    /// `tf.errors.UnknownError`.
    Unknown,
    /// `tf.errors.InvalidArgumentError`.
    InvalidArgument,
    /// `tf.errors.DeadlineExceededError` (only the timeout counter looks at it).
    DeadlineExceeded,
    /// `tf.errors.NotFoundError`.
    NotFound,
    /// `tf.errors.AbortedError`.
    Aborted,
    /// `tf.errors.UnavailableError`.
    Unavailable,
    /// The coordinator's `PSUnavailableError` (a subclass of `UnavailableError`:
    /// an error of this kind is also [`ErrorKind::Unavailable`]).
    PsUnavailable,
    /// The coordinator's `ClosureInputError`, a wrapper with `original_exception`.
    ClosureInput,
    /// The coordinator's `ClosureAbortedError`, a wrapper with `original_exception`.
    ClosureAborted,
    /// Python's built-in `TypeError`.
    TypeError,
    /// None of the above (`ValueError`, other `OpError`s, …): adds nothing to a [`Kinds`].
    Other,
}

impl ErrorKind {
    /// Every kind that contributes to a [`Kinds`], in bit order.
    pub const ALL: [ErrorKind; 11] = [
        ErrorKind::Cancelled,
        ErrorKind::Unknown,
        ErrorKind::InvalidArgument,
        ErrorKind::DeadlineExceeded,
        ErrorKind::NotFound,
        ErrorKind::Aborted,
        ErrorKind::Unavailable,
        ErrorKind::PsUnavailable,
        ErrorKind::ClosureInput,
        ErrorKind::ClosureAborted,
        ErrorKind::TypeError,
    ];
}

/// A set of [`ErrorKind`]s: every class of the table an error is an instance of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Kinds(u16);

impl Kinds {
    /// No kind of the table: an unrelated error.
    pub const EMPTY: Kinds = Kinds(0);
    /// `CancelledError`.
    pub const CANCELLED: Kinds = Kinds::bit(ErrorKind::Cancelled);
    /// `UnknownError`.
    pub const UNKNOWN: Kinds = Kinds::bit(ErrorKind::Unknown);
    /// `InvalidArgumentError`.
    pub const INVALID_ARGUMENT: Kinds = Kinds::bit(ErrorKind::InvalidArgument);
    /// `DeadlineExceededError`.
    pub const DEADLINE_EXCEEDED: Kinds = Kinds::bit(ErrorKind::DeadlineExceeded);
    /// `NotFoundError`.
    pub const NOT_FOUND: Kinds = Kinds::bit(ErrorKind::NotFound);
    /// `AbortedError`.
    pub const ABORTED: Kinds = Kinds::bit(ErrorKind::Aborted);
    /// `UnavailableError`.
    pub const UNAVAILABLE: Kinds = Kinds::bit(ErrorKind::Unavailable);
    /// `PSUnavailableError` alone; a real one is `PS_UNAVAILABLE | UNAVAILABLE`.
    pub const PS_UNAVAILABLE: Kinds = Kinds::bit(ErrorKind::PsUnavailable);
    /// `ClosureInputError`.
    pub const CLOSURE_INPUT: Kinds = Kinds::bit(ErrorKind::ClosureInput);
    /// `ClosureAbortedError`.
    pub const CLOSURE_ABORTED: Kinds = Kinds::bit(ErrorKind::ClosureAborted);
    /// `TypeError`.
    pub const TYPE_ERROR: Kinds = Kinds::bit(ErrorKind::TypeError);
    /// The wrappers whose `original_exception` the [`Stage::Unwrapped`] rows look at.
    pub const WRAPPERS: Kinds = Kinds(Kinds::CLOSURE_INPUT.0 | Kinds::CLOSURE_ABORTED.0);

    const fn bit(kind: ErrorKind) -> Kinds {
        match kind {
            ErrorKind::Other => Kinds(0),
            k => Kinds(1 << k as u16),
        }
    }

    /// The set holding `kind` alone (empty for [`ErrorKind::Other`]).
    #[must_use]
    pub const fn of(kind: ErrorKind) -> Kinds {
        Kinds::bit(kind)
    }

    /// Both sets together.
    #[must_use]
    pub const fn union(self, other: Kinds) -> Kinds {
        Kinds(self.0 | other.0)
    }

    /// Whether the sets share a kind.
    #[must_use]
    pub const fn intersects(self, other: Kinds) -> bool {
        self.0 & other.0 != 0
    }

    /// Whether `kind` is in the set ([`ErrorKind::Other`] never is).
    #[must_use]
    pub const fn contains(self, kind: ErrorKind) -> bool {
        self.intersects(Kinds::bit(kind))
    }

    /// The set as bits (bit `k` is the `k`-th of [`ErrorKind::ALL`]).
    #[must_use]
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// The set of [`Kinds::bits`]; bits beyond [`ErrorKind::ALL`] are dropped.
    #[must_use]
    pub const fn from_bits(bits: u16) -> Kinds {
        Kinds(bits & ((1 << ErrorKind::ALL.len()) - 1))
    }

    /// Whether no kind of the table is in the set.
    #[must_use]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl From<ErrorKind> for Kinds {
    fn from(kind: ErrorKind) -> Kinds {
        Kinds::of(kind)
    }
}

impl std::ops::BitOr for Kinds {
    type Output = Kinds;
    fn bitor(self, rhs: Kinds) -> Kinds {
        self.union(rhs)
    }
}

impl FromIterator<ErrorKind> for Kinds {
    fn from_iter<I: IntoIterator<Item = ErrorKind>>(iter: I) -> Kinds {
        iter.into_iter().fold(Kinds::EMPTY, |acc, k| acc | Kinds::of(k))
    }
}

/// Which of TF's two questions a rule answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// `_is_ps_failure`: a parameter server is gone; not recoverable by the coordinator.
    Ps,
    /// `_is_worker_failure`: a worker is gone; put the closure back and wait for it.
    Worker,
}

/// Which error a rule looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The error as raised, before TF unwraps anything.
    Outer,
    /// The `original_exception` of a `ClosureInputError`/`ClosureAbortedError`
    /// (one level, as TF), or the error itself when it is not one of those.
    Unwrapped,
}

/// An extra condition outside the error itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gate {
    /// No condition.
    Always,
    /// `int(os.environ.get("TF_PS_HANDLE_UNKNOWN_ERROR", "0")) > 0`, read per call.
    HandleUnknownError,
}

/// The environment variable behind [`Gate::HandleUnknownError`] (TF reads it per call).
pub const HANDLE_UNKNOWN_ERROR_ENV: &str = "TF_PS_HANDLE_UNKNOWN_ERROR";
/// Strikes a PS task may collect before its failure is believed (`Cluster.__init__`).
pub const IGNORE_TRANSIENT_PS_FAILURES_ENV: &str = "TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES";
/// Timeouts the cluster ignores before one is raised (`Cluster.__init__`).
pub const IGNORE_TRANSIENT_TIMEOUTS_ENV: &str = "TF_COORDINATOR_IGNORE_TRANSIENT_TIMEOUTS";
/// Default of [`IGNORE_TRANSIENT_PS_FAILURES_ENV`].
pub const DEFAULT_TRANSIENT_PS_FAILURES: i64 = 3;
/// Seconds a worker thread waits for its failed worker to come back (step 4
/// above) before the failure is raised: TensorFlow's bound, unless
/// `ClusterCoordinator(worker_recovery_timeout=...)` or
/// `TF_FAILURE_HANDLING_WORKER_RECOVERY_TIMEOUT` says otherwise.
pub const DEFAULT_WORKER_RECOVERY_TIMEOUT: f64 = 3600.0;
/// Seconds the coordinator's stop waits for the worker-recovery thread to let
/// go of the cluster (it holds it while a lost worker is away); past it the
/// stop goes on without it.
pub const STOP_LOCK_BOUND: f64 = 5.0;

/// Default of [`IGNORE_TRANSIENT_TIMEOUTS_ENV`]: `num_workers // 10`.
#[must_use]
pub fn default_transient_timeouts(num_workers: usize) -> i64 {
    i64::try_from(num_workers / 10).unwrap_or(i64::MAX)
}

/// A string a rule looks for in an error message.
///
/// Each needle is searched at most once per message; its index is its place
/// in [`Needle::ALL`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Needle {
    /// [`needle::RPC_ERROR_FROM_PS`].
    RpcErrorFromPs,
    /// [`needle::JOB_WORKER`].
    JobWorker,
    /// [`needle::UNKNOWN_DEVICE`], case-insensitive.
    UnknownDevice,
    /// [`needle::REMOTE_HANDLE`].
    RemoteHandle,
    /// [`needle::PRIMARY_DEVICE_NOT_REMOTE`].
    PrimaryDeviceNotRemote,
    /// [`needle::FUNCTION_NOT_REGISTERED`].
    FunctionNotRegistered,
    /// [`needle::GRAPH_EXECUTION_ERROR`].
    GraphExecutionError,
    /// [`needle::BINDING_INPUTS`].
    BindingInputs,
}

/// The strings of TensorFlow 2.21's `cluster_coordinator.py`, each under the
/// name TF gives it (or the function it appears in).
pub mod needle {
    /// `_RPC_ERROR_FROM_PS`: the gRPC status of an error relayed from a PS.
    pub const RPC_ERROR_FROM_PS: &str = "GRPC error information from remote target /job:ps";
    /// `_JOB_WORKER_STRING_IDENTIFIER` (TF: "`InvalidArgumentError` (unknown
    /// device) will not have 'GRPC error...' string").
    pub const JOB_WORKER: &str = "/job:worker";
    /// `_is_ps_failure`/`_is_worker_failure`: `"unknown device" in str(error).lower()`.
    /// Stored lower-case; matched case-insensitively the way `str.lower()` does.
    pub const UNKNOWN_DEVICE: &str = "unknown device";
    /// `_is_ps_failure`/`_is_worker_failure`: a task restarted behind a reused gRPC channel.
    pub const REMOTE_HANDLE: &str = "Unable to find the relevant tensor remote_handle";
    /// `_is_worker_failure`: same cause as [`REMOTE_HANDLE`], seen on workers only.
    pub const PRIMARY_DEVICE_NOT_REMOTE: &str = "Primary device is not remote";
    /// `_is_worker_failure`: function registration lost with the worker (b/162541228).
    pub const FUNCTION_NOT_REGISTERED: &str = "is neither a type of a primitive operation nor a name of a function registered";
    /// `_is_worker_failure`, gated by `TF_PS_HANDLE_UNKNOWN_ERROR` (b/216666282).
    pub const GRAPH_EXECUTION_ERROR: &str = "Graph execution error";
    /// `_is_worker_failure`: building an iterator for exact evaluation on a dead worker.
    pub const BINDING_INPUTS: &str = "Binding inputs to tf.function";
}

impl Needle {
    /// Every needle, in index order.
    pub const ALL: [Needle; 8] = [
        Needle::RpcErrorFromPs,
        Needle::JobWorker,
        Needle::UnknownDevice,
        Needle::RemoteHandle,
        Needle::PrimaryDeviceNotRemote,
        Needle::FunctionNotRegistered,
        Needle::GraphExecutionError,
        Needle::BindingInputs,
    ];

    /// The string looked for (lower-case when [`Needle::ignores_case`]).
    #[must_use]
    pub const fn text(self) -> &'static str {
        match self {
            Needle::RpcErrorFromPs => needle::RPC_ERROR_FROM_PS,
            Needle::JobWorker => needle::JOB_WORKER,
            Needle::UnknownDevice => needle::UNKNOWN_DEVICE,
            Needle::RemoteHandle => needle::REMOTE_HANDLE,
            Needle::PrimaryDeviceNotRemote => needle::PRIMARY_DEVICE_NOT_REMOTE,
            Needle::FunctionNotRegistered => needle::FUNCTION_NOT_REGISTERED,
            Needle::GraphExecutionError => needle::GRAPH_EXECUTION_ERROR,
            Needle::BindingInputs => needle::BINDING_INPUTS,
        }
    }

    /// Whether TF compares against `str(error).lower()`.
    #[must_use]
    pub const fn ignores_case(self) -> bool {
        matches!(self, Needle::UnknownDevice)
    }

    /// Whether `message` contains this needle, the way TF's `in` test decides.
    #[must_use]
    pub fn is_in(self, message: &str) -> bool {
        if self.ignores_case() {
            contains_lowered(message, self.text())
        } else {
            contains(message.as_bytes(), self)
        }
    }
}

/// `needle in haystack.lower()` with Python's `str.lower()`, for a
/// lower-case ASCII `needle`, without allocating for an ASCII haystack.
fn contains_lowered(haystack: &str, needle: &str) -> bool {
    if haystack.is_ascii() {
        contains_ascii_ignoring_case(haystack.as_bytes(), needle.as_bytes())
    } else {
        // Full Unicode lowering, as Python's (KELVIN SIGN → `k`, İ → `i̇`).
        memmem::find(haystack.to_lowercase().as_bytes(), needle.as_bytes()).is_some()
    }
}

/// `needle in haystack`, for the short haystacks of error messages, with the
/// needle's searcher built once (building one per call would cost more than
/// the search of a typical message).
fn contains(haystack: &[u8], needle: Needle) -> bool {
    // Pure Rust, never Python: a std `OnceLock` is safe here.
    static FINDERS: OnceLock<[memmem::Finder<'static>; Needle::ALL.len()]> = OnceLock::new();
    let finders = FINDERS.get_or_init(|| Needle::ALL.map(|n| memmem::Finder::new(n.text())));
    finders[needle as usize].find(haystack).is_some()
}

/// Whether the lower-case ASCII `needle` occurs in `haystack`, ASCII letters of
/// `haystack` matching in either case: `memchr2` finds each place the first
/// byte occurs in either case, and only those are compared in full.
fn contains_ascii_ignoring_case(haystack: &[u8], needle: &[u8]) -> bool {
    let Some(&first) = needle.first() else {
        return true;
    };
    memchr::memchr2_iter(first, first.to_ascii_uppercase(), haystack)
        .any(|at| haystack.get(at..at + needle.len()).is_some_and(|w| w.eq_ignore_ascii_case(needle)))
}

/// One `return True` of TF's `_is_ps_failure` or `_is_worker_failure`.
#[derive(Clone, Copy, Debug)]
pub struct Rule {
    /// A stable name for tests and logs.
    pub name: &'static str,
    /// Which function the row belongs to.
    pub verdict: Verdict,
    /// Which error it looks at.
    pub stage: Stage,
    /// The error must be an instance of one of these.
    pub kinds: Kinds,
    /// The message must contain every one of these…
    pub all: &'static [Needle],
    /// …and at least one of these, when there are any…
    pub any: &'static [Needle],
    /// …and none of these.
    pub none: &'static [Needle],
    /// An extra condition outside the error.
    pub gate: Gate,
}

impl Rule {
    /// Whether the row reads the message at all.
    #[must_use]
    pub fn needs_message(&self) -> bool {
        !(self.all.is_empty() && self.any.is_empty() && self.none.is_empty())
    }
}

const ALWAYS: Gate = Gate::Always;
const UNAVAILABLE_OR_ABORTED: Kinds = Kinds(Kinds::UNAVAILABLE.0 | Kinds::ABORTED.0);

/// The classifier: TensorFlow 2.21, `tensorflow/python/distribute/coordinator/
/// cluster_coordinator.py`, `_is_ps_failure` (lines 1760–1789) and
/// `_is_worker_failure` (lines 1796–1851), one row per `return True`, in TF's
/// order. A verdict holds when any of its rows matches.
pub static RULES: &[Rule] = &[
    // ---- _is_ps_failure ----
    // `if isinstance(error, PSUnavailableError): return True` (before unwrapping).
    Rule {
        name: "ps/ps-unavailable-error",
        verdict: Verdict::Ps,
        stage: Stage::Outer,
        kinds: Kinds::PS_UNAVAILABLE,
        all: &[],
        any: &[],
        none: &[],
        gate: ALWAYS,
    },
    // `if _RPC_ERROR_FROM_PS not in str(error): return False`
    // `if isinstance(error, (errors.UnavailableError, errors.AbortedError)): return True`
    Rule {
        name: "ps/rpc-unavailable-or-aborted",
        verdict: Verdict::Ps,
        stage: Stage::Unwrapped,
        kinds: UNAVAILABLE_OR_ABORTED,
        all: &[Needle::RpcErrorFromPs],
        any: &[],
        none: &[],
        gate: ALWAYS,
    },
    // `isinstance(error, errors.InvalidArgumentError)` and ("unknown device" in
    // str(error).lower() or "Unable to find the relevant tensor remote_handle" in ...):
    // a restarted PS behind a reused gRPC channel.
    Rule {
        name: "ps/rpc-reused-channel",
        verdict: Verdict::Ps,
        stage: Stage::Unwrapped,
        kinds: Kinds::INVALID_ARGUMENT,
        all: &[Needle::RpcErrorFromPs],
        any: &[Needle::UnknownDevice, Needle::RemoteHandle],
        none: &[],
        gate: ALWAYS,
    },
    // ---- _is_worker_failure ----
    // `_handle_graph_execution_error_as_worker_failure() and isinstance(error,
    // errors.UnknownError) and "Graph execution error" in str(error)` (before unwrapping).
    Rule {
        name: "worker/graph-execution-error",
        verdict: Verdict::Worker,
        stage: Stage::Outer,
        kinds: Kinds::UNKNOWN,
        all: &[Needle::GraphExecutionError],
        any: &[],
        none: &[],
        gate: Gate::HandleUnknownError,
    },
    // `if _JOB_WORKER_STRING_IDENTIFIER not in str(error): return False`
    // `if _RPC_ERROR_FROM_PS in str(error): return False` (both repeated below)
    // `if isinstance(error, (errors.UnavailableError, errors.AbortedError)): return True`
    Rule {
        name: "worker/unavailable-or-aborted",
        verdict: Verdict::Worker,
        stage: Stage::Unwrapped,
        kinds: UNAVAILABLE_OR_ABORTED,
        all: &[Needle::JobWorker],
        any: &[],
        none: &[Needle::RpcErrorFromPs],
        gate: ALWAYS,
    },
    // `isinstance(error, errors.InvalidArgumentError)` and ("unknown device" in
    // str(error).lower() or "Primary device is not remote" in ... or
    // "Unable to find the relevant tensor remote_handle" in ...).
    Rule {
        name: "worker/reused-channel",
        verdict: Verdict::Worker,
        stage: Stage::Unwrapped,
        kinds: Kinds::INVALID_ARGUMENT,
        all: &[Needle::JobWorker],
        any: &[Needle::UnknownDevice, Needle::PrimaryDeviceNotRemote, Needle::RemoteHandle],
        none: &[Needle::RpcErrorFromPs],
        gate: ALWAYS,
    },
    // `isinstance(error, errors.NotFoundError)` and "is neither a type of a
    // primitive operation nor a name of a function registered" in str(error).
    Rule {
        name: "worker/function-not-registered",
        verdict: Verdict::Worker,
        stage: Stage::Unwrapped,
        kinds: Kinds::NOT_FOUND,
        all: &[Needle::JobWorker, Needle::FunctionNotRegistered],
        any: &[],
        none: &[Needle::RpcErrorFromPs],
        gate: ALWAYS,
    },
    // `if isinstance(error, errors.CancelledError): return True` (b/179061495),
    // still behind the `/job:worker` and not-from-PS tests above it.
    Rule {
        name: "worker/cancelled",
        verdict: Verdict::Worker,
        stage: Stage::Unwrapped,
        kinds: Kinds::CANCELLED,
        all: &[Needle::JobWorker],
        any: &[],
        none: &[Needle::RpcErrorFromPs],
        gate: ALWAYS,
    },
    // `isinstance(error, TypeError) and "Binding inputs to tf.function" in str(error)`.
    Rule {
        name: "worker/binding-inputs",
        verdict: Verdict::Worker,
        stage: Stage::Unwrapped,
        kinds: Kinds::TYPE_ERROR,
        all: &[Needle::JobWorker, Needle::BindingInputs],
        any: &[],
        none: &[Needle::RpcErrorFromPs],
        gate: ALWAYS,
    },
];

/// What the classifier may ask about one error; each answer is asked for
/// only when a row needs it (see the module's "Laziness").
///
/// For [`Stage::Unwrapped`], an implementation answers about the error's
/// `original_exception` when the error is a wrapper ([`Kinds::WRAPPERS`]),
/// and about the error itself otherwise. Answers are not memoised by the
/// classifier except the needle searches; an implementation caches what is
/// costly to produce (the message, the unwrapped error).
pub trait Subject {
    /// What answering can fail with (a Python exception in the binding).
    type Error;
    /// The kinds of the error at `stage`.
    ///
    /// # Errors
    ///
    /// Whatever finding them fails with (e.g. a missing `original_exception`).
    fn kinds(&mut self, stage: Stage) -> Result<Kinds, Self::Error>;
    /// `str()` of the error at `stage`.
    ///
    /// # Errors
    ///
    /// Whatever building the message fails with (a raising `__str__`).
    fn message(&mut self, stage: Stage) -> Result<&str, Self::Error>;
    /// Whether `gate` is open.
    ///
    /// # Errors
    ///
    /// Whatever reading the condition fails with (a malformed environment value).
    fn gate(&mut self, gate: Gate) -> Result<bool, Self::Error>;
}

/// Needle results for one message: `None` until searched.
#[derive(Clone, Copy, Default)]
struct Memo([Option<bool>; Needle::ALL.len()]);

impl Memo {
    fn has(&mut self, needle: Needle, message: &str) -> bool {
        *self.0[needle as usize].get_or_insert_with(|| needle.is_in(message))
    }

    fn matches(&mut self, rule: &Rule, message: &str) -> bool {
        // Cheap, decisive tests first: `/job:worker` or the PS string rule out most errors.
        rule.all.iter().all(|&n| self.has(n, message))
            && !rule.none.iter().any(|&n| self.has(n, message))
            && (rule.any.is_empty() || rule.any.iter().any(|&n| self.has(n, message)))
    }
}

/// Whether `verdict` holds for `subject`: TF's `_is_ps_failure` ([`Verdict::Ps`])
/// or `_is_worker_failure` ([`Verdict::Worker`]), driven by [`RULES`].
///
/// # Errors
///
/// The first error `subject` returns; classification stops there, as TF's
/// function would stop at the raising `str()` or attribute read.
pub fn classify<S: Subject>(verdict: Verdict, subject: &mut S) -> Result<bool, S::Error> {
    let mut memos = [Memo::default(); 2];
    verdict_with(verdict, subject, &mut memos)
}

/// Both verdicts for `subject` at once, as the coordinator needs them for a
/// failed closure: [`Verdict::Ps`] first, then [`Verdict::Worker`], each
/// exactly as [`classify`] would answer it. The kinds, messages and needle
/// searches are shared between the two, so each `str()` is asked for and
/// each needle searched at most once for the pair.
///
/// # Errors
///
/// The first error `subject` returns (the PS verdict never reads the gate,
/// so a gate that fails fails after the PS verdict is known).
pub fn classify_both<S: Subject>(subject: &mut S) -> Result<Classification, S::Error> {
    let mut memos = [Memo::default(); 2];
    let ps_failure = verdict_with(Verdict::Ps, subject, &mut memos)?;
    let worker_failure = verdict_with(Verdict::Worker, subject, &mut memos)?;
    Ok(Classification {
        ps_failure,
        worker_failure,
    })
}

fn verdict_with<S: Subject>(verdict: Verdict, subject: &mut S, memos: &mut [Memo; 2]) -> Result<bool, S::Error> {
    let outer = subject.kinds(Stage::Outer)?;
    let unwraps = outer.intersects(Kinds::WRAPPERS);
    // One memo per distinct error: the outer one and, when unwrapping, the inner one.
    for rule in RULES.iter().filter(|r| r.verdict == verdict) {
        let (kinds, slot) = if rule.stage == Stage::Unwrapped && unwraps {
            (subject.kinds(Stage::Unwrapped)?, 1)
        } else {
            (outer, 0)
        };
        if !kinds.intersects(rule.kinds) {
            continue;
        }
        if rule.needs_message() {
            let message = subject.message(rule.stage)?;
            if !memos[slot].matches(rule, message) {
                continue;
            }
        }
        if rule.gate == Gate::Always || subject.gate(rule.gate)? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// An error as seen from outside: its kinds and `str()` of it.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    /// Every kind of the table the error is an instance of.
    pub kinds: Kinds,
    /// `str(error)`.
    pub message: &'a str,
}

/// Both verdicts for one error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Classification {
    /// TF's `_is_ps_failure`.
    pub ps_failure: bool,
    /// TF's `_is_worker_failure`.
    pub worker_failure: bool,
}

struct ObservedSubject<'a> {
    outer: Observed<'a>,
    inner: Option<Observed<'a>>,
    handle_unknown_error: bool,
}

impl ObservedSubject<'_> {
    fn at(&self, stage: Stage) -> Observed<'_> {
        match (stage, self.inner) {
            (Stage::Unwrapped, Some(inner)) if self.outer.kinds.intersects(Kinds::WRAPPERS) => inner,
            _ => self.outer,
        }
    }
}

impl Subject for ObservedSubject<'_> {
    type Error = std::convert::Infallible;
    fn kinds(&mut self, stage: Stage) -> Result<Kinds, Self::Error> {
        Ok(self.at(stage).kinds)
    }
    fn message(&mut self, stage: Stage) -> Result<&str, Self::Error> {
        Ok(self.at(stage).message)
    }
    fn gate(&mut self, gate: Gate) -> Result<bool, Self::Error> {
        Ok(match gate {
            Gate::Always => true,
            Gate::HandleUnknownError => self.handle_unknown_error,
        })
    }
}

/// Both verdicts for an error whose facts are already known.
///
/// `inner` is the wrapper's `original_exception`; it is used only when
/// `outer` is a wrapper (with no `inner`, a wrapper is judged as itself).
/// `handle_unknown_error` is `TF_PS_HANDLE_UNKNOWN_ERROR > 0`.
#[must_use]
pub fn classify_observed(outer: Observed<'_>, inner: Option<Observed<'_>>, handle_unknown_error: bool) -> Classification {
    let mut subject = ObservedSubject {
        outer,
        inner,
        handle_unknown_error,
    };
    match classify_both(&mut subject) {
        Ok(both) => both,
        Err(never) => match never {},
    }
}

/// The prefix of TF's `re.findall("/job:ps/replica:0/task:[0-9]+", err_msg)`.
pub const PS_TASK_PREFIX: &str = "/job:ps/replica:0/task:";

/// The digit strings of every match of TF's `/job:ps/replica:0/task:[0-9]+`
/// in `message`, left to right (`re.findall` order), without a regex engine.
///
/// The prefix cannot overlap itself, so scanning for it and taking the ASCII
/// digits after it finds exactly the regex's non-overlapping matches.
pub fn ps_task_ids(message: &str) -> impl Iterator<Item = &str> {
    message.match_indices(PS_TASK_PREFIX).filter_map(move |(at, _)| {
        let rest = &message[at + PS_TASK_PREFIX.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        (digits > 0).then(|| &rest[..digits])
    })
}

/// TF's `_extract_failed_ps_instances`: the PS task numbers named in `message`.
///
/// A number too large for `u64` saturates to `u64::MAX` (Python's ints are
/// unbounded; the binding builds them from [`ps_task_ids`] instead).
#[must_use]
pub fn failed_ps_instances(message: &str) -> BTreeSet<u64> {
    ps_task_ids(message).map(|d| d.parse().unwrap_or(u64::MAX)).collect()
}

/// What recording a transient failure can fail with.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TransientError {
    /// The message names a PS task the cluster does not have (TF: `IndexError`).
    #[error(
        "the error names parameter server task {task}, but the cluster has {num_ps} \
         parameter server task(s) (TensorFlow raises IndexError here)"
    )]
    UnknownPsTask {
        /// The task number from the message (saturated to `u64::MAX`).
        task: u64,
        /// How many PS tasks the cluster has.
        num_ps: usize,
    },
}

/// TF's `Cluster` transient-failure counters
/// (`_record_and_ignore_transient_ps_failure`, `_record_and_ignore_transient_timeouts`).
///
/// A threshold ≤ 0 turns its tolerance off: nothing is ignored and nothing
/// is counted. Counts only grow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransientFailures {
    /// `_transient_ps_failures_threshold`: strikes at which a PS failure is believed.
    ps_threshold: i64,
    /// `_transient_timeouts_threshold`: timeouts at which one is raised.
    timeouts_threshold: i64,
    /// `_potential_ps_failures_count`: strikes per PS task.
    ps_counts: Vec<u64>,
    /// `_transient_timeouts_count`.
    timeouts: u64,
}

impl TransientFailures {
    /// Counters for `num_ps` PS tasks with the given thresholds (TF reads them
    /// from [`IGNORE_TRANSIENT_PS_FAILURES_ENV`], default
    /// [`DEFAULT_TRANSIENT_PS_FAILURES`], and [`IGNORE_TRANSIENT_TIMEOUTS_ENV`],
    /// default [`default_transient_timeouts`]).
    #[must_use]
    pub fn new(num_ps: usize, ps_threshold: i64, timeouts_threshold: i64) -> Self {
        TransientFailures {
            ps_threshold,
            timeouts_threshold,
            ps_counts: vec![0; num_ps],
            timeouts: 0,
        }
    }

    /// Counters as TF's `Cluster.__init__` sets them up: each threshold given, else
    /// read from its variable by `env(name, default)` (TF's
    /// `int(os.environ.get(name, default))`), with [`DEFAULT_TRANSIENT_PS_FAILURES`]
    /// and [`default_transient_timeouts`] as the defaults.
    ///
    /// # Errors
    ///
    /// What `env` returns (a variable that is not an integer).
    pub fn configured<E>(
        num_ps: usize,
        num_workers: usize,
        ps_threshold: Option<i64>,
        timeouts_threshold: Option<i64>,
        mut env: impl FnMut(&str, i64) -> Result<i64, E>,
    ) -> Result<Self, E> {
        let ps_threshold = match ps_threshold {
            Some(t) => t,
            None => env(IGNORE_TRANSIENT_PS_FAILURES_ENV, DEFAULT_TRANSIENT_PS_FAILURES)?,
        };
        let timeouts_threshold = match timeouts_threshold {
            Some(t) => t,
            None => env(IGNORE_TRANSIENT_TIMEOUTS_ENV, default_transient_timeouts(num_workers))?,
        };
        Ok(TransientFailures::new(num_ps, ps_threshold, timeouts_threshold))
    }

    /// The PS threshold.
    #[must_use]
    pub fn ps_threshold(&self) -> i64 {
        self.ps_threshold
    }

    /// The timeout threshold.
    #[must_use]
    pub fn timeouts_threshold(&self) -> i64 {
        self.timeouts_threshold
    }

    /// Strikes per PS task.
    #[must_use]
    pub fn ps_counts(&self) -> &[u64] {
        &self.ps_counts
    }

    /// Timeouts recorded so far.
    #[must_use]
    pub fn timeouts(&self) -> u64 {
        self.timeouts
    }

    /// Whether PS failures are tolerated at all (TF tests this before classifying).
    #[must_use]
    pub fn tolerates_ps_failures(&self) -> bool {
        self.ps_threshold > 0
    }

    /// Whether timeouts are tolerated at all.
    #[must_use]
    pub fn tolerates_timeouts(&self) -> bool {
        self.timeouts_threshold > 0
    }

    /// Records a PS failure naming `tasks`; returns whether to ignore it.
    ///
    /// The caller has established that the error is a PS failure. `tasks` are
    /// visited in the given order (TF: Python `set` iteration order; a repeat
    /// is skipped, as a set has none); each gets a strike, and the first to
    /// reach the threshold ends the visit with "do not ignore". With no tasks
    /// the failure is ignored.
    ///
    /// # Errors
    ///
    /// [`TransientError::UnknownPsTask`] for a task `>= num_ps`, after the
    /// tasks before it were counted (TF's `IndexError`, same side effects).
    pub fn record_ps_failure(&mut self, tasks: &[u64]) -> Result<bool, TransientError> {
        if !self.tolerates_ps_failures() {
            return Ok(false);
        }
        for (i, &task) in tasks.iter().enumerate() {
            if tasks[..i].contains(&task) {
                continue;
            }
            let num_ps = self.ps_counts.len();
            let count = usize::try_from(task)
                .ok()
                .and_then(|t| self.ps_counts.get_mut(t))
                .ok_or(TransientError::UnknownPsTask { task, num_ps })?;
            *count += 1;
            if i128::from(*count) >= i128::from(self.ps_threshold) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Records a timeout; returns whether to ignore it.
    ///
    /// The caller has established that the error is a `DeadlineExceededError`.
    pub fn record_timeout(&mut self) -> bool {
        if !self.tolerates_timeouts() {
            return false;
        }
        self.timeouts += 1;
        i128::from(self.timeouts) < i128::from(self.timeouts_threshold)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::Strategy;

    use super::*;

    #[test]
    fn thresholds_given_win_over_the_environment_and_its_defaults() {
        let mut asked = Vec::new();
        let mut env = |name: &str, default: i64| -> Result<i64, ()> {
            asked.push((name.to_owned(), default));
            Ok(if name == IGNORE_TRANSIENT_PS_FAILURES_ENV { 7 } else { default })
        };
        let t = TransientFailures::configured(2, 35, None, None, &mut env).unwrap();
        assert_eq!((t.ps_threshold(), t.timeouts_threshold(), t.ps_counts().len()), (7, 3, 2));
        let given = TransientFailures::configured(1, 35, Some(0), Some(-1), &mut env).unwrap();
        assert_eq!((given.ps_threshold(), given.timeouts_threshold()), (0, -1));
        assert_eq!(
            asked,
            [
                (IGNORE_TRANSIENT_PS_FAILURES_ENV.to_owned(), DEFAULT_TRANSIENT_PS_FAILURES),
                (IGNORE_TRANSIENT_TIMEOUTS_ENV.to_owned(), 3),
            ]
        );
        let failed = TransientFailures::configured(1, 0, None, Some(1), |_, _| Err("not an int"));
        assert_eq!(failed.err(), Some("not an int"));
    }

    const PS: &str = "GRPC error information from remote target /job:ps/replica:0/task:1";
    const W: &str = "/job:worker/replica:0/task:0";

    fn k(kinds: &[ErrorKind]) -> Kinds {
        kinds.iter().copied().collect()
    }

    /// One row: outer kinds, outer message, the unwrapped error (kinds, message),
    /// `TF_PS_HANDLE_UNKNOWN_ERROR > 0`, and TF's answers (ps, worker).
    type Row = (Kinds, String, Option<(Kinds, String)>, bool, bool, bool);

    /// The classifier's table test. Expected values are TF 2.21's, worked out
    /// from `cluster_coordinator.py` (`_is_ps_failure`, `_is_worker_failure`);
    /// the Python suite checks the same rules against TF's own functions.
    #[rustfmt::skip]
    fn table() -> Vec<Row> {
        use ErrorKind::*;
        let ps_unavail = k(&[PsUnavailable, Unavailable]);
        let (input, aborted) = (k(&[ClosureInput]), k(&[ClosureAborted]));
        let ia = k(&[InvalidArgument]);
        let s = |m: &str| m.to_string();
        let not_registered = needle::FUNCTION_NOT_REGISTERED;
        vec![
            // outer kinds             outer message                                        unwrapped                                            env    ps     worker
            // Unrelated errors.
            (Kinds::EMPTY,             format!("{W} {PS}"),                                 None,                                                true,  false, false),
            (k(&[DeadlineExceeded]),   s(W),                                                None,                                                false, false, false),
            // Unavailable / Aborted: the PS string decides between PS and worker.
            (k(&[Unavailable]),        s(W),                                                None,                                                false, false, true),
            (k(&[Aborted]),            s(W),                                                None,                                                false, false, true),
            (k(&[Unavailable]),        s(PS),                                               None,                                                false, true,  false),
            (k(&[Unavailable]),        format!("{W} {PS}"),                                 None,                                                false, true,  false),
            (k(&[Aborted]),            s(PS),                                               None,                                                false, true,  false),
            (k(&[Unavailable]),        s("socket closed"),                                  None,                                                false, false, false),
            // PSUnavailableError: PS before unwrapping, whatever its message; also an
            // UnavailableError for the worker rows.
            (ps_unavail,               s("x"),                                              None,                                                false, true,  false),
            (ps_unavail,               s(W),                                                None,                                                false, true,  true),
            // InvalidArgument: "unknown device" in any case (KELVIN SIGN lowers to k, İ does not to i).
            (ia,                       format!("{W} Unknown Device"),                       None,                                                false, false, true),
            (ia,                       format!("{W} UNKNOWN DEVICE"),                       None,                                                false, false, true),
            (ia,                       format!("{W} UN\u{212A}NOWN DEVICE"),                None,                                                false, false, true),
            (ia,                       format!("{W} unknown dev\u{130}ce"),                 None,                                                false, false, false),
            (ia,                       format!("{PS} unknown device"),                      None,                                                false, true,  false),
            (ia,                       format!("{W} Primary device is not remote"),         None,                                                false, false, true),
            (ia,                       format!("{PS} Primary device is not remote"),        None,                                                false, false, false),
            (ia,                       format!("{PS} Unable to find the relevant tensor remote_handle"), None,                                   false, true,  false),
            (ia,                       format!("{W} Unable to find the relevant tensor remote_handle"),  None,                                   false, false, true),
            (ia,                       s(W),                                                None,                                                false, false, false),
            // NotFound: function registration lost.
            (k(&[NotFound]),           format!("{W} {not_registered}"),                     None,                                                false, false, true),
            (k(&[NotFound]),           s(not_registered),                                   None,                                                false, false, false),
            // Cancelled: only with /job:worker and without the PS string.
            (k(&[Cancelled]),          s(W),                                                None,                                                false, false, true),
            (k(&[Cancelled]),          s("cancelled"),                                      None,                                                false, false, false),
            (k(&[Cancelled]),          format!("{W} {PS}"),                                 None,                                                false, false, false),
            // TypeError.
            (k(&[TypeError]),          format!("{W} Binding inputs to tf.function"),        None,                                                false, false, true),
            (k(&[TypeError]),          s("Binding inputs to tf.function"),                  None,                                                false, false, false),
            // UnknownError / Graph execution error: gated by the environment, outer error only.
            (k(&[Unknown]),            s("Graph execution error"),                          None,                                                true,  false, true),
            (k(&[Unknown]),            s("Graph execution error"),                          None,                                                false, false, false),
            (k(&[Unknown]),            format!("{W} {PS}"),                                 None,                                                true,  false, false),
            // Wrappers: judged by the unwrapped error…
            (input,                    s("wrapper"),                                        Some((k(&[Unavailable]), s(W))),                     false, false, true),
            (aborted,                  s("wrapper"),                                        Some((k(&[Unavailable]), s(PS))),                    false, true,  false),
            // …never by their own message…
            (input,                    format!("{W} {PS}"),                                 Some((k(&[Unavailable]), s("x"))),                   false, false, false),
            // …a wrapped PSUnavailableError needs the PS string…
            (input,                    s("w"),                                              Some((ps_unavail, s("plain"))),                      false, false, false),
            (input,                    s("w"),                                              Some((ps_unavail, s(PS))),                           false, true,  false),
            // …and a wrapped Graph execution error is not a worker failure.
            (input,                    s("w"),                                              Some((k(&[Unknown]), s("Graph execution error"))),  true,  false, false),
            // A wrapper with nothing to unwrap is judged as itself.
            (input,                    s(W),                                                None,                                                false, false, false),
        ]
    }

    #[test]
    fn failure_classification_table() {
        for (i, (outer, msg, inner, env, ps, worker)) in table().into_iter().enumerate() {
            let inner = inner.as_ref().map(|(kinds, m)| Observed { kinds: *kinds, message: m });
            let got = classify_observed(
                Observed {
                    kinds: outer,
                    message: &msg,
                },
                inner,
                env,
            );
            let want = Classification {
                ps_failure: ps,
                worker_failure: worker,
            };
            assert_eq!(got, want, "row {i}: {outer:?} {msg:?} {inner:?} env={env}");
        }
    }

    /// A subject that records which facts were asked for.
    struct Recording {
        outer: Kinds,
        inner: Kinds,
        asked: Vec<&'static str>,
    }

    impl Subject for Recording {
        type Error = ();
        fn kinds(&mut self, stage: Stage) -> Result<Kinds, ()> {
            Ok(match stage {
                Stage::Outer => self.outer,
                Stage::Unwrapped => {
                    self.asked.push("unwrap");
                    self.inner
                }
            })
        }
        fn message(&mut self, _: Stage) -> Result<&str, ()> {
            self.asked.push("message");
            Ok("Graph execution error /job:worker")
        }
        fn gate(&mut self, _: Gate) -> Result<bool, ()> {
            self.asked.push("gate");
            Err(())
        }
    }

    #[test]
    fn failure_classification_is_lazy() {
        // An unrelated error: no message, no gate.
        let mut s = Recording {
            outer: Kinds::EMPTY,
            inner: Kinds::EMPTY,
            asked: vec![],
        };
        assert_eq!(classify(Verdict::Worker, &mut s), Ok(false));
        assert_eq!(classify(Verdict::Ps, &mut s), Ok(false));
        assert!(s.asked.is_empty());
        // PSUnavailableError: decided before unwrapping or reading the message.
        let ps = Kinds::PS_UNAVAILABLE | Kinds::UNAVAILABLE;
        let mut s = Recording {
            outer: ps | Kinds::CLOSURE_INPUT,
            inner: Kinds::EMPTY,
            asked: vec![],
        };
        assert_eq!(classify(Verdict::Ps, &mut s), Ok(true));
        assert!(s.asked.is_empty());
        // The gate is read only for an UnknownError that says Graph execution error,
        // and its failure (a malformed value) propagates.
        let mut s = Recording {
            outer: Kinds::UNKNOWN,
            inner: Kinds::EMPTY,
            asked: vec![],
        };
        assert_eq!(classify(Verdict::Worker, &mut s), Err(()));
        assert_eq!(s.asked, ["message", "gate"]);
    }

    #[test]
    fn failure_classification_both_matches_each_verdict() {
        // `classify_both` shares its needle searches between the two verdicts;
        // each verdict must still be what `classify` answers alone.
        for (i, (outer, msg, inner, env, _, _)) in table().into_iter().enumerate() {
            let inner = inner.as_ref().map(|(kinds, m)| Observed { kinds: *kinds, message: m });
            let subject = || ObservedSubject {
                outer: Observed {
                    kinds: outer,
                    message: &msg,
                },
                inner,
                handle_unknown_error: env,
            };
            let never = |r: Result<bool, std::convert::Infallible>| match r {
                Ok(b) => b,
                Err(never) => match never {},
            };
            let want = Classification {
                ps_failure: never(classify(Verdict::Ps, &mut subject())),
                worker_failure: never(classify(Verdict::Worker, &mut subject())),
            };
            let got = match classify_both(&mut subject()) {
                Ok(both) => both,
                Err(never) => match never {},
            };
            assert_eq!(got, want, "row {i}: {outer:?} {msg:?} {inner:?} env={env}");
        }
    }

    #[test]
    fn failure_classification_both_of_a_wrapped_worker_error() {
        // A worker error wrapped in ClosureInputError: both verdicts from the
        // unwrapped error, and the gate is never read.
        let mut s = Recording {
            outer: Kinds::CLOSURE_INPUT,
            inner: Kinds::UNAVAILABLE,
            asked: vec![],
        };
        let both = classify_both(&mut s);
        assert_eq!(
            both,
            Ok(Classification {
                ps_failure: false,
                worker_failure: true,
            })
        );
        assert!(!s.asked.contains(&"gate"), "{:?}", s.asked);
    }

    #[test]
    fn failure_rules_are_well_formed() {
        for rule in RULES {
            assert!(!rule.kinds.is_empty(), "{}", rule.name);
            if rule.verdict == Verdict::Worker && rule.stage == Stage::Unwrapped {
                // TF's two early `return False`s guard every unwrapped worker row.
                assert!(rule.all.contains(&Needle::JobWorker), "{}", rule.name);
                assert!(rule.none.contains(&Needle::RpcErrorFromPs), "{}", rule.name);
            }
            if rule.verdict == Verdict::Ps && rule.stage == Stage::Unwrapped {
                assert!(rule.all.contains(&Needle::RpcErrorFromPs), "{}", rule.name);
            }
        }
        let names: BTreeSet<_> = RULES.iter().map(|r| r.name).collect();
        assert_eq!(names.len(), RULES.len());
        for (i, n) in Needle::ALL.iter().enumerate() {
            assert_eq!(*n as usize, i);
            if n.ignores_case() {
                assert_eq!(n.text(), n.text().to_lowercase());
            }
        }
    }

    #[test]
    fn failure_case_insensitive_search() {
        let n = Needle::UnknownDevice;
        for (msg, want) in [
            ("unknown device", true),
            ("xx UnKnOwN DeViCe yy", true),
            ("unknown  device", false),
            ("unknown devic", false),
            ("", false),
            ("é unknown device", true),
            ("UN\u{212A}NOWN DEVICE", true),
            ("UNKNOWN DEV\u{130}CE", false),
            // A decoy (first and last byte right) before the match, in one block.
            ("u############e unknown device and some more", true),
            ("U############E UNKNOWN DEVICE and some more", true),
        ] {
            assert_eq!(n.is_in(msg), want, "{msg:?}");
        }
        assert!(!Needle::JobWorker.is_in("/JOB:WORKER"));
        assert!(Needle::JobWorker.is_in("/#########r/job:worker, padded past one block"));
        assert!(!Needle::JobWorker.is_in("/#########r/job:worke, padded past one block"));
    }

    proptest::proptest! {
        /// The search agrees with `str::contains` (and with lowering first),
        /// on messages built from needles, their case variants and near misses.
        #[test]
        fn failure_search_agrees_with_std(
            pieces in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(Needle::ALL.iter().map(|n| n.text()).collect::<Vec<_>>())
                        .prop_map(str::to_string),
                    proptest::sample::select(Needle::ALL.iter().map(|n| n.text()).collect::<Vec<_>>())
                        .prop_map(str::to_uppercase),
                    proptest::sample::select(Needle::ALL.iter().map(|n| n.text()).collect::<Vec<_>>())
                        .prop_flat_map(|t| (0..t.len()).prop_map(move |cut| t[..cut].to_string())),
                    // Decoys: first and last byte right, middle wrong.
                    proptest::sample::select(Needle::ALL.iter().map(|n| n.text()).collect::<Vec<_>>())
                        .prop_map(|t| format!("{}{}{}", &t[..1], "#".repeat(t.len() - 2), &t[t.len() - 1..])),
                    "[a-zA-Z0-9 /:\\-]{0,40}",
                    proptest::sample::select(vec!["\u{212A}", "\u{130}", "é", "/job:ps/replica:0/task:"])
                        .prop_map(str::to_string),
                ],
                0..12,
            )
        ) {
            let message = pieces.concat();
            for n in Needle::ALL {
                let want = if n.ignores_case() {
                    message.to_lowercase().contains(n.text())
                } else {
                    message.contains(n.text())
                };
                proptest::prop_assert_eq!(n.is_in(&message), want, "{:?} in {:?}", n, message);
            }
        }
    }

    #[test]
    fn failure_ps_task_extraction_table() {
        let set = |v: &[u64]| v.iter().copied().collect::<BTreeSet<u64>>();
        for (msg, want) in [
            ("", set(&[])),
            ("/job:ps/replica:0/task:1", set(&[1])),
            ("/job:ps/replica:0/task:", set(&[])),
            ("/job:ps/replica:0/task:x1", set(&[])),
            ("/job:ps/replica:1/task:2", set(&[])),
            ("/job:ps/replica:0/task:12abc", set(&[12])),
            ("/job:ps/replica:0/task:007", set(&[7])),
            (
                "a /job:ps/replica:0/task:3 b /job:ps/replica:0/task:0 c /job:ps/replica:0/task:3",
                set(&[0, 3]),
            ),
            ("/job:ps/replica:0/task:/job:ps/replica:0/task:4", set(&[4])),
            ("/job:ps/replica:0/task:\u{663}", set(&[])),
            ("/job:ps/replica:0/task:99999999999999999999999", set(&[u64::MAX])),
        ] {
            assert_eq!(failed_ps_instances(msg), want, "{msg:?}");
        }
        let ids: Vec<_> = ps_task_ids("/job:ps/replica:0/task:2 /job:ps/replica:0/task:01").collect();
        assert_eq!(ids, ["2", "01"]);
    }

    #[test]
    fn failure_transient_ps_table() {
        // (num_ps, threshold, [(tasks, want)]) — TF's `_record_and_ignore_transient_ps_failure`.
        type Step = (&'static [u64], Result<bool, TransientError>);
        let unknown = |task, num_ps| Err(TransientError::UnknownPsTask { task, num_ps });
        let cases: Vec<(usize, i64, Vec<Step>)> = vec![
            (2, 3, vec![(&[1], Ok(true)), (&[1], Ok(true)), (&[1], Ok(false)), (&[1], Ok(false))]),
            (2, 3, vec![(&[0], Ok(true)), (&[1], Ok(true)), (&[0], Ok(true)), (&[0], Ok(false))]),
            // No task named: always ignored.
            (2, 1, vec![(&[], Ok(true)), (&[], Ok(true))]),
            // Threshold 1: the first strike is believed.
            (2, 1, vec![(&[0], Ok(false))]),
            // Off: nothing ignored.
            (2, 0, vec![(&[0], Ok(false)), (&[], Ok(false))]),
            (2, -5, vec![(&[0], Ok(false))]),
            // The first task at the threshold ends the visit; later tasks are not counted.
            (
                3,
                2,
                vec![(&[0], Ok(true)), (&[0, 1], Ok(false)), (&[1], Ok(true)), (&[1], Ok(false))],
            ),
            // Repeats count once.
            (2, 2, vec![(&[1, 1], Ok(true)), (&[1], Ok(false))]),
            // Unknown tasks: TF's IndexError, after counting the tasks before it.
            (2, 3, vec![(&[0, 5], unknown(5, 2)), (&[0], Ok(true)), (&[0], Ok(false))]),
            (0, 3, vec![(&[0], unknown(0, 0))]),
            (1, 3, vec![(&[u64::MAX], unknown(u64::MAX, 1))]),
        ];
        for (i, (num_ps, threshold, steps)) in cases.into_iter().enumerate() {
            let mut t = TransientFailures::new(num_ps, threshold, 0);
            for (j, (tasks, want)) in steps.into_iter().enumerate() {
                assert_eq!(t.record_ps_failure(tasks), want, "case {i} step {j}");
            }
        }
    }

    #[test]
    fn failure_transient_timeouts_table() {
        for (threshold, want) in [
            (0, vec![false, false]),
            (-1, vec![false]),
            (1, vec![false, false]),
            (3, vec![true, true, false, false]),
            (i64::MAX, vec![true, true, true]),
        ] {
            let mut t = TransientFailures::new(0, 3, threshold);
            let got: Vec<bool> = want.iter().map(|_| t.record_timeout()).collect();
            assert_eq!(got, want, "threshold {threshold}");
            assert_eq!(t.timeouts(), if threshold > 0 { want.len() as u64 } else { 0 });
        }
        assert_eq!(default_transient_timeouts(9), 0);
        assert_eq!(default_transient_timeouts(25), 2);
    }

    #[test]
    fn failure_kinds_set() {
        assert!(Kinds::of(ErrorKind::Other).is_empty());
        let all: Kinds = ErrorKind::ALL.into_iter().collect();
        for k in ErrorKind::ALL {
            assert!(all.contains(k));
            assert!(!Kinds::EMPTY.contains(k));
        }
        assert!(!all.contains(ErrorKind::Other));
        assert!(Kinds::WRAPPERS.contains(ErrorKind::ClosureAborted));
    }
}
