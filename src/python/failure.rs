//! Binding of the worker/PS failure classifier ([`crate::failure`]).
//!
//! The functions take the exception object itself and answer the core's
//! questions about it ([`core::Subject`]) lazily. TF's `_is_worker_failure`
//! costs 1.3–1.8 µs a call, most of it reading and parsing
//! `TF_PS_HANDLE_UNKNOWN_ERROR` and calling `str(error)` up to six times; the
//! budget here is about a tenth of that, so each question has a fast answer
//! that is exactly Python's whenever it is taken, and Python's own way
//! otherwise:
//!
//! * **Kinds** — `isinstance` against the eleven cached classes is, for an
//!   exception and classes whose metaclass is `type`, "the class is in
//!   `type(e).__mro__`": one MRO walk instead of eleven calls (each of which
//!   would also look up `__class__`). The answer, with the facts below, is
//!   cached per type in [`TYPE_CACHE`], keyed by the type's
//!   `tp_version_tag`, which CPython renews whenever the type or a base
//!   changes. Objects that are not exceptions (mocks that set `__class__`)
//!   get `PyObject_IsInstance`, every time.
//! * **Message** — `str(e)` of TF's `OpError` without an op is
//!   `e._message` (`OpError.__str__` returns `self.message`); when the type
//!   keeps TF's `__str__` and `message`, plain attribute access and no
//!   `_op`/`_message` on the class, the message is read from the instance
//!   dict, without running `OpError.__str__`. The premise is checked on a
//!   probe at start-up, so a TF with a different `__str__` takes the slow
//!   path. Anything else gets `str(e)`, once per error. Lone surrogates are
//!   replaced by U+FFFD (the needles are ASCII: no search changes).
//! * **Unwrapping** — `original_exception` from the instance dict when the
//!   wrapper's type reads attributes plainly, else `getattr`.
//! * **Gate** — `TF_PS_HANDLE_UNKNOWN_ERROR` through `os.environ` and
//!   `int()`, as TF, on each call that reaches the row (an `UnknownError`
//!   saying `Graph execution error`); never cached.
//!
//! `TransientFailures` keeps the core's counters behind a mutex that is
//! taken only after the Python work (classification, `str(e)`, the task set)
//! is done.
//!
//! CPython only (the fast paths read `PyTypeObject` and `BaseException`
//! fields).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyInt, PySet, PyString, PyTuple, PyType};

use super::{errors, layout};
use crate::failure::{self as core, ErrorKind, Gate, Kinds, Stage, Verdict};

/// The classes of [`ErrorKind::ALL`], resolved once by
/// `tf_failure_handling._failure._error_classes()` (TF's, else stand-ins).
struct Classes {
    /// `(class, kind)` for every class that exists.
    table: Vec<(Py<PyType>, ErrorKind)>,
    /// Every class's metaclass is exactly `type`, so `isinstance` of an
    /// exception is "the class is in `type(e).__mro__`" (no `__instancecheck__`).
    plain: bool,
    /// TF's `OpError.__str__` and `OpError.message`, when `str()` of an
    /// `OpError` built without an op was checked to be its `_message`.
    op_error_str: Option<(Py<PyAny>, Py<PyAny>)>,
}

static CLASSES: PyOnceLock<Classes> = PyOnceLock::new();

fn classes(py: Python<'_>) -> PyResult<&Classes> {
    CLASSES.get_or_try_init(py, || {
        let found = py
            .import(intern!(py, "tf_failure_handling._failure"))?
            .call_method0(intern!(py, "_error_classes"))?;
        let found = found.cast_into::<PyTuple>()?;
        if found.len() != ErrorKind::ALL.len() {
            return Err(errors::bad_type(format!(
                "_error_classes() returned {} classes, the classifier knows {}",
                found.len(),
                ErrorKind::ALL.len()
            )));
        }
        let mut table = Vec::with_capacity(ErrorKind::ALL.len());
        let mut plain = true;
        for (cls, kind) in found.iter().zip(ErrorKind::ALL) {
            if cls.is_none() {
                continue;
            }
            let cls = cls.cast_into::<PyType>()?;
            plain &= cls.get_type().is(py.get_type::<PyType>());
            table.push((cls.unbind(), kind));
        }
        let op_error_str = op_error_str(py)?;
        Ok(Classes {
            table,
            plain,
            op_error_str,
        })
    })
}

