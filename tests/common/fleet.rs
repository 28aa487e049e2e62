//! A server and a fleet of `orrery agent` processes with simulated members, each with its
//! admin endpoint to look inside.

use std::time::Duration;

use serde_json::Value;

use super::{Agent, Server, eventually, http};

/// The default member: 4 nodes of 8 cores, a light background load, quick pod start, a
/// cloud's on-demand prices.
pub const SIM: &str =
    "nodes=4,cpu=8,memory=32Gi,load=0.1,start=100ms,cpuCoreHour=0.04,memoryGiBHour=0.005";

pub struct Fleet {
    pub s: Server,
    pub agents: Vec<(String, Agent, String)>,
}

impl Fleet {
    pub fn start(names: &[(&str, &str)]) -> Fleet {
        Self::start_with(names, &[])
    }

    pub fn start_with(names: &[(&str, &str)], server_args: &[&str]) -> Fleet {
        let sims: Vec<(&str, &str, &str)> = names.iter().map(|(n, r)| (*n, *r, SIM)).collect();
        Self::start_sims(&sims, server_args)
    }

    /// Members `(name, region, simulation spec)`.
    pub fn start_sims(members: &[(&str, &str, &str)], server_args: &[&str]) -> Fleet {
        Self::start_full(members, server_args, &[])
    }

    /// [`Fleet::start_sims`], each agent given `agent_args` too.
    pub fn start_full(
        members: &[(&str, &str, &str)],
        server_args: &[&str],
        agent_args: &[&str],
    ) -> Fleet {
        let s = Server::start_with(server_args);
        let mut agents = Vec::new();
        for (name, region, sim) in members {
            let token = s.token(name);
            let a = Agent::start(
                &s,
                name,
                &[
                    agent_args,
                    &[
                        "--cluster",
                        name,
                        "--token",
                        &token,
                        "--simulate",
                        sim,
                        "--region",
                        region,
                        "--provider",
                        "sim",
                        "--heartbeat-interval",
                        "1s",
                        "--report-interval",
                        "100ms",
                        "--admin-listen",
                        "127.0.0.1:0",
                        // Each member's clusterset DNS (what it imports).
                        "--dns-listen",
                        "127.0.0.1:0",
                        "--labels",
                        &format!("region={region}"),
                    ],
                ]
                .concat(),
            );
            let admin = a.admin();
            agents.push((name.to_string(), a, admin));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let not_ready: Vec<&str> = members
                .iter()
                .map(|(n, _, _)| *n)
                .filter(|n| s.cluster_condition(n, "Ready") != "True")
                .collect();
            if not_ready.is_empty() {
                break;
            }
            if std::time::Instant::now() > deadline {
                // Say why: what each agent printed, and its log's tail.
                for (name, a, _) in agents
                    .iter()
                    .filter(|(n, _, _)| not_ready.contains(&n.as_str()))
                {
                    let log = a.log();
                    let tail: Vec<&str> = log.lines().rev().take(30).collect();
                    eprintln!("--- agent {name}: stdout {:?}", a.output());
                    eprintln!(
                        "--- agent {name}: log tail (newest first)\n{}",
                        tail.join("\n")
                    );
                }
                panic!("timed out waiting for clusters {not_ready:?} to be Ready");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Fleet { s, agents }
    }

    /// Where a ResourceBinding in `default` places its template: (cluster, replicas).
    pub fn clusters_of(&self, binding: &str) -> Vec<(String, i64)> {
        self.s.clusters_of(binding)
    }

    /// The admin endpoint of a member's agent.
    pub fn admin(&self, cluster: &str) -> &str {
        &self.agents.iter().find(|(n, _, _)| n == cluster).unwrap().2
    }

    /// The address of a member's clusterset DNS (its agent's `--dns-listen`).
    pub fn dns(&self, cluster: &str) -> String {
        let (_, a, _) = self.agents.iter().find(|(n, _, _)| n == cluster).unwrap();
        let mut found = None;
        eventually(Duration::from_secs(10), "the agent's DNS address", || {
            found = a
                .output()
                .iter()
                .find_map(|l| l.strip_prefix("clusterset DNS at "))
                .and_then(|rest| rest.split_whitespace().next())
                .map(str::to_string);
            found.is_some()
        });
        found.unwrap()
    }

    /// Sets a simulated member's background load (0-1 of its capacity).
    pub fn set_load(&self, cluster: &str, load: f64) {
        let (code, body) = http(
            "PUT",
            self.admin(cluster),
            &format!("/clusters/{cluster}/load"),
            &format!(r#"{{"load": {load}}}"#),
        );
        assert_eq!(code, 200, "{body}");
    }

    /// The objects a member runs.
    pub fn objects(&self, cluster: &str) -> Vec<Value> {
        let (code, body) = http(
            "GET",
            self.admin(cluster),
            &format!("/clusters/{cluster}/objects"),
            "",
        );
        assert_eq!(code, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        v["items"].as_array().unwrap().clone()
    }

    /// Every member's journal entries (what it created, updated and deleted, and why) after
    /// those `seen` names, which moves on.
    pub fn journals(
        &self,
        seen: &mut std::collections::BTreeMap<String, u64>,
    ) -> Vec<(String, Value)> {
        let mut out = Vec::new();
        for (name, _, admin) in &self.agents {
            let since = seen.get(name).copied().unwrap_or(0);
            let (code, body) = http(
                "GET",
                admin,
                &format!("/clusters/{name}/journal?since={since}"),
                "",
            );
            assert_eq!(code, 200, "{body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            for e in v["items"].as_array().unwrap() {
                seen.insert(name.clone(), e["seq"].as_u64().unwrap());
                out.push((name.clone(), e.clone()));
            }
        }
        out
    }

    /// One object of a member, if it runs it.
    pub fn find(&self, cluster: &str, kind: &str, name: &str) -> Option<Value> {
        self.objects(cluster)
            .into_iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
    }
}
