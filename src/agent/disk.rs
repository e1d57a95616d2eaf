//! The probe's disk figures: free space and free inodes of the runtime's storage and of the
//! runner's work directory, and the thresholds below which the probe fails.
//!
//! Why in the probe: a full disk passes `podman info` and then fails every job at its first
//! pull or checkout. The figure that matters is the space the runner's user may still write
//! (`statvfs`'s `f_bavail`, not `f_bfree`, which counts root's reserve), and inodes run out on
//! their own (a cache of many small files), so both are measured and either can fail the probe,
//! in a sentence that names the path, what is free and what is needed.

pub use crate::domain::disk::human_bytes;
use std::fmt;
use std::path::Path;

/// What a measured directory is to the runner, as the attestation names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The container runtime's storage (podman's `graphRoot`, docker's `DockerRootDir`).
    Storage,
    /// The runner's work directory (`--work-dir`).
    WorkDir,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Storage => "storage",
            Role::WorkDir => "work_dir",
        }
    }
}

/// One directory's filesystem, measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskFigures {
    pub path: String,
    pub role: Role,
    /// Bytes the runner's user may still write (`f_bavail × f_frsize`).
    pub free_bytes: u64,
    pub total_bytes: u64,
    /// Inodes the runner's user may still take (`f_favail`).
    pub free_inodes: u64,
    /// 0 on filesystems without a fixed number of inodes (btrfs), where none can run out.
    pub total_inodes: u64,
}

/// Measures the filesystem `path` is on.
pub fn measure(path: &Path, role: Role) -> Result<DiskFigures, String> {
    let s = rustix::fs::statvfs(path).map_err(|e| {
        format!(
            "disk: cannot measure {} ({}): {e}",
            path.display(),
            role.as_str()
        )
    })?;
    Ok(DiskFigures {
        path: path.display().to_string(),
        role,
        free_bytes: s.f_bavail.saturating_mul(s.f_frsize),
        total_bytes: s.f_blocks.saturating_mul(s.f_frsize),
        free_inodes: s.f_favail,
        total_inodes: s.f_files,
    })
}

/// A size as an operator writes it: `5GiB`, `500MB`, `1.5 TiB` or a number of bytes. It keeps
/// its spelling, so that a failure says `needs 500 MB`, not a conversion of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Size {
    pub bytes: u64,
    shown: String,
}

impl Size {
    pub fn from_bytes(bytes: u64) -> Size {
        Size {
            bytes,
            shown: human_bytes(bytes),
        }
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl std::str::FromStr for Size {
    type Err = String;
    fn from_str(s: &str) -> Result<Size, String> {
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (number, unit) = (&t[..split], t[split..].trim());
        let bad = || format!("{s:?}: expected a size such as 5GiB, 500MB or a number of bytes");
        let value: f64 = number.parse().map_err(|_| bad())?;
        let factor: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "kb" | "k" => 1_000,
            "mb" | "m" => 1_000_000,
            "gb" | "g" => 1_000_000_000,
            "tb" | "t" => 1_000_000_000_000,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            "tib" => 1 << 40,
            _ => return Err(bad()),
        };
        let bytes = value * factor as f64;
        if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
            return Err(bad());
        }
        let shown = if unit.is_empty() || unit.eq_ignore_ascii_case("b") {
            human_bytes(bytes as u64)
        } else {
            format!("{number} {unit}")
        };
        Ok(Size {
            bytes: bytes.round() as u64,
            shown,
        })
    }
}

/// The least a runner needs free to take a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub min_free: Size,
    /// Of the filesystem's inodes, in percent (0–100).
    pub min_free_inodes_percent: u8,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            min_free: Size::from_bytes(5 << 30),
            min_free_inodes_percent: 5,
        }
    }
}

