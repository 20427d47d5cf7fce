//! Three fields the stable ABI hides, read where their layout is known.
//!
//! The wheel is built against PyO3's stable ABI (`abi3-py310`: one wheel for
//! CPython 3.10-3.13, README "Install"). Two fast paths of the failure
//! classifier need what the limited API does not expose: a type's
//! `tp_version_tag` (the key of its per-type cache), its `tp_dictoffset`, and
//! the `__dict__` slot of a `BaseException` instance. `PyTypeObject` and
//! `PyBaseExceptionObject` have had the same layout up to those fields in every
//! CPython from 3.8 to 3.13 (non-free-threaded builds), so this module reads
//! them through its own `#[repr(C)]` prefixes, but only after [`check`] has
//! compared what the prefixes read with what the interpreter reports through
//! the stable ABI (`tp_name`, `__basicsize__`, `__dictoffset__`,
//! `PyType_GetFlags`, `PyType_GetSlot(Py_tp_getattro)`) on built-in and
//! user-defined exception types. On any other interpreter (3.14, free-threaded)
//! the check fails and the classifier takes its slow path: right, only slower.

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;
use std::ffi::{c_char, c_uint, c_ulong, c_void, CStr};

/// `PyObject_HEAD`: reference count and type.
#[repr(C)]
struct ObjectHead {
    ob_refcnt: isize,
    ob_type: *mut c_void,
}

/// `PyTypeObject` up to `tp_version_tag` (CPython 3.8-3.13).
#[repr(C)]
struct TypePrefix {
    head: ObjectHead,
    ob_size: isize,
    tp_name: *const c_char,
    tp_basicsize: isize,
    tp_itemsize: isize,
    tp_dealloc: *mut c_void,
    tp_vectorcall_offset: isize,
    tp_getattr: *mut c_void,
    tp_setattr: *mut c_void,
    tp_as_async: *mut c_void,
    tp_repr: *mut c_void,
    tp_as_number: *mut c_void,
    tp_as_sequence: *mut c_void,
    tp_as_mapping: *mut c_void,
    tp_hash: *mut c_void,
    tp_call: *mut c_void,
    tp_str: *mut c_void,
    tp_getattro: *mut c_void,
    tp_setattro: *mut c_void,
    tp_as_buffer: *mut c_void,
    tp_flags: c_ulong,
    tp_doc: *const c_char,
    tp_traverse: *mut c_void,
    tp_clear: *mut c_void,
    tp_richcompare: *mut c_void,
    tp_weaklistoffset: isize,
    tp_iter: *mut c_void,
    tp_iternext: *mut c_void,
    tp_methods: *mut c_void,
    tp_members: *mut c_void,
    tp_getset: *mut c_void,
    tp_base: *mut c_void,
    tp_dict: *mut c_void,
    tp_descr_get: *mut c_void,
    tp_descr_set: *mut c_void,
    tp_dictoffset: isize,
    tp_init: *mut c_void,
    tp_alloc: *mut c_void,
    tp_new: *mut c_void,
    tp_free: *mut c_void,
    tp_is_gc: *mut c_void,
    tp_bases: *mut c_void,
    tp_mro: *mut c_void,
    tp_cache: *mut c_void,
    tp_subclasses: *mut c_void,
    tp_weaklist: *mut c_void,
    tp_del: *mut c_void,
    tp_version_tag: c_uint,
}

/// `PyBaseExceptionObject` up to its `dict`.
#[repr(C)]
struct BaseExceptionPrefix {
    head: ObjectHead,
    dict: *mut ffi::PyObject,
}

/// The offset of a `BaseException`'s `__dict__` slot: what
/// `__dictoffset__` is for a type whose instances keep their dict there.
pub(crate) const EXCEPTION_DICT_OFFSET: isize = std::mem::offset_of!(BaseExceptionPrefix, dict) as isize;

/// Whether the prefixes match the running interpreter ([`check`], once).
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

/// Compares what [`TypePrefix`] reads with what the stable ABI reports, on a
/// built-in exception type, a user-defined one and a user-defined one with
/// `__slots__` (another `__dictoffset__`).
fn check(py: Python<'_>) -> PyResult<bool> {
    if py.version_info() < (3, 8) || py.version_info() >= (3, 14) {
        return Ok(false);
    }
    let sys = py.import("sys")?;
    // A free-threaded build has another object head.
    if sys.hasattr("_is_gil_enabled")? && !sys.call_method0("_is_gil_enabled")?.extract::<bool>()? {
        return Ok(false);
    }
    let namespace = pyo3::types::PyDict::new(py);
    py.run(
        c"class Plain(Exception):\n    pass\nclass Slotted(ValueError):\n    __slots__ = ('a',)\n",
        None,
        Some(&namespace),
    )?;
    let builtins = py.import("builtins")?;
    let types = [
        builtins.getattr("ValueError")?,
        namespace.get_item("Plain")?.expect("defined above"),
        namespace.get_item("Slotted")?.expect("defined above"),
    ];
    for ty in types {
        let ty = ty.cast_into::<PyType>()?;
        let ptr = ty.as_type_ptr();
        // SAFETY: `ty` is a live type object, whose layout begins with `TypePrefix`
        // on the interpreters this checks for; only plain fields are read.
        let prefix = unsafe { &*ptr.cast::<TypePrefix>() };
        // SAFETY: `tp_name` of a live type is a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(prefix.tp_name) }.to_string_lossy();
        let qualname: String = ty.getattr("__name__")?.extract()?;
        let basicsize: isize = ty.getattr("__basicsize__")?.extract()?;
        let dictoffset: isize = ty.getattr("__dictoffset__")?.extract()?;
        // SAFETY: a live type object.
        let flags = unsafe { ffi::PyType_GetFlags(ptr) };
        // SAFETY: a live type object; `Py_tp_getattro` is a valid slot (3.10+
        // answers for static types too).
        let getattro = unsafe { ffi::PyType_GetSlot(ptr, ffi::Py_tp_getattro) };
        let same = name.rsplit('.').next() == Some(qualname.as_str())
            && prefix.head.ob_type == ty.get_type().as_ptr().cast()
            && prefix.tp_basicsize == basicsize
            && prefix.tp_dictoffset == dictoffset
            && prefix.tp_flags == flags
            && (py.version_info() < (3, 10) || prefix.tp_getattro == getattro);
        if !same {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `tp_getattro` and `tp_dictoffset` of `ty`, where the layout is known.
pub(crate) fn getattro_and_dictoffset(ty: &Bound<'_, PyType>) -> Option<(*const (), isize)> {
    if !known(ty.py()) {
        return None;
    }
    // SAFETY: `known` checked the prefix against this interpreter; `ty` is live.
    let prefix = unsafe { &*ty.as_type_ptr().cast::<TypePrefix>() };
    Some((prefix.tp_getattro.cast_const().cast(), prefix.tp_dictoffset))
}

/// `tp_version_tag` of `ty`, or 0 (never cached) where the layout is unknown.
pub(crate) fn version_tag(ty: &Bound<'_, PyType>) -> u32 {
    if !known(ty.py()) {
        return 0;
    }
    // SAFETY: `known` checked the prefix against this interpreter; `ty` is live.
    unsafe { (*ty.as_type_ptr().cast::<TypePrefix>()).tp_version_tag }
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
    unsafe { (*obj.as_ptr().cast::<BaseExceptionPrefix>()).dict }
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
