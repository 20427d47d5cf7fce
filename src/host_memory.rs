//! Whether a non-chief's copy of a checkpoint may be held in the host's memory.
//!
//! Under MultiWorkerMirroredStrategy a non-chief takes part in every save. By default
//! (`TF_FAILURE_HANDLING_NON_CHIEF_SAVES=memory`) it reads every tensor and writes no
//! copy, which costs no host memory. A saver that cannot leave its copy out (registered
//! savers, tensors on several tasks, a save traced into a graph) writes it whole; in
//! `memory` mode that copy would go to TensorFlow's `ram://` file system, i.e. into the
//! process's heap. This module decides, at the save (after the notice), whether it may:
//! a host that cannot spare the copy is OOM-killed (exit 137, not the restart code) and
//! the save is lost, so a copy that does not fit goes to the storage instead
//! (TensorFlow's `workertemp_<task_id>` beside the checkpoint), and the caller says so in
//! the log and the preemption record.
//!
//! The inputs are numbers the Python side reads and does not interpret: each cgroup's
//! limit, usage and reclaimable file cache (v2 `memory.max`, `memory.current`,
//! `memory.stat` `inactive_file`; v1 `memory.limit_in_bytes`, `memory.usage_in_bytes`,
//! `total_inactive_file`), and `/proc/meminfo`'s `MemAvailable`. Whatever is unknown is
//! `None`. No clock is involved: the answer depends on the readings only.

/// A `ram://` copy held more than its own bytes in the process at its peak (measured
/// before issue 50, when every save made one, with `benches/bench_save_memory.py` and
/// `tests/integration/test_save_memory.py`: a 200 MiB model grew a non-chief's peak
/// resident set by 299 MiB from the handler's construction to its exit, and by 281 MiB
/// during the save alone; TensorFlow's file system keeps the file as a string, and
/// `SaveV2` adds its buffers).
/// The need is 1.5 × the copy's bytes (3/2, in integers).
pub const COPY_NEED_NUMERATOR: u64 = 3;
/// See [`COPY_NEED_NUMERATOR`].
pub const COPY_NEED_DENOMINATOR: u64 = 2;
/// Bytes left free beyond the copy's need, for the rest of the process during the save
/// (TensorFlow's allocations, the interpreter, the records' writer): 64 MiB.
pub const RESERVE: u64 = 64 << 20;
/// A cgroup v1 "limit" at or above this is no limit (the kernel writes
/// `PAGE_COUNTER_MAX` × the page size, 9223372036854771712 on 4 KiB pages); cgroup v2
/// writes `max`, read as `None`.
pub const NO_LIMIT: u64 = 1 << 62;

/// One cgroup on the way from the process's own to the root, as read; `None`: not
/// known here (v2 writes `max` for no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cgroup {
    /// Its limit (`memory.max`, `memory.limit_in_bytes`).
    pub limit: Option<u64>,
    /// Its usage (`memory.current`, `memory.usage_in_bytes`), file cache included.
    pub usage: Option<u64>,
    /// Its inactive file cache (`inactive_file`, `total_inactive_file`): usage the kernel
    /// reclaims before it kills (the kubelet's working set leaves it out too).
    pub inactive_file: Option<u64>,
}

impl Cgroup {
    /// Bytes this cgroup can still take: limit − (usage − inactive file cache); `None`
    /// without a limit or a usage.
    #[must_use]
    pub fn room(&self) -> Option<u64> {
        match (self.limit, self.usage) {
            (Some(limit), Some(usage)) if limit < NO_LIMIT => {
                let working = usage.saturating_sub(self.inactive_file.unwrap_or(0));
                Some(limit.saturating_sub(working))
            }
            _ => None,
        }
    }
}

/// What the host's memory looks like at the save, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Readings {
    /// The process's cgroup and each above it that has a memory controller (a pod's
    /// limit is often on the pod's cgroup, above the container's).
    pub cgroups: Vec<Cgroup>,
    /// `/proc/meminfo`'s `MemAvailable`: the whole machine's.
    pub mem_available: Option<u64>,
}

/// Bytes the process may still take before the kernel (a cgroup's limit, or the
/// machine's memory) kills it: the smallest room of its cgroups and `MemAvailable`.
/// `None` when none is known.
#[must_use]
pub fn available(r: &Readings) -> Option<u64> {
    r.cgroups.iter().filter_map(Cgroup::room).chain(r.mem_available).min()
}

/// Where a non-chief's whole copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPlace {
    /// In the process's memory (`ram://`): it fits, or nothing says it does not.
    Memory,
    /// On the checkpoint's storage (`workertemp_<task_id>`): it does not fit in memory.
    Storage,
}

/// The answer for one copy: where it goes, what it needs and what was available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyDecision {
    pub place: CopyPlace,
    /// Bytes the copy needs in memory ([`COPY_NEED_NUMERATOR`]/[`COPY_NEED_DENOMINATOR`]
    /// of its bytes, plus [`RESERVE`]).
    pub needed: u64,
    /// Bytes available ([`available`]); `None`: not known.
    pub available: Option<u64>,
}

