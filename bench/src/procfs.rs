//! What the bench reads of a process from `/proc`: its peak resident set and its CPU time.

use anyhow::Context;

/// CPU seconds (user + system) used so far by the coordinator process and by this one.
#[derive(Debug, Clone, Copy)]
pub struct CpuTimes {
    pub coordinator: f64,
    pub workers: f64,
}

impl CpuTimes {
    pub fn read(coordinator: u32) -> anyhow::Result<Self> {
        Ok(Self {
            coordinator: cpu_seconds(&coordinator.to_string())?,
            workers: cpu_seconds("self")?,
        })
    }
}

/// utime + stime of a process, from `/proc/<pid>/stat` (fields 14 and 15, after the
/// parenthesised command name), in clock ticks of USER_HZ, which Linux fixes at 100.
fn cpu_seconds(pid: &str) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after_name = stat.rsplit_once(')').context("no command name")?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // after_name starts at field 3 (state), so fields 14 and 15 are at 11 and 12.
    let ticks: u64 = fields.get(11).context("no utime")?.parse::<u64>()?
        + fields.get(12).context("no stime")?.parse::<u64>()?;
    Ok(ticks as f64 / 100.0)
}

/// Peak resident set (VmHWM) of a process, in KiB.
pub fn peak_rss_kb(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmHWM")
}