/// `(OpError.__str__, OpError.message)` if TF's `OpError.__str__` is, for an
/// error without an op, `self.message`, i.e. `self._message`: checked on a
/// probe, so that a TF version with another `__str__` just takes the slow path.
fn op_error_str(py: Python<'_>) -> PyResult<Option<(Py<PyAny>, Py<PyAny>)>> {
    let errors = py.import(intern!(py, "tf_failure_handling._errors"))?.call_method0("module")?;
    let Ok(op_error) = errors.getattr("OpError") else {
        return Ok(None);
    };
    if !op_error.getattr("__module__")?.str()?.to_string_lossy().starts_with("tensorflow.") {
        return Ok(None);
    }
    let dict = op_error.getattr("__dict__")?;
    let (Ok(str_fn), Ok(message)) = (dict.get_item("__str__"), dict.get_item("message")) else {
        return Ok(None);
    };
    let probe = errors.getattr("UnknownError")?.call1((py.None(), py.None(), "probe one"))?;
    let first = probe.str()?.to_string_lossy() == "probe one";
    probe.setattr("_message", "probe two")?;
    let second = probe.str()?.to_string_lossy() == "probe two";
    Ok((first && second).then(|| (str_fn.unbind(), message.unbind())))
}

/// What the classifier needs to know about an error's type.
#[derive(Clone, Copy, Default)]
struct TypeFacts {
    /// Every kind of the table an instance is an instance of.
    kinds: Kinds,
    /// `str()` of an instance whose `__dict__` has `_op = None` is the `str`
    /// in its `__dict__["_message"]`: a [plain-dict](plain_dict) type with
    /// TF's `OpError.__str__` and `message`, and no `_op`/`_message` on the
    /// class.
    dict_message: bool,
    /// `obj.original_exception` is `obj.__dict__["original_exception"]` when
    /// there: a [plain-dict](plain_dict) type without that class attribute.
    dict_original: bool,
}

impl TypeFacts {
    const DICT_MESSAGE: u64 = 1 << 16;
    const DICT_ORIGINAL: u64 = 1 << 17;

    /// `tag` in the high half, the facts in the low half.
    fn pack(self, tag: u32) -> u64 {
        (u64::from(tag) << 32)
            | u64::from(self.kinds.bits())
            | if self.dict_message { Self::DICT_MESSAGE } else { 0 }
            | if self.dict_original { Self::DICT_ORIGINAL } else { 0 }
    }

    fn unpack(entry: u64, tag: u32) -> Option<TypeFacts> {
        (tag != 0 && entry >> 32 == u64::from(tag)).then(|| TypeFacts {
            // Truncation intended: the low 16 bits are the kinds.
            #[allow(clippy::cast_possible_truncation)]
            kinds: Kinds::from_bits(entry as u16),
            dict_message: entry & Self::DICT_MESSAGE != 0,
            dict_original: entry & Self::DICT_ORIGINAL != 0,
        })
    }
}

/// Whether attribute reads of `ty`'s instances are `object.__getattribute__`
/// over the `__dict__` in `BaseException`'s slot: metaclass `type`, no
/// `__getattribute__`/`__getattr__`, `__dict__` where `BaseException` keeps it.
/// For such a type, an attribute that is not on the class is the instance
/// dict's entry when it has one. Never true where [`layout`] cannot read the
/// type's slots.
fn plain_dict(ty: &Bound<'_, PyType>) -> bool {
    let Some((getattro, dictoffset)) = layout::getattro_and_dictoffset(ty) else {
        return false;
    };
    ty.get_type().is(ty.py().get_type::<PyType>())
        && getattro == ffi::PyObject_GenericGetAttr as *const ()
        && dictoffset == layout::EXCEPTION_DICT_OFFSET
}

