//! Where a phase spends the machine's CPU: the CPU time Linux accounted to each thread of this
//! process (by name), of the service's process when it runs apart (`--server-pid`), and of
//! every PostgreSQL process, over exactly the phase's timed window, as cores used and as
//! microseconds per request; what none of them used of the machine's cores is idle.
//!
//! A rate moves with the machine's other load and with how fast its cores happen to run; the
//! CPU a request costs moves far less, and idle cores beside a rate short of its goal say the
//! limit is a wait (a round's chain of round trips), not the work (docs/BENCHMARKS.md, "Where
//! the cores go during the attestation phases"). In-process, the bench's clients share the
//! `tokio-rt-worker` threads with the service's handlers, so those threads' figure is both
//! sides of each request.
//!
//! The times are `/proc/…/schedstat`'s first field (nanoseconds on a core); where Linux does not
//! keep it, there is no figure.

use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// One group of threads' share of a phase.
#[derive(Clone, Debug, Serialize)]
pub struct GroupCpu {
    /// A thread name of this process, `service:` and a thread name of the service's process,
    /// or `postgres` (all its processes: backends, WAL writer, checkpointer).
    pub group: String,
    /// Cores the group kept busy on average over the phase.
    pub cores: f64,
    /// Its CPU time per successful request, in microseconds.
    pub us_per_request: f64,
}

/// Where a phase's CPU went.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseCpu {
    /// The machine's cores.
    pub cores: usize,
    /// Cores every group together kept busy on average.
    pub used_cores: f64,
    /// Cores none of them used (the machine's other processes may have).
    pub idle_cores: f64,
    /// All groups' CPU time per successful request, in microseconds.
    pub us_per_request: f64,
    /// The groups, the busiest first.
    pub groups: Vec<GroupCpu>,
}

/// CPU time so far of each thread (or PostgreSQL process), in nanoseconds, by its group and
/// its `/proc` path, and when it was read. Kept by thread, not summed by group: threads come
/// and go during a phase (the runtime's blocking threads end after a while idle), and a group's
/// sum would drop with each that ended.
pub struct Snapshot {
    at: Instant,
    ns: BTreeMap<(String, String), u64>,
}

impl Snapshot {
    /// Reads every group now, `service`'s threads too (the service's process when it is not
    /// this one); `None` where Linux keeps no `schedstat`.
    pub fn take(service: Option<u32>) -> Option<Snapshot> {
        let mut ns = BTreeMap::new();
        threads_by_name("/proc/self/task", "", &mut ns)?;
        if let Some(pid) = service {
            threads_by_name(&format!("/proc/{pid}/task"), "service:", &mut ns)?;
        }
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let name = entry.file_name();
            let Some(pid) = name
                .to_str()
                .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
            else {
                continue;
            };
            let dir = format!("/proc/{pid}");
            if comm(&dir).as_deref() == Some("postgres")
                && let Some(used) = schedstat_ns(&format!("{dir}/schedstat"))
            {
                ns.insert(("postgres".to_string(), dir), used);
            }
        }
        Some(Snapshot {
            at: Instant::now(),
            ns,
        })
    }

    /// What each group used from `self` until `later`, for `requests` successful requests.
    pub fn until(&self, later: &Snapshot, requests: u64) -> PhaseCpu {
        let seconds = later.at.duration_since(self.at).as_secs_f64().max(1e-9);
        let per_request = |ns: u64| ns as f64 / 1000.0 / requests.max(1) as f64;
        // Each thread's time in the window (all of it for one that began in it), by group. One
        // that ended in it took its time with it, uncounted.
        let mut used: BTreeMap<&str, u64> = BTreeMap::new();
        for (key, &after) in &later.ns {
            let before = self.ns.get(key).copied().unwrap_or(0);
            *used.entry(key.0.as_str()).or_default() += after.saturating_sub(before);
        }
        let mut groups: Vec<GroupCpu> = used
            .into_iter()
            .map(|(group, used)| GroupCpu {
                group: group.to_string(),
                cores: used as f64 / 1e9 / seconds,
                us_per_request: per_request(used),
            })
            .filter(|g| g.cores >= 0.005)
            .collect();
        groups.sort_by(|a, b| b.cores.total_cmp(&a.cores));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let used_cores: f64 = groups.iter().map(|g| g.cores).sum();
        PhaseCpu {
            cores,
            used_cores,
            idle_cores: (cores as f64 - used_cores).max(0.0),
            us_per_request: groups.iter().map(|g| g.us_per_request).sum(),
            groups,
        }
    }
}

/// The CPU time of every thread under `tasks` (a `/proc/…/task` directory), in nanoseconds.
pub fn task_cpu_ns(tasks: &str) -> Option<u64> {
    let mut by_thread = BTreeMap::new();
    threads_by_name(tasks, "", &mut by_thread)?;
    Some(by_thread.values().sum())
}

