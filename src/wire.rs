//! [`wire!`](crate::wire): one declaration for each type that crosses the
//! waist between the core and Python.
//!
//! An event the core takes from Python, or an action it hands back, is written
//! once, here in the core, inside `wire! { ... }`:
//!
//! ```ignore
//! crate::wire! {
//!     /// What the step-key reader does next.
//!     pub enum ReaderAction via reader_action {
//!         /// Read `key` for at most `timeout` seconds.
//!         Get { key: String, timeout: f64 },
//!         /// A value read; `superseded` is False unless Python says so.
//!         Post { round: Round, value: String, superseded: bool = false },
//!         /// Nothing more to read.
//!         Done {},
//!     }
//! }
//! ```
//!
//! The core gets the plain enum (`Clone`, `Debug`, `PartialEq`), its docs,
//! and nothing about Python. `via reader_action` names a second macro that
//! hands the same declaration, as tokens, to any macro of the caller's
//! choosing: the binding (`src/python/wire.rs`) expands it into its
//! `#[pyclass]` enum, with the same variants, fields and docs, and the
//! conversions both ways, in one line:
//!
//! ```ignore
//! crate::protocol::reader_action!(py_enum[crate::protocol]);
//! ```
//!
//! So a field added to an action is added in one place, and the binding holds
//! no copy of the type to keep in step. A field's `= default` (one token:
//! `true`, `None`, `0`) is the default Python's constructor gives it; the core
//! ignores it. A field's type is a plain value (`String`, `f64`, `u64`, `u32`,
//! `bool`, `Option<_>`, `Vec<_>`) or a core type the binding converts
//! (`Round`: its key). A variant without fields is written `Name {}`.

/// Declares a type that crosses the waist (see [the module](crate::wire)).
#[macro_export]
macro_rules! wire {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident via $callback:ident { $($body:tt)* }
    ) => {
        $crate::wire!(@plain [$(#[$meta])*] $vis $name { $($body)* });
        $crate::wire!(@callback ($) $callback { $(#[$meta])* pub enum $name { $($body)* } });
    };
    (@plain [$($meta:tt)*] $vis:vis $name:ident {
        $(
            $(#[$vmeta:meta])*
            $variant:ident { $( $field:ident : $ty:ty $(= $default:tt)? ),* $(,)? }
        ),* $(,)?
    }) => {
        $($meta)*
        #[derive(Clone, Debug, PartialEq)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant { $( $field: $ty ),* } ),*
        }
    };
    (@callback ($d:tt) $callback:ident { $($decl:tt)* }) => {
        /// Hands this module's `wire!` declaration to the macro named first
        /// (with the tokens in brackets after it): see [`crate::wire`].
        #[allow(unused_macros)]
        macro_rules! $callback {
            ($d m:ident [$d($d args:tt)*]) => { $d m! { [$d($d args)*] $($decl)* } };
        }
        #[allow(unused_imports)]
        pub(crate) use $callback;
    };
}

#[cfg(test)]
mod tests {
    crate::wire! {
        /// A type for the tests.
        pub enum Sample via sample {
            /// One field with a default.
            First { n: u64, flag: bool = true },
            /// No fields.
            Second {},
        }
    }

    /// A stand-in for the binding's macro: it sees the declaration's variants
    /// and fields, defaults included.
    macro_rules! names {
        (
            [$out:ident]
            $(#[$meta:meta])*
            pub enum $name:ident {
                $(
                    $(#[$vmeta:meta])*
                    $variant:ident { $( $field:ident : $ty:ty $(= $default:tt)? ),* $(,)? }
                ),* $(,)?
            }
        ) => {
            let $out: Vec<(&str, Vec<(&str, Option<&str>)>)> = vec![
                $( (stringify!($variant), vec![ $( (stringify!($field), None $(.or(Some(stringify!($default))))?) ),* ]) ),*
            ];
        };
    }

    #[test]
    fn the_core_gets_a_plain_enum() {
        let a = Sample::First { n: 3, flag: false };
        assert_eq!(a.clone(), a);
        assert_ne!(a, Sample::Second {});
    }

    #[test]
    fn the_callback_hands_on_the_declaration_with_its_defaults() {
        sample!(names[seen]);
        assert_eq!(
            seen,
            vec![("First", vec![("n", None), ("flag", Some("true"))]), ("Second", vec![]),]
        );
    }
}
