//! A real network partition: a network namespace joined to this one by a veth pair, made by
//! the test itself (as root, with `ip` from iproute2). A process started in the namespace
//! (`Netns::wrap`) reaches this side's address over the veth pair, and `cut` takes the
//! namespace's end down: packets are dropped both ways and connections hang as behind a dead
//! route, with no reset from anyone; `heal` brings it back.
//!
//! Only loopback-range addresses are used: the pair carries 127.a.b.1 (this side) and
//! 127.a.b.2 (the namespace), marked `route_localnet` on both ends, with a /32 route for
//! each end in the local routing table of the other side (which otherwise keeps all of
//! 127.0.0.0/8 on `lo`). Dropping the namespace deletes the pair and its routes.

use std::process::Command;

pub struct Netns {
    pub name: String,
    host_if: String,
    ns_if: String,
    /// This side's address on the pair: servers the namespace reaches listen here.
    pub host_ip: String,
    /// The namespace's address on the pair: what it serves is reached here.
    pub ns_ip: String,
}

/// Runs `cmd`; `Err` says what failed and why.
fn run(mut cmd: Command) -> Result<(), String> {
    let what = format!("{cmd:?}");
    let out = cmd
        .output()
        .map_err(|e| format!("{what} could not be run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    run(cmd)
}

/// Sets `key` to 1, in the namespace `ns` if given.
fn sysctl_in(ns: Option<&str>, key: &str) -> Result<(), String> {
    let mut cmd = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "sysctl"]);
            c
        }
        None => Command::new("sysctl"),
    };
    cmd.args(["-qw", &format!("{key}=1")]);
    run(cmd)
}

impl Netns {
    /// Makes the namespace and its pair; `Err` says why it cannot be made here (not root, no
    /// `ip`, no network namespaces in this container...).
    pub fn make() -> Result<Netns, String> {
        let pid = std::process::id();
        let (a, b) = (200 + pid % 50, pid / 50 % 250 + 1);
        let n = Netns {
            name: format!("orrery-test-{pid}"),
            host_if: format!("oh{pid}"),
            ns_if: format!("on{pid}"),
            host_ip: format!("127.{a}.{b}.1"),
            ns_ip: format!("127.{a}.{b}.2"),
        };
        // Dropped on a failure below: what was made goes again.
        ip(&["netns", "add", &n.name])?;
        let made = n.setup();
        made.map(|()| n)
    }

    fn setup(&self) -> Result<(), String> {
        let (ns, h, v) = (
            self.name.as_str(),
            self.host_if.as_str(),
            self.ns_if.as_str(),
        );
        let host32 = format!("{}/32", self.host_ip);
        let ns32 = format!("{}/32", self.ns_ip);
        ip(&["link", "add", h, "type", "veth", "peer", "name", v])?;
        ip(&["link", "set", v, "netns", ns])?;
        ip(&["addr", "add", &host32, "dev", h])?;
        ip(&["link", "set", h, "up"])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
        ip(&["-n", ns, "addr", "add", &ns32, "dev", v])?;
        ip(&["-n", ns, "link", "set", v, "up"])?;
        sysctl_in(None, &format!("net.ipv4.conf.{h}.route_localnet"))?;
        sysctl_in(Some(ns), &format!("net.ipv4.conf.{v}.route_localnet"))?;
        ip(&["route", "replace", &ns32, "dev", h, "table", "local"])?;
        // In the namespace, 127.0.0.0/8 stays local but for the pair's far end.
        ip(&[
            "-n", ns, "route", "replace", &host32, "dev", v, "table", "local",
        ])?;
        Ok(())
    }

    /// The command line that runs `program` in the namespace.
    pub fn wrap(&self) -> Vec<String> {
        vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            self.name.clone(),
        ]
    }

    /// Takes the namespace's end down: nothing passes either way.
    pub fn cut(&self) {
        ip(&["-n", &self.name, "link", "set", &self.ns_if, "down"]).unwrap();
    }

    /// Brings it back (its route went with the link).
    pub fn heal(&self) {
        ip(&["-n", &self.name, "link", "set", &self.ns_if, "up"]).unwrap();
        let host32 = format!("{}/32", self.host_ip);
        ip(&[
            "-n",
            &self.name,
            "route",
            "replace",
            &host32,
            "dev",
            &self.ns_if,
            "table",
            "local",
        ])
        .unwrap();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // The pair goes with the namespace, and the routes with the pair.
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.host_if]);
    }
}
