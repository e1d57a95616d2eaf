//! The disk figures a runner attests (`probe.disk`) and a pool's warning on them.
//!
//! The runner's own thresholds fail its probe (the agent's `--min-free-disk`); what is here is
//! what the service does with the figures: keep them as sent, show them, and, where a pool asks
//! for it, warn while the runner is still above the line that would fail it, so an operator
//! sees a disk filling before the first refusal. A warning never refuses: the status stays
//! what the verdict says.

use serde::{Deserialize, Serialize};

/// At most this many filesystems per attestation (the reference agent sends two).
pub const MAX_DISKS: usize = 8;

/// One filesystem a runner measured, as its attestation says it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DiskFigure {
    /// The directory measured, cleaned (see `domain::text`).
    pub path: String,
    /// What the directory is to the runner: `storage` (the runtime's), `work_dir`, or what
    /// another client calls it; cleaned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    pub free_bytes: u64,
    pub total_bytes: u64,
    pub free_inodes: u64,
    /// 0 where the filesystem has no fixed number of inodes.
    pub total_inodes: u64,
}

impl DiskFigure {
    /// The free share of inodes in whole percent, rounded down; `None` without a fixed number.
    pub fn free_inodes_percent(&self) -> Option<u64> {
        (self.total_inodes > 0)
            .then(|| (u128::from(self.free_inodes) * 100 / u128::from(self.total_inodes)) as u64)
    }
}

/// A pool's warning line: below either, a runner is shown and counted as warned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DiskWarning {
    /// Warn when fewer bytes than this are free on any attested filesystem.
    #[serde(default)]
    pub min_free_bytes: Option<u64>,
    /// Warn when less than this percentage of any attested filesystem's inodes is free.
    #[serde(default)]
    pub min_free_inodes_percent: Option<u8>,
}

impl DiskWarning {
    /// Whether the warning is well formed: a percentage of at most 100, and a byte count the
    /// store's signed 64-bit columns hold (the document's maximum, 2^63 - 1).
    pub fn check(&self) -> Result<(), String> {
        if self
            .min_free_bytes
            .is_some_and(|b| i64::try_from(b).is_err())
        {
            return Err(format!(
                "disk_warning.min_free_bytes must be 0-{}",
                i64::MAX
            ));
        }
        match self.min_free_inodes_percent {
            Some(p) if p > 100 => Err("disk_warning.min_free_inodes_percent must be 0-100".into()),
            _ => Ok(()),
        }
    }

    /// What is short on `disks`, one sentence for the first filesystem under the line; `None`
    /// when all are above it.
    pub fn judge(&self, disks: &[DiskFigure]) -> Option<String> {
        disks.iter().find_map(|d| {
            if let Some(min) = self.min_free_bytes
                && d.free_bytes < min
            {
                return Some(format!(
                    "disk: {} free on {}, the pool warns under {}",
                    human_bytes(d.free_bytes),
                    d.path,
                    human_bytes(min)
                ));
            }
            match (self.min_free_inodes_percent, d.free_inodes_percent()) {
                (Some(min), Some(free)) if free < u64::from(min) => Some(format!(
                    "disk: {free}% of inodes free on {}, the pool warns under {min}%",
                    d.path
                )),
                _ => None,
            }
        })
    }
}

/// `3.1 GiB`, `512 MiB`, `17 B`: binary units, one decimal when it is not zero, rounded down
/// so that a figure never claims more space than there is.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    let tenths = (value * 10.0).floor() / 10.0;
    if unit == 0 || tenths.fract() == 0.0 {
        format!("{tenths:.0} {}", UNITS[unit])
    } else {
        format!("{tenths:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(free_bytes: u64, free_inodes: u64, total_inodes: u64) -> DiskFigure {
        DiskFigure {
            path: "/srv/work".into(),
            role: Some("work_dir".into()),
            free_bytes,
            total_bytes: 100 << 30,
            free_inodes,
            total_inodes,
        }
    }

    #[test]
    fn a_warning_line_is_within_what_the_store_holds() {
        let line = |bytes: u64, percent: u8| DiskWarning {
            min_free_bytes: Some(bytes),
            min_free_inodes_percent: Some(percent),
        };
        assert!(line(i64::MAX as u64, 100).check().is_ok());
        assert!(line(i64::MAX as u64 + 1, 5).check().is_err());
        assert!(line(0, 101).check().is_err());
    }

    #[test]
    fn bytes_read_as_people_read_them() {
        assert_eq!(human_bytes(17), "17 B");
        assert_eq!(human_bytes(3_330_000_000), "3.1 GiB");
        assert_eq!(human_bytes(5 << 30), "5 GiB");
        assert_eq!(human_bytes((1 << 30) - 1), "1023.9 MiB");
    }

    #[test]
    fn a_pool_warns_under_its_line_and_not_above_it() {
        let warn = DiskWarning {
            min_free_bytes: Some(20 << 30),
            min_free_inodes_percent: Some(10),
        };
        assert_eq!(warn.judge(&[disk(30 << 30, 50, 100)]), None);
        assert_eq!(
            warn.judge(&[disk(30 << 30, 50, 100), disk(12 << 30, 50, 100)])
                .as_deref(),
            Some("disk: 12 GiB free on /srv/work, the pool warns under 20 GiB")
        );
        assert_eq!(
            warn.judge(&[disk(30 << 30, 9, 100)]).as_deref(),
            Some("disk: 9% of inodes free on /srv/work, the pool warns under 10%")
        );
        assert_eq!(warn.judge(&[disk(30 << 30, 0, 0)]), None, "no inode count");
        assert_eq!(warn.judge(&[]), None);
        let bytes_only = DiskWarning {
            min_free_bytes: Some(1),
            min_free_inodes_percent: None,
        };
        assert_eq!(bytes_only.judge(&[disk(1, 0, 100)]), None);
        assert!(
            DiskWarning {
                min_free_bytes: None,
                min_free_inodes_percent: Some(101)
            }
            .check()
            .is_err()
        );
    }
}
