//! A process's resource figures from `/proc`, as the benchmarks print them.

use std::time::Duration;

/// A memory figure of process `pid` in KiB from `/proc/<pid>/status`:
/// `VmHWM` the peak resident set, `VmRSS` the current one (with or without
/// the trailing colon).
pub fn memory_kib(pid: u32, field: &str) -> Option<u64> {
    let field = field.trim_end_matches(':');
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The processes whose command line contains `needle`.
pub fn pids_mentioning(needle: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(needle) {
            out.push(pid);
        }
    }
    out
}

/// Kills `owner` (a process that started clusters in `dir`, as `testenv
/// up --dir` does) outright, and waits up to `timeout` until nothing runs
/// that mentions `dir` and the clusters' data (`hub`, `spoke`) is gone:
/// what the clusters' reapers are for.
pub async fn kill_and_wait_reaped(
    owner: &mut std::process::Child,
    dir: &std::path::Path,
    timeout: Duration,
) {
    owner.kill().unwrap();
    owner.wait().unwrap();
    let dir_s = dir.display().to_string();
    crate::wait::until("the reapers to clean up", timeout, || async {
        let left = pids_mentioning(&dir_s);
        let data_left = dir.join("hub").exists() || dir.join("spoke").exists();
        if left.is_empty() && !data_left {
            Ok(())
        } else {
            Err(format!("processes {left:?}, data left: {data_left}"))
        }
    })
    .await;
}

/// User plus system CPU time process `pid` has used so far.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces), from field 3 on.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_secs_f64(ticks as f64 / clock_ticks() as f64))
}

fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let pid = std::process::id();
        assert!(super::memory_kib(pid, "VmRSS").is_some_and(|k| k > 0));
        assert!(super::memory_kib(pid, "VmHWM:").is_some_and(|k| k > 0));
        assert!(super::cpu_time(pid).is_some());
        assert_eq!(super::memory_kib(pid, "NoSuchField"), None);
    }
}
