//! What the service wrote to storage, read from Linux's `/proc/PID/io` (`write_bytes`: the
//! bytes it caused to be sent to the storage layer, counted when pages are dirtied): the
//! in-process service's own, or `--server-pid`'s. SQLite's WAL frames and their checkpoints
//! are counted there; PostgreSQL's writes are its own processes', so nothing is reported for
//! it.

/// The process's `write_bytes` so far; `None` where `/proc` does not say (not Linux, or
/// another user's process).
pub fn written_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/io"),
        None => "/proc/self/io".into(),
    };
    let io = std::fs::read_to_string(path).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_process_has_a_write_count_on_linux() {
        if cfg!(target_os = "linux") {
            assert!(super::written_bytes(None).is_some());
        }
    }
}
