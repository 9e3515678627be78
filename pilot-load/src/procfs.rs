//! A process's CPU time and memory, read from `/proc/<pid>`.

use std::time::Duration;

/// One reading.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reading {
    /// User plus system CPU time.
    pub cpu: Duration,
    /// Resident memory now (VmRSS), MiB.
    pub rss_mib: f64,
    /// The most resident memory so far (VmHWM), MiB.
    pub hwm_mib: f64,
}

/// Reads `pid` (`None` when it cannot be read: gone, or not given).
pub fn read(pid: u32) -> Option<Reading> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(parse(&stat, &status, ticks_per_second()))
}

/// Clock ticks a second (`CLK_TCK`, 100 on Linux).
fn ticks_per_second() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|t| u64::try_from(t).ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// Parses `/proc/<pid>/stat` (utime and stime, fields 14 and 15) and
/// `/proc/<pid>/status` (VmRSS, VmHWM).
pub fn parse(stat: &str, status: &str, ticks: u64) -> Reading {
    let rest = stat.rsplit_once(") ").map_or("", |(_, r)| r);
    let used: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum();
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    Reading {
        cpu: Duration::from_secs_f64(used as f64 / ticks.max(1) as f64),
        rss_mib: field("VmRSS:"),
        hwm_mib: field("VmHWM:"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cpu_ticks_and_memory() {
        let stat = "42 (istiod (x)) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 1 1 1";
        let status = "Name:\tistiod\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n";
        let r = parse(stat, status, 100);
        assert_eq!(r.cpu, Duration::from_secs(3));
        assert_eq!(r.rss_mib, 100.0);
        assert_eq!(r.hwm_mib, 200.0);
    }

    #[test]
    fn reads_this_process() {
        let r = read(std::process::id()).unwrap();
        assert!(r.rss_mib > 0.0 && r.hwm_mib >= r.rss_mib);
    }
}