/// `obj.__dict__[key]`, for an exception of a [`plain_dict`] type.
fn dict_item<'py>(obj: &Bound<'py, PyAny>, key: &Bound<'py, PyString>) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = obj.py();
    // SAFETY: `obj` is an exception of a `plain_dict` type, so its
    // `BaseException` dict slot is NULL or a dict; the item is borrowed and
    // owned at once, before anything else can run.
    unsafe {
        let dict = layout::exception_dict(obj);
        if dict.is_null() || ffi::PyDict_Check(dict) == 0 {
            return Ok(None);
        }
        let item = ffi::PyDict_GetItemWithError(dict, key.as_ptr());
        if item.is_null() {
            return PyErr::take(py).map_or(Ok(None), Err);
        }
        Ok(Some(Bound::from_borrowed_ptr(py, item)))
    }
}

/// Slots of [`TYPE_CACHE`].
const TYPE_CACHE_SLOTS: usize = 256;

/// Facts of recently seen exception types, keyed by `tp_version_tag` alone
/// (entry `tag << 32 | facts`, in slot `tag % TYPE_CACHE_SLOTS` or the next
/// one, so that a wrapper and its inner error rarely evict each other).
///
/// `CPython` gives a type a new tag whenever it or one of its bases is
/// modified (`__bases__`, `__str__`, `message`, …) and never gives the same
/// tag to two types of an interpreter, so a hit describes the type as it is
/// now; tag 0 (none assigned) is never cached. One atomic word per entry: no
/// lock, no torn entry, nothing per thread.
static TYPE_CACHE: [AtomicU64; TYPE_CACHE_SLOTS] = [const { AtomicU64::new(0) }; TYPE_CACHE_SLOTS];

/// The two slots where the facts of the type with `tag` may be.
fn cache_slots(tag: u32) -> [&'static AtomicU64; 2] {
    let home = tag as usize % TYPE_CACHE_SLOTS;
    [&TYPE_CACHE[home], &TYPE_CACHE[(home + 1) % TYPE_CACHE_SLOTS]]
}

fn version_tag(ty: &Bound<'_, PyType>) -> u32 {
    layout::version_tag(ty)
}

/// The facts of `obj`'s type: cached for exceptions when every class is
/// plain; worked out with `isinstance` every time otherwise.
fn type_facts(obj: &Bound<'_, PyAny>, classes: &Classes) -> PyResult<TypeFacts> {
    let py = obj.py();
    // SAFETY: `obj` is a valid object; the check only reads its type's flags.
    let is_exception = unsafe { ffi::PyExceptionInstance_Check(obj.as_ptr()) } != 0;
    if !(classes.plain && is_exception) {
        // Not an exception (a mock that sets `__class__`), or a class with a
        // metaclass (`__instancecheck__`): Python's own isinstance.
        let mut kinds = Kinds::EMPTY;
        for (cls, kind) in &classes.table {
            if obj.is_instance(cls.bind(py))? {
                kinds = kinds | Kinds::of(*kind);
            }
        }
        return Ok(TypeFacts {
            kinds,
            dict_message: false,
            dict_original: false,
        });
    }
    let ty = obj.get_type();
    let tag = version_tag(&ty);
    for slot in cache_slots(tag) {
        if let Some(facts) = TypeFacts::unpack(slot.load(Ordering::Relaxed), tag) {
            return Ok(facts);
        }
    }
    // `isinstance(obj, cls)` for a plain class is "cls is in type(obj).__mro__"
    // (its `__class__` fallback serves objects that lie about their type,
    // which exceptions do not).
    let mut kinds = Kinds::EMPTY;
    for base in ty.mro().iter_borrowed() {
        for (cls, kind) in &classes.table {
            if base.as_ptr() == cls.as_ptr() {
                kinds = kinds | Kinds::of(*kind);
            }
        }
    }
    let plain = plain_dict(&ty);
    let dict_message = match &classes.op_error_str {
        Some((str_fn, message)) => {
            plain
                && ty.getattr(intern!(py, "__str__"))?.is(str_fn)
                && ty.getattr(intern!(py, "message"))?.is(message)
                && !ty.hasattr(intern!(py, "_op"))?
                && !ty.hasattr(intern!(py, "_message"))?
        }
        None => false,
    };
    let dict_original = plain && kinds.intersects(Kinds::WRAPPERS) && !ty.hasattr(intern!(py, "original_exception"))?;
    let facts = TypeFacts {
        kinds,
        dict_message,
        dict_original,
    };
    // The lookups above assign a tag if there was none.
    let tag = version_tag(&ty);
    if tag != 0 {
        let [home, next] = cache_slots(tag);
        // Keep the home slot's entry if it is still someone's; the next one takes the new one.
        let home_entry = home.load(Ordering::Relaxed);
        let slot = if home_entry == 0 { home } else { next };
        slot.store(facts.pack(tag), Ordering::Relaxed);
    }
    Ok(facts)
}