impl Thresholds {
    /// Why `figures` are too little to take a job, in words an operator acts on; `None` when
    /// they are enough.
    pub fn shortfall(&self, d: &DiskFigures) -> Option<String> {
        if d.free_bytes < self.min_free.bytes {
            return Some(format!(
                "disk: {} free on {}, needs {}",
                human_bytes(d.free_bytes),
                d.path,
                self.min_free
            ));
        }
        // Compared in integers: free / total < percent / 100.
        if d.total_inodes > 0
            && u128::from(d.free_inodes) * 100
                < u128::from(d.total_inodes) * u128::from(self.min_free_inodes_percent)
        {
            return Some(format!(
                "disk: {}% of inodes free on {} ({} of {}), needs {}%",
                inode_percent(d),
                d.path,
                d.free_inodes,
                d.total_inodes,
                self.min_free_inodes_percent
            ));
        }
        None
    }
}

/// The free share of inodes in whole percent, rounded down (so 4.9 % shows as 4 %).
fn inode_percent(d: &DiskFigures) -> u64 {
    (u128::from(d.free_inodes) * 100 / u128::from(d.total_inodes.max(1))) as u64
}

/// `--min-free-inodes`: a whole percentage from 0 to 100.
pub fn parse_percent(s: &str) -> Result<u8, String> {
    let t = s.trim().trim_end_matches('%');
    match t.parse::<u8>() {
        Ok(p) if p <= 100 => Ok(p),
        _ => Err(format!("{s:?}: expected a whole percentage from 0 to 100")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(free_bytes: u64, free_inodes: u64, total_inodes: u64) -> DiskFigures {
        DiskFigures {
            path: "/var/lib/containers".into(),
            role: Role::Storage,
            free_bytes,
            total_bytes: 100 << 30,
            free_inodes,
            total_inodes,
        }
    }

    #[test]
    fn sizes_as_operators_write_them() {
        let s: Size = "5GiB".parse().unwrap();
        assert_eq!((s.bytes, s.to_string()), (5 << 30, "5 GiB".into()));
        let s: Size = "500MB".parse().unwrap();
        assert_eq!((s.bytes, s.to_string()), (500_000_000, "500 MB".into()));
        let s: Size = "1.5 TiB".parse().unwrap();
        assert_eq!(s.bytes, 3 << 39);
        let s: Size = "1048576".parse().unwrap();
        assert_eq!((s.bytes, s.to_string()), (1 << 20, "1 MiB".into()));
        for bad in ["", "GiB", "5 parsecs", "-1GiB", "1e400"] {
            assert!(bad.parse::<Size>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn too_little_space_or_too_few_inodes_is_said_with_the_path_and_the_need() {
        let t = Thresholds::default();
        assert_eq!(
            t.shortfall(&figures(3_330_000_000, 50, 100)).as_deref(),
            Some("disk: 3.1 GiB free on /var/lib/containers, needs 5 GiB")
        );
        assert_eq!(t.shortfall(&figures(5 << 30, 5, 100)), None);
        assert_eq!(
            t.shortfall(&figures(6 << 30, 49, 1000)).as_deref(),
            Some("disk: 4% of inodes free on /var/lib/containers (49 of 1000), needs 5%")
        );
        // No fixed inode count: nothing to run out of.
        assert_eq!(t.shortfall(&figures(6 << 30, 0, 0)), None);
        let none = Thresholds {
            min_free: Size::from_bytes(0),
            min_free_inodes_percent: 0,
        };
        assert_eq!(none.shortfall(&figures(0, 0, 100)), None);
    }

    #[test]
    fn percentages_are_whole_and_at_most_100() {
        assert_eq!(parse_percent("5"), Ok(5));
        assert_eq!(parse_percent("10%"), Ok(10));
        assert!(parse_percent("101").is_err());
        assert!(parse_percent("2.5").is_err());
    }

    #[test]
    fn a_real_directory_is_measured() {
        let dir = tempfile::tempdir().unwrap();
        let d = measure(dir.path(), Role::WorkDir).unwrap();
        assert!(d.total_bytes > 0 && d.free_bytes <= d.total_bytes, "{d:?}");
        assert!(
            measure(&dir.path().join("absent"), Role::WorkDir)
                .unwrap_err()
                .starts_with("disk: cannot measure ")
        );
    }
}
