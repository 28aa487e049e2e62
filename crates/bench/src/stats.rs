//! Small helpers: percentiles, medians, resident memory, JSON output.

/// The `p`-th percentile (0..=100) of unsorted samples, by nearest rank.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut s = samples.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

pub fn median(samples: &[f64]) -> f64 {
    percentile(samples, 50.0)
}

/// A field of `/proc/self/status` in KiB (`VmRSS`, `VmHWM`).
pub fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

pub fn rss_mib() -> f64 {
    proc_status_kib("VmRSS:") as f64 / 1024.0
}

pub fn peak_rss_mib() -> f64 {
    proc_status_kib("VmHWM:") as f64 / 1024.0
}

/// Rounds for readable JSON.
pub fn round(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

/// Prints one scenario's result as one line of JSON on stdout.
pub fn emit(v: serde_json::Value) {
    println!("{v}");
}

/// Progress for long runs goes to stderr, so stdout stays pure JSON.
pub fn progress(msg: impl AsRef<str>) {
    eprintln!("[bench] {}", msg.as_ref());
}

/// Whether `pid` is still running (not gone, not a zombie waiting to be reaped).
pub fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
        })
        .is_some_and(|state| state != "Z" && state != "X")
}

/// CPU seconds the whole machine has spent busy (every core: user, nice, system, irq and
/// softirq; not idle, waiting on I/O, or stolen by the hypervisor; guest time is already in
/// user and nice).
pub fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0.0;
    };
    // user nice system idle iowait irq softirq steal guest guest_nice
    let f: Vec<f64> = cpu
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let busy: f64 = [0, 1, 2, 5, 6].iter().filter_map(|i| f.get(*i)).sum();
    busy / 100.0
}

/// (resident MiB, peak resident MiB, CPU seconds) of a process.
pub fn process_usage(pid: u32) -> (f64, f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |field: &str| -> f64 {
        status
            .lines()
            .find(|l| l.starts_with(field))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let cpu = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let f: Vec<String> = s
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .map(str::to_string)
                .collect();
            Some((f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?) / 100.0)
        })
        .unwrap_or(0.0);
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0, cpu)
}