/// The `str` that `str(obj)` returns, read from `obj.__dict__` (see
/// [`TypeFacts::dict_message`]); `None` when the instance does not qualify.
fn dict_message<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Option<Bound<'py, PyString>>> {
    let py = obj.py();
    match dict_item(obj, intern!(py, "_op"))? {
        Some(op) if op.is_none() => {}
        _ => return Ok(None),
    }
    Ok(dict_item(obj, intern!(py, "_message"))?
        .and_then(|m| m.cast_into::<PyString>().ok())
        .filter(|m| m.to_str().is_ok()))
}

/// `str(obj)` as UTF-8: borrowed from the `str` object, or lossily copied
/// when it holds lone surrogates (the needles are ASCII, so `U+FFFD` in place
/// of a surrogate changes no search).
enum Message<'py> {
    Utf8(Bound<'py, PyString>),
    Lossy(String),
}

impl<'py> Message<'py> {
    /// `str(obj)`; for TF's `OpError` without an op, its `_message` without
    /// running `OpError.__str__` (saves ≈ 100 ns).
    fn of(obj: &Bound<'py, PyAny>, facts: TypeFacts) -> PyResult<Self> {
        if facts.dict_message {
            if let Some(s) = dict_message(obj)? {
                return Ok(Message::Utf8(s));
            }
        }
        let s = obj.str()?;
        Ok(if s.to_str().is_ok() {
            Message::Utf8(s)
        } else {
            Message::Lossy(s.to_string_lossy().into_owned())
        })
    }

    fn as_str(&self) -> &str {
        match self {
            // Checked in `of`; the UTF-8 buffer is cached in the `str` object.
            Message::Utf8(s) => s.to_str().unwrap_or_default(),
            Message::Lossy(s) => s,
        }
    }
}

