//! The clouds, in one table, Rust's and Python's: each cloud's name, the
//! pollers that watch it, the request that detects it, where its metadata
//! service is (its variable, its default base), the sysfs lines that name its
//! machines, and what a process on it gets by default (its exit code after the
//! save, its grace period). Python's platforms
//! (`_platforms/clouds.py`) serve every cloud from this table
//! ([`Cloud::row`]). Nothing else names every cloud: a new cloud is a file of
//! its own (its poller, `pollers` and `probe`), a [`Cloud`] variant and its
//! row in [`CLOUDS`].

use std::io::Read;
use std::path::Path;
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
    /// The variable that names its metadata service.
    variable: &'static str,
    /// Whether [`Parts::variable`] is `host[:port]` (TensorFlow's
    /// `GCE_METADATA_IP`) rather than `[http://]host[:port]`.
    host_port: bool,
    /// Its metadata service when the variable is unset, `http://host`.
    default_base: &'static str,
    /// When its probe is made without the variable: `None` always (TensorFlow's
    /// GCE detection), else only when one of these alternatives holds, each a
    /// list of sysfs lines that must all match.
    named_by: Option<&'static [&'static [Line]]>,
}

/// One line of sysfs (`/sys/<path>`, its first line stripped) that names a
/// cloud's machines.
#[derive(Clone, Copy, Debug)]
pub struct Line {
    /// Below `/sys`.
    path: &'static str,
    /// How the line is compared with `text`.
    test: Test,
    text: &'static str,
}

/// How a [`Line`] is compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Test {
    /// Equal.
    Is,
    /// Contains the text, in any case.
    Contains,
    /// Starts with the text, in any case.
    StartsWith,
}

impl Test {
    /// Its name in Python's table.
    fn name(self) -> &'static str {
        match self {
            Test::Is => "is",
            Test::Contains => "contains",
            Test::StartsWith => "starts",
        }
    }
}

const fn line(path: &'static str, test: Test, text: &'static str) -> Line {
    Line { path, test, text }
}

/// An EC2 machine: the DMI tables name Amazon, or (Xen guests on older
/// instance types) the hypervisor's uuid starts with `ec2`.
const AWS_NAMED_BY: &[&[Line]] = &[
    &[line("class/dmi/id/sys_vendor", Test::Contains, "amazon")],
    &[line("class/dmi/id/bios_vendor", Test::Contains, "amazon")],
    &[line("class/dmi/id/board_vendor", Test::Contains, "amazon")],
    &[line("class/dmi/id/product_name", Test::Contains, "amazon")],
    &[line("class/dmi/id/bios_version", Test::Contains, "amazon")],
    &[line("hypervisor/uuid", Test::StartsWith, "ec2")],
];

/// An Azure VM: its chassis asset tag (Microsoft's documented way to tell
/// Azure VMs), or Microsoft's "Virtual Machine".
const AZURE_NAMED_BY: &[&[Line]] = &[
    &[line("class/dmi/id/chassis_asset_tag", Test::Is, "7783-7084-3265-9085-8269-3286-77")],
    &[
        line("class/dmi/id/sys_vendor", Test::Is, "Microsoft Corporation"),
        line("class/dmi/id/product_name", Test::Is, "Virtual Machine"),
    ],
];

/// Where AWS and Azure serve instance metadata (link-local, no DNS).
const LINK_LOCAL: &str = "http://169.254.169.254";

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
        variable: "GCE_METADATA_IP",
        host_port: true,
        default_base: "http://metadata.google.internal",
        named_by: None,
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
        variable: "TF_FAILURE_HANDLING_AWS_METADATA_URL",
        host_port: false,
        default_base: LINK_LOCAL,
        named_by: Some(AWS_NAMED_BY),
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
        variable: "TF_FAILURE_HANDLING_AZURE_METADATA_URL",
        host_port: false,
        default_base: LINK_LOCAL,
        named_by: Some(AZURE_NAMED_BY),
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

/// A cloud's row as Python's platforms read it ([`Cloud::row`]).
#[derive(Clone, Copy, Debug)]
pub struct Row {
    pub name: &'static str,
    /// The variable that names its metadata service, and whether it is
    /// `host[:port]` (TensorFlow's `GCE_METADATA_IP`) rather than
    /// `[http://]host[:port]`.
    pub variable: (&'static str, bool),
    /// Its metadata service when the variable is unset.
    pub default_base: &'static str,
    pub exit_code: i32,
    /// Its default grace period on a GPU machine, and on others.
    pub grace_period: (f64, f64),
}

impl Line {
    /// `(path below /sys, "is" | "contains" | "starts", text)`.
    #[must_use]
    pub fn parts(&self) -> (&'static str, &'static str, &'static str) {
        (self.path, self.test.name(), self.text)
    }

