//! Three fields the stable ABI hides, read where their layout is known
//! ([`crate::type_layout`], which holds CPython's layout and the check): here
//! the interpreter's reports for that check, gathered once, and the reads for
//! the failure classifier.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use std::ffi::c_void;

use crate::type_layout::{self as core, Reported};

pub(crate) use crate::type_layout::EXCEPTION_DICT_OFFSET;

/// Whether the layout is the running interpreter's ([`check`], once).
///
/// A `PyOnceLock`, not a `std::sync::OnceLock`: [`check`] runs Python
/// (`py.import`, `py.run`), which may switch threads. With a std `OnceLock`,
/// a second thread that reached here attached would block in
/// `OnceLock::initialize` holding the GIL, while the initializing thread
/// waits for the GIL to go on: the coordinator hang of issue 26 (eight worker
/// threads classifying their first failures at once). `PyOnceLock` detaches
/// while it waits. The module's init also calls [`known`] once
/// ([`register`]), so in practice the cell is set before any thread can race.
fn known(py: Python<'_>) -> bool {
    static KNOWN: PyOnceLock<bool> = PyOnceLock::new();
    *KNOWN.get_or_init(py, || match check(py) {
        Ok(true) => true,
        Ok(false) => {
            log::info!(
                "type layout of this Python is not the one of CPython 3.10-3.13: the failure classifier runs without its per-type cache"
            );
            false
        }
        Err(e) => {
            log::info!("could not check this Python's type layout ({e}): the failure classifier runs without its per-type cache");
            false
        }
    })
}

/// Asks the core's check on a built-in exception type, a user-defined one
/// and a user-defined one with `__slots__` (another `__dictoffset__`).
fn check(py: Python<'_>) -> PyResult<bool> {
    let sys = py.import("sys")?;
    let gil = !sys.hasattr("_is_gil_enabled")? || sys.call_method0("_is_gil_enabled")?.extract::<bool>()?;
    let (major, minor) = (py.version_info().major, py.version_info().minor);
    if !core::may_apply((major, minor), gil) {
        return Ok(false);
    }
    let namespace = pyo3::types::PyDict::new(py);
    py.run(
        c"class Plain(Exception):\n    pass\nclass Slotted(ValueError):\n    __slots__ = ('a',)\n",
        None,
        Some(&namespace),
    )?;
    let types = [
        py.import("builtins")?.getattr("ValueError")?,
        namespace.get_item("Plain")?.expect("defined above"),
        namespace.get_item("Slotted")?.expect("defined above"),
    ];
    for ty in types {
        let ty = ty.cast_into::<PyType>()?;
        let ptr = ty.as_type_ptr();
        let reported = Reported {
            name: ty.getattr("__name__")?.extract()?,
            metatype: ty.get_type().as_ptr().cast_const().cast(),
            basicsize: ty.getattr("__basicsize__")?.extract()?,
            dictoffset: ty.getattr("__dictoffset__")?.extract()?,
            // SAFETY: a live type object.
            flags: unsafe { ffi::PyType_GetFlags(ptr) },
            // SAFETY: a live type object; `Py_tp_getattro` is a valid slot
            // (3.10+ answers for static types too).
            getattro: (py.version_info() >= (3, 10)).then(|| unsafe { ffi::PyType_GetSlot(ptr, ffi::Py_tp_getattro) }.cast_const()),
        };
        // SAFETY: `ty` is a live type object and `may_apply` held.
        if !unsafe { core::matches(type_ptr(&ty), &reported) } {
            return Ok(false);
        }
    }
    Ok(true)
}

fn type_ptr(ty: &Bound<'_, PyType>) -> *const c_void {
    ty.as_type_ptr().cast_const().cast()
}

/// `tp_getattro` and `tp_dictoffset` of `ty`, where the layout is known.
pub(crate) fn getattro_and_dictoffset(ty: &Bound<'_, PyType>) -> Option<(*const (), isize)> {
    // SAFETY: `known` checked the layout on this interpreter; `ty` is live.
    known(ty.py()).then(|| unsafe { core::getattro_and_dictoffset(type_ptr(ty)) })
}

/// `tp_version_tag` of `ty`, or 0 (never cached) where the layout is unknown.
pub(crate) fn version_tag(ty: &Bound<'_, PyType>) -> u32 {
    if !known(ty.py()) {
        return 0;
    }
    // SAFETY: `known` checked the layout on this interpreter; `ty` is live.
    unsafe { core::version_tag(type_ptr(ty)) }
}

/// The `__dict__` slot of an exception instance whose type's `__dictoffset__`
/// is [`EXCEPTION_DICT_OFFSET`] (checked by the caller); NULL or a dict.
///
/// # Safety
///
/// `obj` is a live instance of such a type, and the layout is known (the
/// caller got the offset from [`getattro_and_dictoffset`]).
pub(crate) unsafe fn exception_dict(obj: &Bound<'_, PyAny>) -> *mut ffi::PyObject {
    // SAFETY: the caller's contract.
    unsafe { core::exception_dict(obj.as_ptr().cast_const().cast()) }.cast()
}

/// `_native._type_layout_known()`: whether the classifier's fast paths are on
/// in this interpreter (the tests expect them on every CPython the wheel
/// supports).
#[pyfunction]
fn _type_layout_known(py: Python<'_>) -> bool {
    known(py)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // Checked while the module initialises, on the importing thread alone.
    known(m.py());
    m.add_function(wrap_pyfunction!(_type_layout_known, m)?)
}