/// One Python error, answering the classifier's questions lazily.
struct PyError<'a, 'py> {
    classes: &'a Classes,
    outer: &'a Bound<'py, PyAny>,
    outer_facts: TypeFacts,
    /// `original_exception` and its type's facts, once read (wrappers only).
    inner: Option<(Bound<'py, PyAny>, TypeFacts)>,
    /// `str()` of the outer (0) and inner (1) error, once built.
    messages: [Option<Message<'py>>; 2],
}

impl<'a, 'py> PyError<'a, 'py> {
    fn new(classes: &'a Classes, outer: &'a Bound<'py, PyAny>) -> PyResult<Self> {
        Ok(PyError {
            classes,
            outer,
            outer_facts: type_facts(outer, classes)?,
            inner: None,
            messages: [None, None],
        })
    }

    fn unwraps(&self) -> bool {
        self.outer_facts.kinds.intersects(Kinds::WRAPPERS)
    }

    fn inner(&mut self) -> PyResult<&(Bound<'py, PyAny>, TypeFacts)> {
        if self.inner.is_none() {
            let key = intern!(self.outer.py(), "original_exception");
            let found = if self.outer_facts.dict_original {
                dict_item(self.outer, key)?
            } else {
                None
            };
            let inner = match found {
                Some(inner) => inner,
                None => self.outer.getattr(key)?,
            };
            let facts = type_facts(&inner, self.classes)?;
            self.inner = Some((inner, facts));
        }
        Ok(self.inner.as_ref().expect("set above"))
    }
}

impl core::Subject for PyError<'_, '_> {
    type Error = PyErr;

    fn kinds(&mut self, stage: Stage) -> PyResult<Kinds> {
        if stage == Stage::Unwrapped && self.unwraps() {
            Ok(self.inner()?.1.kinds)
        } else {
            Ok(self.outer_facts.kinds)
        }
    }

    fn message(&mut self, stage: Stage) -> PyResult<&str> {
        let slot = usize::from(stage == Stage::Unwrapped && self.unwraps());
        if self.messages[slot].is_none() {
            let message = if slot == 1 {
                let (inner, facts) = self.inner()?;
                Message::of(inner, *facts)?
            } else {
                Message::of(self.outer, self.outer_facts)?
            };
            self.messages[slot] = Some(message);
        }
        Ok(self.messages[slot].as_ref().map_or("", Message::as_str))
    }

    fn gate(&mut self, gate: Gate) -> PyResult<bool> {
        match gate {
            Gate::Always => Ok(true),
            Gate::HandleUnknownError => handle_unknown_error(self.outer.py()),
        }
    }
}

/// TF's `_handle_graph_execution_error_as_worker_failure()`:
/// `int(os.environ.get("TF_PS_HANDLE_UNKNOWN_ERROR", "0")) > 0`, read now.
fn handle_unknown_error(py: Python<'_>) -> PyResult<bool> {
    let value = py
        .import(intern!(py, "os"))?
        .getattr(intern!(py, "environ"))?
        .call_method1(intern!(py, "get"), (core::HANDLE_UNKNOWN_ERROR_ENV, "0"))?;
    py.get_type::<PyInt>().call1((value,))?.gt(0)
}

fn classify(verdict: Verdict, e: &Bound<'_, PyAny>) -> PyResult<bool> {
    let classes = classes(e.py())?;
    let mut subject = PyError::new(classes, e)?;
    let failed = core::classify(verdict, &mut subject)?;
    if failed && verdict == Verdict::Worker && subject.outer_facts.kinds.contains(ErrorKind::Unknown) {
        // TF logs the one verdict that depends on the environment.
        log::info!(
            target: "tf_failure_handling",
            "Handling {}: {} as worker failure.",
            e.get_type(),
            e.str()?
        );
    }
    Ok(failed)
}

/// `(is_ps_failure(e), is_worker_failure(e))` in one call, as the
/// coordinator's failure handling needs them for a failed closure (TF calls
/// `_is_ps_failure` and `_is_worker_failure`, each building `str(e)` anew).
/// The type's facts, the unwrapped error, each message and each needle
/// search are shared between the two verdicts.
///
/// # Errors
///
/// What `str(e)` or reading `original_exception` raises, and the
/// `ValueError` of a malformed `TF_PS_HANDLE_UNKNOWN_ERROR` (read only for
/// an `UnknownError` that says `Graph execution error`).
#[pyfunction]
fn classify_failure<'py>(e: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyTuple>> {
    let py = e.py();
    let classes = classes(py)?;
    let mut subject = PyError::new(classes, e)?;
    let both = core::classify_both(&mut subject)?;
    if both.worker_failure && subject.outer_facts.kinds.contains(ErrorKind::Unknown) {
        log::info!(
            target: "tf_failure_handling",
            "Handling {}: {} as worker failure.",
            e.get_type(),
            e.str()?
        );
    }
    let answers = ANSWERS.get_or_try_init(py, || -> PyResult<[Py<PyTuple>; 4]> {
        let answer = |ps: bool, worker: bool| PyTuple::new(py, [ps, worker]).map(Bound::unbind);
        Ok([
            answer(false, false)?,
            answer(false, true)?,
            answer(true, false)?,
            answer(true, true)?,
        ])
    })?;
    let index = usize::from(both.ps_failure) * 2 + usize::from(both.worker_failure);
    Ok(answers[index].bind(py).clone())
}

/// The four answers of [`classify_failure`], built once (tuples are immutable).
static ANSWERS: PyOnceLock<[Py<PyTuple>; 4]> = PyOnceLock::new();

/// Whether `e` means a worker failed: TF 2.21's `_is_worker_failure(error)`
/// (`cluster_coordinator.py`), same verdict for every error.
///
/// Reads `TF_PS_HANDLE_UNKNOWN_ERROR` per call, but only for an `UnknownError`
/// that says `Graph execution error` (TF reads it for every error).
#[pyfunction]
fn is_worker_failure(e: &Bound<'_, PyAny>) -> PyResult<bool> {
    classify(Verdict::Worker, e)
}

/// Whether `e` means a parameter server failed: TF 2.21's `_is_ps_failure(error)`.
#[pyfunction]
fn is_ps_failure(e: &Bound<'_, PyAny>) -> PyResult<bool> {
    classify(Verdict::Ps, e)
}

/// The PS tasks named in `message`, in TF's order: the Python `set` that
/// `_extract_failed_ps_instances` builds from `/job:ps/replica:0/task:[0-9]+`.
fn ps_task_set<'py>(message: &Bound<'py, PyString>) -> PyResult<Bound<'py, PySet>> {
    let py = message.py();
    let text = message.to_string_lossy();
    let set = PySet::empty(py)?;
    for digits in core::ps_task_ids(&text) {
        match digits.parse::<u64>() {
            Ok(n) => set.add(n)?,
            // Beyond u64: Python's int() of the digits, as TF's `int(...)`.
            Err(_) => set.add(py.get_type::<PyInt>().call1((digits,))?)?,
        }
    }
    Ok(set)
}