    /// Whether the line below `sysfs` (its first line, stripped; an empty one
    /// when it cannot be read) matches.
    fn holds(&self, sysfs: &Path) -> bool {
        let line = first_line(&sysfs.join(self.path)).unwrap_or_default();
        match self.test {
            Test::Is => line == self.text,
            Test::Contains => line.to_lowercase().contains(self.text),
            Test::StartsWith => line.to_lowercase().starts_with(self.text),
        }
    }
}

/// The most of a sysfs line that is read.
const LINE_MAX: usize = 4096;

/// The stripped first line of a small file (at most [`LINE_MAX`] bytes of it,
/// undecodable bytes replaced); None when it cannot be read.
fn first_line(path: &Path) -> Option<String> {
    let mut bytes = Vec::new();
    std::fs::File::open(path).ok()?.take(LINE_MAX as u64).read_to_end(&mut bytes).ok()?;
    let line = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    Some(String::from_utf8_lossy(line).trim().to_owned())
}

impl Cloud {
    /// Whether the sysfs lines below `sysfs` (the kernel's `/sys`, or a
    /// test's copy) name this cloud's machines: any one of its row's
    /// alternatives whose lines all match. True when its row names none
    /// (TensorFlow's GCE: probed always).
    #[must_use]
    pub fn named(self, sysfs: &Path) -> bool {
        match self.parts().named_by {
            None => true,
            Some(alternatives) => alternatives.iter().any(|lines| lines.iter().all(|line| line.holds(sysfs))),
        }
    }

    /// Its row, for Python's platforms.
    #[must_use]
    pub fn row(self) -> Row {
        let parts = self.parts();
        Row {
            name: parts.name,
            variable: (parts.variable, parts.host_port),
            default_base: parts.default_base,
            exit_code: parts.exit_code,
            grace_period: (parts.grace_period.gpu, parts.grace_period.other),
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
    use super::{pollers, Cloud, CLOUDS, DEFAULT_EXIT_CODE, GCE_EXIT_CODE};
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
        // (cloud, exit code, grace period on a GPU machine, on others)
        let rows: &[(Cloud, i32, f64, f64)] = &[
            (Cloud::Gce, GCE_EXIT_CODE, 3600.0, 0.0),
            (Cloud::Aws, DEFAULT_EXIT_CODE, 120.0, 120.0),
            (Cloud::Azure, DEFAULT_EXIT_CODE, 30.0, 30.0),
        ];
        for &(cloud, exit_code, gpu, other) in rows {
            let row = cloud.row();
            assert_eq!((row.exit_code, row.grace_period), (exit_code, (gpu, other)), "{cloud:?}");
        }
        assert_eq!((DEFAULT_EXIT_CODE, GCE_EXIT_CODE), (42, 128 + 15));
    }

    #[test]
    fn metadata_services_and_the_machines_each_cloud_names() {
        // (cloud, variable, host[:port], default base, probed without its variable)
        let rows = [
            (Cloud::Gce, "GCE_METADATA_IP", true, "http://metadata.google.internal", None),
            (
                Cloud::Aws,
                "TF_FAILURE_HANDLING_AWS_METADATA_URL",
                false,
                "http://169.254.169.254",
                Some(6),
            ),
            (
                Cloud::Azure,
                "TF_FAILURE_HANDLING_AZURE_METADATA_URL",
                false,
                "http://169.254.169.254",
                Some(2),
            ),
        ];
        for (cloud, variable, host_port, base, alternatives) in rows {
            let row = cloud.row();
            assert_eq!(
                (row.name, row.variable, row.default_base),
                (cloud.name(), (variable, host_port), base)
            );
            let named_by = cloud.parts().named_by;
            assert_eq!(named_by.map(<[_]>::len), alternatives, "{cloud:?}");
            for lines in named_by.unwrap_or_default() {
                assert!(!lines.is_empty());
                for line in *lines {
                    let (path, test, text) = line.parts();
                    assert!(!path.starts_with('/') && !text.is_empty(), "{path}");
                    // A test in any case compares with the line in lower case.
                    assert!(test == "is" || text == text.to_lowercase(), "{text}");
                }
            }
        }
    }

    #[test]
    fn the_sysfs_lines_name_a_cloud_s_machines() {
        let root = std::env::temp_dir().join(format!("tfh-sysfs-{}", std::process::id()));
        let write = |path: &str, text: &str| {
            let file = root.join(path);
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(file, text).unwrap();
        };
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        // Nothing readable: only the cloud probed always.
        assert!(Cloud::Gce.named(&root));
        assert!(!Cloud::Aws.named(&root) && !Cloud::Azure.named(&root));
        // "contains" and "starts" in any case, on the first line only.
        write("class/dmi/id/sys_vendor", "  Amazon EC2\nother\n");
        assert!(Cloud::Aws.named(&root) && !Cloud::Azure.named(&root));
        std::fs::remove_file(root.join("class/dmi/id/sys_vendor")).unwrap();
        write("hypervisor/uuid", "EC2abcd\n");
        assert!(Cloud::Aws.named(&root));
        write("hypervisor/uuid", "xec2\n");
        assert!(!Cloud::Aws.named(&root));
        // "is": exact; an alternative needs all its lines.
        write("class/dmi/id/sys_vendor", "Microsoft Corporation\n");
        assert!(!Cloud::Azure.named(&root));
        write("class/dmi/id/product_name", "Virtual Machine\n");
        assert!(Cloud::Azure.named(&root));
        write("class/dmi/id/product_name", "virtual machine\n");
        assert!(!Cloud::Azure.named(&root));
        write("class/dmi/id/chassis_asset_tag", "7783-7084-3265-9085-8269-3286-77\n");
        assert!(Cloud::Azure.named(&root));
        let _ = std::fs::remove_dir_all(&root);
    }
}
