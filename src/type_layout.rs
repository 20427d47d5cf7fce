//! CPython's object layout, up to three fields the stable ABI hides, and the
//! check that decides whether they may be read.
//!
//! The wheel is built against PyO3's stable ABI (`abi3-py310`: one wheel for
//! CPython 3.10-3.13, README "Install"). Two fast paths of the failure
//! classifier need what the limited API does not expose: a type's
//! `tp_version_tag` (the key of its per-type cache), its `tp_dictoffset`, and
//! the `__dict__` slot of a `BaseException` instance. `PyTypeObject` and
//! `PyBaseExceptionObject` have had the same layout up to those fields in every
//! CPython from 3.8 to 3.13 (non-free-threaded builds), so this module reads
//! them through its own `#[repr(C)]` prefixes, but only after [`matches`] has
//! compared what the prefixes read with what the interpreter reports through
//! the stable ABI ([`Reported`]) on built-in and user-defined exception types
//! (the binding, `src/python/layout.rs`, gathers those reports once). On any
//! other interpreter (3.14, free-threaded) the check fails and the classifier
//! takes its slow path: right, only slower.
//!
//! No Python here: the binding hands over the pointers of live objects and
//! what the interpreter reported about them.

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
    dict: *mut c_void,
}

/// The offset of a `BaseException`'s `__dict__` slot: what
/// `__dictoffset__` is for a type whose instances keep their dict there.
pub const EXCEPTION_DICT_OFFSET: isize = std::mem::offset_of!(BaseExceptionPrefix, dict) as isize;

/// Whether an interpreter of this version may have the layout at all (the
/// check on live types decides): CPython 3.8-3.13 with the GIL (a
/// free-threaded build has another object head).
#[must_use]
pub fn may_apply(version: (u8, u8), gil_enabled: bool) -> bool {
    ((3, 8)..(3, 14)).contains(&version) && gil_enabled
}

/// What the interpreter reports of one type through the stable ABI.
#[derive(Debug, Clone)]
pub struct Reported {
    /// Its `__name__`.
    pub name: String,
    /// Its type (the metaclass), as a pointer.
    pub metatype: *const c_void,
    /// Its `__basicsize__`.
    pub basicsize: isize,
    /// Its `__dictoffset__`.
    pub dictoffset: isize,
    /// `PyType_GetFlags`.
    pub flags: c_ulong,
    /// `PyType_GetSlot(Py_tp_getattro)`, where the interpreter answers it
    /// for every type (3.10 and later); None: not compared.
    pub getattro: Option<*const c_void>,
}

/// Whether the prefix read at `ty` says what the interpreter reported.
///
/// # Safety
///
/// `ty` is a live type object of an interpreter for which [`may_apply`] is
/// true (its layout begins with the prefix; only plain fields are read).
#[must_use]
pub unsafe fn matches(ty: *const c_void, reported: &Reported) -> bool {
    // SAFETY: the caller's contract.
    let prefix = unsafe { &*ty.cast::<TypePrefix>() };
    // SAFETY: `tp_name` of a live type is a NUL-terminated string.
    let name = unsafe { CStr::from_ptr(prefix.tp_name) }.to_string_lossy();
    name.rsplit('.').next() == Some(reported.name.as_str())
        && prefix.head.ob_type.cast_const() == reported.metatype
        && prefix.tp_basicsize == reported.basicsize
        && prefix.tp_dictoffset == reported.dictoffset
        && prefix.tp_flags == reported.flags
        && reported.getattro.map_or(true, |g| prefix.tp_getattro.cast_const() == g)
}

/// `tp_getattro` and `tp_dictoffset` of `ty`.
///
/// # Safety
///
/// `ty` is a live type object and [`matches`] held on this interpreter.
#[must_use]
pub unsafe fn getattro_and_dictoffset(ty: *const c_void) -> (*const (), isize) {
    // SAFETY: the caller's contract.
    let prefix = unsafe { &*ty.cast::<TypePrefix>() };
    (prefix.tp_getattro.cast_const().cast(), prefix.tp_dictoffset)
}

/// `tp_version_tag` of `ty`.
///
/// # Safety
///
/// As [`getattro_and_dictoffset`].
#[must_use]
pub unsafe fn version_tag(ty: *const c_void) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { (*ty.cast::<TypePrefix>()).tp_version_tag }
}

/// The `__dict__` slot of an exception instance: NULL or a dict.
///
/// # Safety
///
/// `obj` is a live instance of a type whose `__dictoffset__` is
/// [`EXCEPTION_DICT_OFFSET`], and [`matches`] held on this interpreter.
#[must_use]
pub unsafe fn exception_dict(obj: *const c_void) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { (*obj.cast::<BaseExceptionPrefix>()).dict }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_cpython_3_8_to_3_13_with_the_gil_may_have_the_layout() {
        assert!(may_apply((3, 8), true));
        assert!(may_apply((3, 13), true));
        assert!(!may_apply((3, 7), true));
        assert!(!may_apply((3, 14), true));
        assert!(!may_apply((3, 13), false));
    }

    #[test]
    fn a_prefix_matches_only_what_was_reported_of_it() {
        let mut ty: TypePrefix = unsafe { std::mem::zeroed() };
        let meta = 0x10usize as *mut c_void;
        let getattro = 0x20usize as *mut c_void;
        ty.head.ob_type = meta;
        ty.tp_name = c"builtins.ValueError".as_ptr();
        ty.tp_basicsize = 88;
        ty.tp_dictoffset = EXCEPTION_DICT_OFFSET;
        ty.tp_flags = 7;
        ty.tp_getattro = getattro;
        ty.tp_version_tag = 42;
        let reported = Reported {
            name: "ValueError".into(),
            metatype: meta,
            basicsize: 88,
            dictoffset: EXCEPTION_DICT_OFFSET,
            flags: 7,
            getattro: Some(getattro),
        };
        let at = std::ptr::from_ref(&ty).cast::<c_void>();
        // SAFETY: `ty` is a whole prefix, alive for the test.
        unsafe {
            assert!(matches(at, &reported));
            assert!(matches(
                at,
                &Reported {
                    getattro: None,
                    ..reported.clone()
                }
            ));
            assert!(!matches(
                at,
                &Reported {
                    basicsize: 80,
                    ..reported.clone()
                }
            ));
            assert!(!matches(
                at,
                &Reported {
                    name: "KeyError".into(),
                    ..reported.clone()
                }
            ));
            assert!(!matches(
                at,
                &Reported {
                    getattro: Some(meta),
                    ..reported.clone()
                }
            ));
            assert_eq!(version_tag(at), 42);
            assert_eq!(getattro_and_dictoffset(at), (getattro.cast_const().cast(), EXCEPTION_DICT_OFFSET));
        }
    }
}