/// TF 2.21's `_extract_failed_ps_instances(err_msg)`: the set of PS task
/// numbers named in `message` (`/job:ps/replica:0/task:N`).
#[pyfunction]
fn failed_ps_instances<'py>(message: &Bound<'py, PyString>) -> PyResult<Bound<'py, PySet>> {
    ps_task_set(message)
}

/// An environment variable as TF's `Cluster.__init__` reads it:
/// `int(os.environ.get(name, default))`, saturated to `i64`.
fn env_threshold(py: Python<'_>, name: &str, default: i64) -> PyResult<i64> {
    let value = py
        .import(intern!(py, "os"))?
        .getattr(intern!(py, "environ"))?
        .call_method1(intern!(py, "get"), (name, default))?;
    let value = py.get_type::<PyInt>().call1((value,))?;
    match value.extract::<i64>() {
        Ok(v) => Ok(v),
        Err(_) if value.gt(0)? => Ok(i64::MAX),
        Err(_) => Ok(i64::MIN),
    }
}

/// TF's transient-failure tolerances of `Cluster`
/// (`_record_and_ignore_transient_ps_failure`, `_record_and_ignore_transient_timeouts`).
///
/// Thresholds come from `TF_COORDINATOR_IGNORE_TRANSIENT_PS_FAILURES`
/// (default 3) and `TF_COORDINATOR_IGNORE_TRANSIENT_TIMEOUTS` (default
/// `num_workers // 10`), read once here, as TF reads them in
/// `Cluster.__init__`; `ps_threshold` / `timeouts_threshold` override them.
/// Thread-safe: the counters sit behind a lock that is never held while
/// Python runs.
#[pyclass(frozen, module = "tf_failure_handling._native")]
struct TransientFailures {
    state: Mutex<core::TransientFailures>,
}

