//! `ProtocolCore.WriteKind`: what a write of the driver is (a field of `Action`), declared once
//! in the core ([`crate::writes::WriteKind`]); its schedule is the protocol's
//! (`ProtocolCore.handle`, `poll`, `poll_timeout`: [`crate::protocol`] over
//! [`crate::writes`]), and the driver performs it.
//!
//! The protocol's one retry rule ([`crate::retry`]) has no class of its own here: the
//! handler's calls are retried inside its protocol (the driver's writes, the leader's
//! round and the step-key reader: `crate::protocol`), and the rule's table tests are
//! the core's (`src/retry.rs`).

use pyo3::prelude::*;

use super::wire::py_enum;
use crate::writes;

crate::writes::write_kind!(py_enum[crate::writes]);

/// A write's kind is its `WriteKind` in Python (a field of `Action`).
impl<'py> IntoPyObject<'py> for writes::WriteKind {
    type Target = WriteKind;
    type Output = Bound<'py, WriteKind>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        WriteKind::from(self).into_pyobject(py)
    }
}

impl<'py> IntoPyObject<'py> for &writes::WriteKind {
    type Target = WriteKind;
    type Output = Bound<'py, WriteKind>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        WriteKind::from(self.clone()).into_pyobject(py)
    }
}

impl FromPyObject<'_, '_> for writes::WriteKind {
    type Error = PyErr;

    fn extract(ob: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        let kind = ob.cast::<WriteKind>()?;
        Ok(writes::WriteKind::from(kind.get()))
    }
}

/// `WriteKind` is the protocol's vocabulary: Python reaches it as
/// `ProtocolCore.WriteKind`, not as a name of the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    super::wire::nest::<super::handler::ProtocolCore, WriteKind>(m.py(), "WriteKind")
}
