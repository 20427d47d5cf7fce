//! Binding of the host-memory check ([`crate::host_memory`]): where a non-chief's whole
//! copy of a checkpoint goes, from the numbers the Python side read.

use pyo3::prelude::*;

use crate::host_memory::{self, Cgroup, CopyPlace, Readings};

/// `(place, needed, available)` for a copy of `copy_bytes` bytes: `place` is `"memory"`
/// or `"storage"`, `needed` the bytes the copy needs in memory, `available` the bytes
/// the process may still take (None: not known). The readings: `cgroups`, the
/// process's cgroup and those above it as `(limit, usage, inactive file cache)`, and
/// `/proc/meminfo`'s `MemAvailable`, in bytes (None: not read).
#[pyfunction]
#[allow(clippy::type_complexity)] // the readings as Python passes them
fn copy_place(
    copy_bytes: u64,
    cgroups: Vec<(Option<u64>, Option<u64>, Option<u64>)>,
    mem_available: Option<u64>,
) -> (&'static str, u64, Option<u64>) {
    let readings = Readings {
        cgroups: cgroups
            .into_iter()
            .map(|(limit, usage, inactive_file)| Cgroup {
                limit,
                usage,
                inactive_file,
            })
            .collect(),
        mem_available,
    };
    let d = host_memory::copy_place(copy_bytes, &readings);
    let place = match d.place {
        CopyPlace::Memory => "memory",
        CopyPlace::Storage => "storage",
    };
    (place, d.needed, d.available)
}

pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(copy_place, m)?)?;
    Ok(())
}
