//! The binding's side of [`crate::wire`]: `py_enum!` expands a core
//! declaration into its Python class, and the conversions of the core types a
//! declaration's fields may hold.
//!
//! A binding module turns a core type into its Python class with one line,
//! naming the core module the type is in:
//!
//! ```ignore
//! crate::protocol::reader_action!(py_enum[crate::protocol]);
//! ```
//!
//! That defines, in the calling module, a frozen `#[pyclass]` enum of the same
//! name, variants, fields and docs (each variant's constructor takes its fields,
//! with the declaration's defaults), `From<core::T>` for the class (an action
//! handed to Python) and `From<&T>` for the core type (an event Python built).
//! Nothing else is written for a type: a field added in the core's declaration
//! is in Python at the next build.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::step_resolution::Round;

/// Expands a `wire!` declaration into its Python class (see the module).
macro_rules! py_enum {
    (
        [$($core:tt)*]
        $(#[$meta:meta])*
        pub enum $name:ident {
            $(
                $(#[$vmeta:meta])*
                $variant:ident { $( $field:ident : $ty:ty $(= $default:tt)? ),* $(,)? }
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[pyo3::pyclass(frozen, module = "tf_failure_handling._native")]
        pub enum $name {
            $(
                $(#[$vmeta])*
                #[pyo3(constructor = ($($field $(= $default)?),*))]
                $variant { $( $field: $ty ),* }
            ),*
        }

        const _: () = {
            use $($core)*::$name as Core;

            impl From<Core> for $name {
                fn from(value: Core) -> Self {
                    match value {
                        $( Core::$variant { $($field),* } => $name::$variant { $($field),* } ),*
                    }
                }
            }

            impl From<&$name> for Core {
                fn from(value: &$name) -> Self {
                    match value {
                        $( $name::$variant { $($field),* } => Core::$variant { $($field: $field.clone()),* } ),*
                    }
                }
            }
        };
    };
}
pub(crate) use py_enum;

/// A round is its key in Python (`RUN_TO_CHECKPOINT` or
/// `LAST_RUN_TO_CHECKPOINT`, TF's names).
impl<'py> IntoPyObject<'py> for Round {
    type Target = PyString;
    type Output = Bound<'py, PyString>;
    type Error = std::convert::Infallible;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(PyString::new(py, self.key()))
    }
}

impl<'py> IntoPyObject<'py> for &Round {
    type Target = PyString;
    type Output = Bound<'py, PyString>;
    type Error = std::convert::Infallible;

    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        Ok(PyString::new(py, self.key()))
    }
}

impl FromPyObject<'_, '_> for Round {
    type Error = PyErr;

    fn extract(ob: Borrowed<'_, '_, PyAny>) -> PyResult<Self> {
        let key: String = ob.extract()?;
        [Round::Initial, Round::Final]
            .into_iter()
            .find(|round| round.key() == key)
            .ok_or_else(|| PyValueError::new_err(format!("{key:?} is not a step key")))
    }
}

/// Makes the class `T` a type of the class `Owner` (the agreed nesting: Python reaches
/// it as `Owner.name`, and its repr says so) rather than a name of the module.
pub(crate) fn nest<Owner: pyo3::PyTypeInfo, T: pyo3::PyTypeInfo>(py: Python<'_>, name: &str) -> PyResult<()> {
    let (owner, nested) = (py.get_type::<Owner>(), py.get_type::<T>());
    nested.setattr("__qualname__", format!("{}.{name}", owner.qualname()?))?;
    owner.setattr(name, nested)
}
