//! Each cloud's parts, in one dispatch: the pollers that watch it and the
//! request that detects it. A new cloud is a file of its own (its poller,
//! `pollers` and `probe`), a [`Cloud`] variant and one row in [`parts`].

use super::shared::{Cloud, NamedPoller, ProbeStatus, Timing};
use super::{aws, azure, gce};

/// What the I/O shell (`watch.rs`) asks of one cloud.
pub(super) struct Parts {
    /// The pollers watching the cloud, each with its thread's name.
    pub pollers: fn(Timing) -> Vec<NamedPoller>,
    /// Whether the cloud's metadata service answers as that cloud's does.
    pub probe: fn(&mut ProbeStatus<'_>) -> bool,
}

/// The parts of `cloud`.
pub(super) fn parts(cloud: Cloud) -> Parts {
    match cloud {
        Cloud::Gce => Parts {
            pollers: gce::pollers,
            probe: gce::probe,
        },
        Cloud::Aws => Parts {
            pollers: aws::pollers,
            probe: aws::probe,
        },
        Cloud::Azure => Parts {
            pollers: azure::pollers,
            probe: azure::probe,
        },
    }
}

/// The pollers watching `cloud`, each with its thread's name.
#[must_use]
pub fn pollers(cloud: Cloud, timing: Timing) -> Vec<NamedPoller> {
    (parts(cloud).pollers)(timing)
}

#[cfg(test)]
mod tests {
    use super::{parts, pollers};
    use crate::sources::shared::{Cloud, Timing};

    #[test]
    fn every_cloud_has_its_pollers_named_after_it_and_a_probe() {
        for cloud in [Cloud::Gce, Cloud::Aws, Cloud::Azure] {
            let watching = pollers(cloud, Timing::new(5.0, 1.0).unwrap());
            assert!(!watching.is_empty(), "{cloud:?}");
            for (name, _) in &watching {
                assert!(name.starts_with(&format!("tfh-{}-", cloud.name())), "{name}");
            }
            // No answer at all: every cloud's probe says no.
            assert!(!(parts(cloud).probe)(&mut |_, _, _| None), "{cloud:?}");
        }
    }
}
