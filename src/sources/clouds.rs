//! The clouds, in one table: each cloud's name, the pollers that watch it,
//! the request that detects it, and what a process on it gets by default (its
//! exit code after the save, its grace period: [`Cloud::defaults`]). Nothing
//! else names every cloud: a new cloud
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
    /// The exit code of a process that saved after a notice.
    exit_code: i32,
    /// The grace period by default, in seconds, on a GPU machine and on others.
    grace_period: GracePeriods,
}

/// A cloud's default grace periods (`Parts::grace_period`).
struct GracePeriods {
    gpu: f64,
    other: f64,
}

/// The exit code after the save where the platform names no other: Borg's
/// and TensorFlow's default `exit_fn`'s.
pub const DEFAULT_EXIT_CODE: i32 = 42;
/// The exit code GCE's restart tooling recognises (TensorFlow's `gce_exit_fn`).
pub const GCE_EXIT_CODE: i32 = 143;

/// What a process on a cloud gets for what its user left unset.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Defaults {
    /// Its exit code after the save.
    pub exit_code: i32,
    /// Its grace period, in seconds: GCE's GPU machines TensorFlow's hour, AWS
    /// and Azure their notices' lead times, GCE's other machines none.
    pub grace_period: f64,
}

/// Every cloud, in the order of its variants (checked by a test below).
const CLOUDS: [Parts; 3] = [
    Parts {
        cloud: Cloud::Gce,
        name: "gce",
        pollers: gce::pollers,
        probe: gce::probe,
        exit_code: GCE_EXIT_CODE,
        grace_period: GracePeriods {
            gpu: gce::GCE_GPU_GRACE_PERIOD as f64,
            other: 0.0,
        },
    },
    Parts {
        cloud: Cloud::Aws,
        name: "aws",
        pollers: aws::pollers,
        probe: aws::probe,
        exit_code: DEFAULT_EXIT_CODE,
        grace_period: GracePeriods {
            gpu: aws::AWS_GRACE_PERIOD as f64,
            other: aws::AWS_GRACE_PERIOD as f64,
        },
    },
    Parts {
        cloud: Cloud::Azure,
        name: "azure",
        pollers: azure::pollers,
        probe: azure::probe,
        exit_code: DEFAULT_EXIT_CODE,
        grace_period: GracePeriods {
            gpu: azure::AZURE_GRACE_PERIOD as f64,
            other: azure::AZURE_GRACE_PERIOD as f64,
        },
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

    /// What a process on this cloud gets by default, on a GPU machine or not.
    #[must_use]
    pub fn defaults(self, gpu: bool) -> Defaults {
        let parts = self.parts();
        let grace = &parts.grace_period;
        Defaults {
            exit_code: parts.exit_code,
            grace_period: if gpu { grace.gpu } else { grace.other },
        }
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
    use super::{pollers, Cloud, Defaults, CLOUDS, DEFAULT_EXIT_CODE, GCE_EXIT_CODE};
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

    #[test]
    fn defaults_table() {
        // (cloud, GPU machine, exit code, grace period)
        let rows: &[(Cloud, bool, i32, f64)] = &[
            (Cloud::Gce, true, GCE_EXIT_CODE, 3600.0),
            (Cloud::Gce, false, GCE_EXIT_CODE, 0.0),
            (Cloud::Aws, true, DEFAULT_EXIT_CODE, 120.0),
            (Cloud::Aws, false, DEFAULT_EXIT_CODE, 120.0),
            (Cloud::Azure, true, DEFAULT_EXIT_CODE, 30.0),
            (Cloud::Azure, false, DEFAULT_EXIT_CODE, 30.0),
        ];
        for &(cloud, gpu, exit_code, grace_period) in rows {
            assert_eq!(cloud.defaults(gpu), Defaults { exit_code, grace_period }, "{cloud:?} gpu {gpu}");
        }
        assert_eq!((DEFAULT_EXIT_CODE, GCE_EXIT_CODE), (42, 128 + 15));
    }
}