#[pymethods]
impl TransientFailures {
    #[new]
    #[pyo3(signature = (num_ps, num_workers, *, ps_threshold=None, timeouts_threshold=None))]
    fn new(
        py: Python<'_>,
        num_ps: usize,
        num_workers: usize,
        ps_threshold: Option<i64>,
        timeouts_threshold: Option<i64>,
    ) -> PyResult<Self> {
        let core = core::TransientFailures::configured(num_ps, num_workers, ps_threshold, timeouts_threshold, |name, default| {
            env_threshold(py, name, default)
        })?;
        Ok(TransientFailures { state: Mutex::new(core) })
    }

    /// `Cluster._record_and_ignore_transient_ps_failure(e)`: whether to ignore
    /// `e` as a transient PS failure. Counts a strike for each PS task it names.
    ///
    /// `ps_failure`, when given, is `is_ps_failure(e)` already known (from
    /// [`classify_failure`]); the error is then not classified again.
    ///
    /// Raises `IndexError` (as TF) when it names a task the cluster lacks.
    #[pyo3(signature = (e, *, ps_failure=None))]
    fn record_and_ignore_transient_ps_failure(&self, e: &Bound<'_, PyAny>, ps_failure: Option<bool>) -> PyResult<bool> {
        // The lock is released before `classify` calls into Python.
        let tolerates = self.state.lock().tolerates_ps_failures();
        if !tolerates {
            return Ok(false);
        }
        let is_ps = match ps_failure {
            Some(known) => known,
            None => classify(Verdict::Ps, e)?,
        };
        if !is_ps {
            return Ok(false);
        }
        // TF: `_extract_failed_ps_instances(str(e))`, visited in set order.
        let tasks: Vec<u64> = ps_task_set(&e.str()?)?
            .iter()
            .map(|t| t.extract::<u64>().unwrap_or(u64::MAX))
            .collect();
        self.state.lock().record_ps_failure(&tasks).map_err(PyErr::from)
    }

    /// `Cluster._record_and_ignore_transient_timeouts(e)`: whether to ignore
    /// `e` as a transient timeout (a `DeadlineExceededError`).
    fn record_and_ignore_transient_timeouts(&self, e: &Bound<'_, PyAny>) -> PyResult<bool> {
        if !self.state.lock().tolerates_timeouts() {
            return Ok(false);
        }
        let kinds = type_facts(e, classes(e.py())?)?.kinds;
        if !kinds.contains(ErrorKind::DeadlineExceeded) {
            return Ok(false);
        }
        Ok(self.state.lock().record_timeout())
    }

    /// For logs and tests: TF's `_transient_ps_failures_threshold`
    /// (`ps_threshold`), `_transient_timeouts_threshold` (`timeouts_threshold`),
    /// `_potential_ps_failures_count` (`ps_failure_counts`: strikes per PS task) and
    /// `_transient_timeouts_count` (`timeouts_count`).
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let (ps_threshold, timeouts_threshold, counts, timeouts) = {
            let s = self.state.lock();
            (s.ps_threshold(), s.timeouts_threshold(), s.ps_counts().to_vec(), s.timeouts())
        };
        let state = PyDict::new(py);
        state.set_item("ps_threshold", ps_threshold)?;
        state.set_item("timeouts_threshold", timeouts_threshold)?;
        state.set_item("ps_failure_counts", counts)?;
        state.set_item("timeouts_count", timeouts)?;
        Ok(state)
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(is_worker_failure, m)?)?;
    m.add_function(wrap_pyfunction!(is_ps_failure, m)?)?;
    m.add_function(wrap_pyfunction!(classify_failure, m)?)?;
    m.add_function(wrap_pyfunction!(failed_ps_instances, m)?)?;
    m.add_class::<TransientFailures>()?;
    Ok(())
}