/// Puts the CPU time of every thread under `tasks` into `ns`, its group `prefix` and its name.
fn threads_by_name(
    tasks: &str,
    prefix: &str,
    ns: &mut BTreeMap<(String, String), u64>,
) -> Option<()> {
    // No figure at all where Linux keeps none (not even this thread's).
    std::fs::metadata("/proc/thread-self/schedstat").ok()?;
    for task in std::fs::read_dir(tasks).ok()?.flatten() {
        let path = task.path();
        // A thread that ended meanwhile has nothing more to count.
        let (Some(name), Some(used)) = (
            comm(&path.to_string_lossy()),
            schedstat_ns(&path.join("schedstat").to_string_lossy()),
        ) else {
            continue;
        };
        ns.insert(
            (
                format!("{prefix}{name}"),
                path.to_string_lossy().into_owned(),
            ),
            used,
        );
    }
    Some(())
}

fn comm(dir: &str) -> Option<String> {
    Some(
        std::fs::read_to_string(format!("{dir}/comm"))
            .ok()?
            .trim()
            .to_string(),
    )
}

fn schedstat_ns(path: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(at: Instant, threads: &[(&str, &str, u64)]) -> Snapshot {
        Snapshot {
            at,
            ns: threads
                .iter()
                .map(|&(group, path, ns)| ((group.to_string(), path.to_string()), ns))
                .collect(),
        }
    }

    #[test]
    fn a_group_counts_its_threads_time_in_the_window_whichever_came_or_went() {
        let start = Instant::now();
        let before = snapshot(
            start,
            &[
                ("worker", "/proc/self/task/1", 100_000_000),
                // Ends during the phase, with more time than the others have.
                ("worker", "/proc/self/task/2", 900_000_000),
                ("postgres", "/proc/7", 0),
            ],
        );
        let after = snapshot(
            start + std::time::Duration::from_secs(1),
            &[
                ("worker", "/proc/self/task/1", 400_000_000),
                // Began during the phase: all its time is the phase's.
                ("worker", "/proc/self/task/3", 100_000_000),
                ("postgres", "/proc/7", 250_000_000),
                ("postgres", "/proc/8", 250_000_000),
            ],
        );
        let cpu = before.until(&after, 1000);
        let group = |name: &str| cpu.groups.iter().find(|g| g.group == name).unwrap();
        assert!((group("postgres").cores - 0.5).abs() < 1e-9, "{cpu:?}");
        assert!((group("worker").cores - 0.4).abs() < 1e-9, "{cpu:?}");
        assert!(
            (group("worker").us_per_request - 400.0).abs() < 1e-6,
            "{cpu:?}"
        );
        assert_eq!(cpu.groups[0].group, "postgres", "the busiest first");
        assert!((cpu.us_per_request - 900.0).abs() < 1e-6, "{cpu:?}");
    }

    #[test]
    fn a_thread_that_works_is_counted_by_its_name_and_the_idle_is_what_is_left() {
        let Some(before) = Snapshot::take(None) else {
            eprintln!("skipped: this kernel keeps no /proc/…/schedstat");
            return;
        };
        // The thread stays until the second reading: one that ended takes its time with it.
        let (spun, stay) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
        let spinner = std::thread::Builder::new()
            .name("cpu-test-spin".into())
            .spawn(move || {
                let until = Instant::now() + std::time::Duration::from_millis(300);
                let mut x = 0u64;
                while Instant::now() < until {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
                spun.0.send(()).unwrap();
                stay.1.recv().ok();
            })
            .unwrap();
        spun.1.recv().unwrap();
        let after = Snapshot::take(None).unwrap();
        drop(stay.0);
        spinner.join().unwrap();
        let cpu = before.until(&after, 100);
        let spin = cpu
            .groups
            .iter()
            .find(|g| g.group == "cpu-test-spin")
            .expect("the spinning thread is a group of its own");
        // It spun for 300 ms of a window a little longer: most of a core, on a busy machine
        // somewhat less.
        assert!(spin.cores > 0.2 && spin.cores <= 1.05, "{cpu:?}");
        assert!(
            (spin.us_per_request - spin.cores * (after.at - before.at).as_secs_f64() * 1e4).abs()
                < 1.0,
            "{cpu:?}"
        );
        assert!(
            (cpu.used_cores + cpu.idle_cores - cpu.cores as f64).abs() < 1e-9
                || cpu.idle_cores == 0.0,
            "{cpu:?}"
        );
        assert!(cpu.groups.windows(2).all(|w| w[0].cores >= w[1].cores));
    }
}