/// Where a copy of `copy_bytes` bytes goes, given the host's `readings`: memory when it
/// needs no more than is available, or when nothing is known (no `/proc`, no cgroup:
/// the platform's own default, as before this check); the storage otherwise.
#[must_use]
pub fn copy_place(copy_bytes: u64, readings: &Readings) -> CopyDecision {
    let needed = (copy_bytes / COPY_NEED_DENOMINATOR)
        .saturating_mul(COPY_NEED_NUMERATOR)
        .saturating_add((copy_bytes % COPY_NEED_DENOMINATOR) * COPY_NEED_NUMERATOR / COPY_NEED_DENOMINATOR)
        .saturating_add(RESERVE);
    let available = available(readings);
    let place = match available {
        Some(room) if needed > room => CopyPlace::Storage,
        _ => CopyPlace::Memory,
    };
    CopyDecision { place, needed, available }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn readings(limit: Option<u64>, usage: Option<u64>, inactive: Option<u64>, mem: Option<u64>) -> Readings {
        Readings {
            cgroups: vec![Cgroup {
                limit,
                usage,
                inactive_file: inactive,
            }],
            mem_available: mem,
        }
    }

    #[test]
    fn available_table() {
        let v1_unlimited = 9_223_372_036_854_771_712;
        let cases = [
            // (limit, usage, inactive file, MemAvailable) -> available
            (None, None, None, None, None, "nothing known"),
            (None, None, None, Some(8 * GIB), Some(8 * GIB), "no cgroup: MemAvailable"),
            (Some(4 * GIB), Some(GIB), None, None, Some(3 * GIB), "cgroup only"),
            (Some(4 * GIB), Some(GIB), None, Some(8 * GIB), Some(3 * GIB), "the cgroup binds"),
            (Some(4 * GIB), Some(GIB), None, Some(2 * GIB), Some(2 * GIB), "the machine binds"),
            (Some(4 * GIB), Some(3 * GIB), Some(2 * GIB), None, Some(3 * GIB), "cache reclaimed"),
            (Some(4 * GIB), Some(GIB), Some(2 * GIB), None, Some(4 * GIB), "cache above usage"),
            (Some(GIB), Some(2 * GIB), None, None, Some(0), "over the limit: none"),
            (Some(v1_unlimited), Some(GIB), None, Some(5 * GIB), Some(5 * GIB), "v1 no limit"),
            (Some(NO_LIMIT), Some(GIB), None, None, None, "no limit, no meminfo"),
            (Some(4 * GIB), None, None, Some(5 * GIB), Some(5 * GIB), "limit without usage"),
        ];
        for (limit, usage, inactive, mem, expected, what) in cases {
            assert_eq!(available(&readings(limit, usage, inactive, mem)), expected, "{what}");
        }
    }

    #[test]
    fn the_tightest_cgroup_binds() {
        let level = |limit, usage| Cgroup {
            limit: Some(limit),
            usage: Some(usage),
            inactive_file: None,
        };
        let cases = [
            // the container's, then the pod's, then no limit at the root
            (vec![level(NO_LIMIT, GIB), level(4 * GIB, 3 * GIB)], Some(GIB), "the pod's"),
            (vec![level(2 * GIB, GIB), level(8 * GIB, 2 * GIB)], Some(GIB), "the container's"),
            (vec![Cgroup::default(), level(2 * GIB, GIB)], Some(GIB), "an unread level"),
            (vec![], None, "no cgroup"),
        ];
        for (cgroups, expected, what) in cases {
            let r = Readings {
                cgroups,
                mem_available: None,
            };
            assert_eq!(available(&r), expected, "{what}");
        }
    }

    #[test]
    fn copy_place_table() {
        use CopyPlace::{Memory, Storage};
        let need_200 = 300 * MIB + RESERVE;
        let cases = [
            // (copy bytes, readings) -> place
            (200 * MIB, readings(None, None, None, None), Memory, "nothing known"),
            (200 * MIB, readings(None, None, None, Some(need_200)), Memory, "exactly fits"),
            (200 * MIB, readings(None, None, None, Some(need_200 - 1)), Storage, "a byte short"),
            (
                200 * MIB,
                readings(Some(GIB), Some(900 * MIB), None, Some(8 * GIB)),
                Storage,
                "cgroup",
            ),
            (
                200 * MIB,
                readings(Some(GIB), Some(900 * MIB), Some(600 * MIB), Some(8 * GIB)),
                Memory,
                "cgroup once its cache is reclaimed",
            ),
            (GIB, readings(None, None, None, Some(GIB)), Storage, "the copy alone fills it"),
            (0, readings(None, None, None, Some(RESERVE)), Memory, "an empty copy: the reserve"),
            (0, readings(None, None, None, Some(0)), Storage, "not even the reserve"),
            (u64::MAX, readings(None, None, None, Some(u64::MAX - 1)), Storage, "no overflow"),
        ];
        for (bytes, r, place, what) in cases {
            assert_eq!(copy_place(bytes, &r).place, place, "{what}");
        }
    }

    #[test]
    fn the_need_is_three_halves_and_the_reserve() {
        let d = copy_place(200 * MIB, &Readings::default());
        assert_eq!(d.needed, 300 * MIB + RESERVE);
        assert_eq!(d.available, None);
        assert_eq!(copy_place(3, &Readings::default()).needed, 4 + RESERVE);
    }
}
