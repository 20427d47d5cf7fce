//! Which worker writes which tensor when the workers of a MultiWorkerMirroredStrategy
//! cluster write one checkpoint together (`TF_FAILURE_HANDLING_NON_CHIEF_SAVES=shares`).
//!
//! Every worker holds the same tensors and asks the same question with the same sizes,
//! so every worker gets the same answer without talking to the others. The answer is
//! TensorFlow's sharded layout: part `i` of `n` (`<prefix>_temp/part-0000i-of-0000n`)
//! is written by the `i`-th worker that has a tensor at all, and the chief merges the
//! parts into `<prefix>.index` and `<prefix>.data-0000i-of-0000n`.

use thiserror::Error;

/// The chief's shortest wait for the other workers' parts, in seconds.
pub const MIN_WAIT: f64 = 60.0;
/// The chief waits this many times as long as its own part took, when that is longer.
pub const WAIT_FACTOR: f64 = 4.0;

/// How long the chief waits for the other parts after its own took `own` seconds:
/// `WAIT_FACTOR` × `own`, and at least `min_wait` ([`MIN_WAIT`] in production). The
/// parts are about even and started together, so a part this late is not coming.
#[must_use]
pub fn wait_bound(own: f64, min_wait: f64) -> f64 {
    (WAIT_FACTOR * own.max(0.0)).max(min_wait)
}

/// A plan that cannot be made.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SharesError {
    #[error("a checkpoint is written by at least one worker, not 0")]
    NoWorkers,
    #[error("{sizes} tensor sizes but {pinned} pinned flags: one flag per tensor")]
    Mismatch { sizes: usize, pinned: usize },
}

/// Who writes what: `owner[t]` is the worker that writes tensor `t`; `parts` lists the
/// workers that write a part, in part order (a worker with no tensor writes none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shares {
    pub owner: Vec<usize>,
    pub parts: Vec<usize>,
}

impl Shares {
    /// The part this worker writes (its index in `parts`), if it writes one.
    pub fn part_of(&self, worker: usize) -> Option<usize> {
        self.parts.iter().position(|&w| w == worker)
    }
}

/// Splits tensors of `sizes` bytes between `workers` workers.
///
/// A `pinned` tensor goes to worker 0, the chief (the object graph: the merged index
/// then describes the chief's objects). The others go largest first, each to the
/// worker with the fewest bytes so far, the lowest index on a tie; equal sizes keep
/// their order. The largest share is then at most the even share plus one tensor.
pub fn assign(sizes: &[u64], pinned: &[bool], workers: usize) -> Result<Shares, SharesError> {
    if workers == 0 {
        return Err(SharesError::NoWorkers);
    }
    if sizes.len() != pinned.len() {
        return Err(SharesError::Mismatch {
            sizes: sizes.len(),
            pinned: pinned.len(),
        });
    }
    let mut load = vec![0u64; workers];
    let mut owner = vec![0usize; sizes.len()];
    for (t, _) in pinned.iter().enumerate().filter(|(_, &p)| p) {
        load[0] = load[0].saturating_add(sizes[t]);
    }
    let mut order: Vec<usize> = (0..sizes.len()).filter(|&t| !pinned[t]).collect();
    order.sort_by(|&a, &b| sizes[b].cmp(&sizes[a]).then(a.cmp(&b)));
    for t in order {
        let lightest = (0..workers).min_by_key(|&w| (load[w], w)).unwrap_or(0);
        owner[t] = lightest;
        load[lightest] = load[lightest].saturating_add(sizes[t]);
    }
    let mut parts: Vec<usize> = owner.clone();
    parts.sort_unstable();
    parts.dedup();
    Ok(Shares { owner, parts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shares(sizes: &[u64], pinned: &[bool], workers: usize) -> Shares {
        assign(sizes, pinned, workers).unwrap()
    }

    #[test]
    fn each_row_of_the_table() {
        // (sizes, pinned, workers, owners, parts)
        type Row = (&'static [u64], &'static [bool], usize, &'static [usize], &'static [usize]);
        let rows: &[Row] = &[
            // One worker writes everything: TensorFlow's one-part checkpoint.
            (&[5, 9, 1], &[false, false, false], 1, &[0, 0, 0], &[0]),
            // Largest first to the lightest worker.
            (&[4, 8, 4], &[false, false, false], 2, &[1, 0, 1], &[0, 1]),
            // Ties go to the lower index, equal sizes keep their order.
            (&[3, 3, 3, 3], &[false; 4], 2, &[0, 1, 0, 1], &[0, 1]),
            // The object graph stays with the chief and counts in its load.
            (&[10, 6, 6], &[true, false, false], 2, &[0, 1, 1], &[0, 1]),
            // More workers than tensors: the idle ones write no part.
            (&[7, 2], &[false, false], 4, &[0, 1], &[0, 1]),
            // Only pinned tensors: the chief writes the one part.
            (&[1], &[true], 3, &[0], &[0]),
            // Nothing to write: no part at all.
            (&[], &[], 2, &[], &[]),
            // Zero-byte tensors still get an owner.
            (&[0, 0, 5], &[false; 3], 2, &[1, 1, 0], &[0, 1]),
        ];
        for &(sizes, pinned, workers, owner, parts) in rows {
            let got = shares(sizes, pinned, workers);
            assert_eq!(got.owner, owner, "owners of {sizes:?} over {workers}");
            assert_eq!(got.parts, parts, "parts of {sizes:?} over {workers}");
        }
    }

    #[test]
    fn the_chief_waits_four_times_its_own_part_and_at_least_the_minimum() {
        assert_eq!(wait_bound(1.0, MIN_WAIT), MIN_WAIT);
        assert_eq!(wait_bound(20.0, MIN_WAIT), 80.0);
        assert_eq!(wait_bound(-1.0, 0.2), 0.2);
    }

    #[test]
    fn a_worker_s_part_is_its_place_among_the_writers() {
        let got = shares(&[9, 1], &[false, false], 3);
        assert_eq!(got.part_of(0), Some(0));
        assert_eq!(got.part_of(1), Some(1));
        assert_eq!(got.part_of(2), None);
    }

    #[test]
    fn a_plan_that_cannot_be_made_says_why() {
        assert_eq!(assign(&[1], &[false], 0), Err(SharesError::NoWorkers));
        assert_eq!(assign(&[1, 2], &[false], 2), Err(SharesError::Mismatch { sizes: 2, pinned: 1 }));
    }

    proptest! {
        #[test]
        fn every_tensor_is_written_once_and_no_share_is_much_above_even(
            sizes in proptest::collection::vec(0u64..1_000_000, 0..60),
            workers in 1usize..9,
        ) {
            let pinned = vec![false; sizes.len()];
            let got = shares(&sizes, &pinned, workers);
            prop_assert_eq!(got.owner.len(), sizes.len());
            let mut load = vec![0u64; workers];
            for (t, &w) in got.owner.iter().enumerate() {
                prop_assert!(w < workers);
                load[w] += sizes[t];
            }
            let total: u64 = sizes.iter().sum();
            let largest = sizes.iter().copied().max().unwrap_or(0);
            let even = total.div_ceil(workers as u64);
            prop_assert!(load.iter().all(|&l| l <= even + largest));
            // The same question gets the same answer (every worker asks it).
            prop_assert_eq!(shares(&sizes, &pinned, workers), got.clone());
            // Parts are the writers, in order.
            for (i, &w) in got.parts.iter().enumerate() {
                prop_assert_eq!(got.part_of(w), Some(i));
                prop_assert!(got.owner.contains(&w));
            }
        }
    }
}
