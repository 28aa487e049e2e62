//! The processes a benchmark started (servers, agents), so that none outlives it: their
//! owners kill them when dropped, but an exit that runs no destructors (a watchdog giving
//! up, SIGINT, SIGTERM) would leave a fleet of them running on the machine. etcd members
//! stop by themselves (they are tied to our stdin; `orrery-store-testkit`).

use parking_lot::Mutex;
use std::collections::BTreeSet;

static RUNNING: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

fn running() -> parking_lot::MutexGuard<'static, BTreeSet<u32>> {
    RUNNING.lock()
}

/// A process started, to be stopped with the benchmark.
pub fn started(pid: u32) {
    running().insert(pid);
}

/// A process stopped (or waited for) by its owner.
pub fn stopped(pid: u32) {
    running().remove(&pid);
}

/// Kills every process still running (SIGKILL: the benchmark is ending).
pub fn kill_all() {
    let pids: Vec<String> = std::mem::take(&mut *running())
        .into_iter()
        .map(|p| p.to_string())
        .collect();
    if !pids.is_empty() {
        let _ = std::process::Command::new("kill")
            .arg("-KILL")
            .args(&pids)
            .status();
    }
}

/// Exits with `code` after killing what is still running.
pub fn exit(code: i32) -> ! {
    kill_all();
    std::process::exit(code)
}

/// On SIGINT or SIGTERM, kills what is still running and exits (130 or 143, as a shell
/// reports a process ended by the signal).
pub fn stop_on_signals() -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    tokio::spawn(async move {
        let code = tokio::select! {
            _ = int.recv() => 130,
            _ = term.recv() => 143,
        };
        eprintln!("orrery-bench: stopped by a signal; stopping the processes it started");
        exit(code);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_still_running_is_killed_and_what_was_stopped_is_left() {
        let mut a = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut b = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        started(a.id());
        started(b.id());
        stopped(b.id());
        kill_all();
        let status = a.wait().unwrap();
        assert!(!status.success(), "killed: {status:?}");
        assert!(b.try_wait().unwrap().is_none(), "left running");
        b.kill().unwrap();
        b.wait().unwrap();
    }
}
