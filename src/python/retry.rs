//! `WriteKind`: what a write of the driver is, whose schedule is the protocol's
//! (`ProtocolCore.handle`, `poll`, `poll_timeout`: [`crate::protocol`] over
//! [`crate::writes`]); the driver performs them.
//!
//! The protocol's one retry rule ([`crate::retry`]) has no class of its own here: the
//! handler's calls are retried inside its protocol (the driver's writes, the leader's
//! round and the step-key reader: `crate::protocol`), and the rule's table tests are
//! the core's (`src/retry.rs`).

use pyo3::prelude::*;

use crate::writes;

/// What a write of the driver is (`Writes.push`).
#[pyclass(eq, eq_int, frozen, from_py_object, module = "tf_failure_handling._native")]
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum WriteKind {
    /// The acknowledgement of a step key: goes first.
    Acknowledge,
    /// A notice's claim: dropped at `close`.
    Claim,
    /// A notice's announce: one last attempt at `close`.
    Announce,
}

impl From<writes::Kind> for WriteKind {
    fn from(k: writes::Kind) -> Self {
        match k {
            writes::Kind::Acknowledge => WriteKind::Acknowledge,
            writes::Kind::Claim => WriteKind::Claim,
            writes::Kind::Announce => WriteKind::Announce,
        }
    }
}

/// A write's kind is its `WriteKind` in Python (a field of `Action`).
impl<'py> IntoPyObject<'py> for writes::Kind {
    type Target = WriteKind;
    type Output = Bound<'py, WriteKind>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        Bound::new(py, WriteKind::from(self))
    }
}

impl<'py> IntoPyObject<'py> for &writes::Kind {
    type Target = WriteKind;
    type Output = Bound<'py, WriteKind>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        Bound::new(py, WriteKind::from(*self))
    }
}

impl FromPyObject<'_, '_> for writes::Kind {
    type Error = PyErr;

    fn extract(ob: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        Ok(ob.extract::<WriteKind>()?.into())
    }
}

impl From<WriteKind> for writes::Kind {
    fn from(k: WriteKind) -> Self {
        match k {
            WriteKind::Acknowledge => writes::Kind::Acknowledge,
            WriteKind::Claim => writes::Kind::Claim,
            WriteKind::Announce => writes::Kind::Announce,
        }
    }
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<WriteKind>()?;
    Ok(())
}
