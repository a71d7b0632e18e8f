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
