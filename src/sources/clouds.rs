//! The clouds, in one table: each cloud's name, the pollers that watch it and
//! the request that detects it. Nothing else names every cloud: a new cloud
//! is a file of its own (its poller, `pollers` and `probe`), a [`Cloud`]
//! variant and its row in [`CLOUDS`].

use std::str::FromStr;

use super::shared::{NamedPoller, ProbeStatus, Timing, WatchError};
use super::{aws, azure, gce};

/// A cloud whose metadata service announces terminations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cloud {
    /// Google Compute Engine (and Cloud TPU VMs).
    Gce,
    /// Amazon EC2 (Spot).
    Aws,
    /// Azure virtual machines (Spot, scheduled events).
    Azure,
}

/// What the I/O shell (`watch.rs`) and the binding ask of one cloud.
pub(super) struct Parts {
    cloud: Cloud,
    /// Its name in Python (`Environment.cloud`) and in its threads' names.
    name: &'static str,
    /// The pollers watching the cloud, each with its thread's name.
    pub pollers: fn(Timing) -> Vec<NamedPoller>,
    /// Whether the cloud's metadata service answers as that cloud's does.
    pub probe: fn(&mut ProbeStatus<'_>) -> bool,
}

/// Every cloud, in the order of its variants (checked by a test below).
const CLOUDS: [Parts; 3] = [
    Parts {
        cloud: Cloud::Gce,
        name: "gce",
        pollers: gce::pollers,
        probe: gce::probe,
    },
    Parts {
        cloud: Cloud::Aws,
        name: "aws",
        pollers: aws::pollers,
        probe: aws::probe,
    },
    Parts {
        cloud: Cloud::Azure,
        name: "azure",
        pollers: azure::pollers,
        probe: azure::probe,
    },
];

impl Cloud {
    /// Every cloud.
    pub fn all() -> impl Iterator<Item = Cloud> {
        CLOUDS.iter().map(|parts| parts.cloud)
    }

    /// Its row of [`CLOUDS`].
    pub(super) fn parts(self) -> &'static Parts {
        &CLOUDS[self as usize]
    }

    /// `"gce"`, `"aws"` or `"azure"`.
    #[must_use]
    pub fn name(self) -> &'static str {
        self.parts().name
    }
}

impl FromStr for Cloud {
    type Err = WatchError;

    fn from_str(s: &str) -> Result<Self, WatchError> {
        Cloud::all()
            .find(|cloud| cloud.name() == s)
            .ok_or_else(|| WatchError::UnknownCloud(s.chars().take(64).collect()))
    }
}

/// The pollers watching `cloud`, each with its thread's name.
#[must_use]
pub fn pollers(cloud: Cloud, timing: Timing) -> Vec<NamedPoller> {
    (cloud.parts().pollers)(timing)
}

#[cfg(test)]
mod tests {
    use super::{pollers, Cloud, CLOUDS};
    use crate::sources::shared::Timing;

    #[test]
    fn every_cloud_has_its_row_its_name_its_pollers_named_after_it_and_a_probe() {
        for (i, parts) in CLOUDS.iter().enumerate() {
            assert_eq!(parts.cloud as usize, i, "{:?} out of order", parts.cloud);
        }
        assert_eq!(Cloud::all().map(Cloud::name).collect::<Vec<_>>(), ["gce", "aws", "azure"]);
        for cloud in Cloud::all() {
            assert_eq!(cloud.name().parse::<Cloud>().ok(), Some(cloud));
            let watching = pollers(cloud, Timing::new(5.0, 1.0).unwrap());
            assert!(!watching.is_empty(), "{cloud:?}");
            for (name, _) in &watching {
                assert!(name.starts_with(&format!("tfh-{}-", cloud.name())), "{name}");
            }
            // No answer at all: every cloud's probe says no.
            assert!(!(cloud.parts().probe)(&mut |_, _, _| None), "{cloud:?}");
        }
        assert!("GCE".parse::<Cloud>().is_err());
    }
}
