use super::*;
use orrery_api::Quantity;
use orrery_api::data::DataLocation;
use orrery_api::stateful::TransferVolumeStatus;

const GIB: i64 = 1 << 30;
const MIB: i64 = 1 << 20;

fn cluster(region: &str, bandwidth: i64, cache: i64) -> Cluster {
    Cluster {
        serving: true,
        region: region.into(),
        bandwidth,
        cache_bytes: cache,
        tier: Tier::Warm,
        ..Default::default()
    }
}

/// `lab`, a member holding 8 GiB of data set `corpus` (version 3) in a claim of its own.
fn lab_holding_corpus() -> Cluster {
    let mut lab = cluster("east", 1000 * MIB, 0);
    lab.held = vec![orrery_api::data::HeldDataSet {
        namespace: "ml".into(),
        name: "corpus".into(),
        claim: "corpus-v3".into(),
        bytes: 8 * GIB,
        data_version: 3,
    }];
    lab
}

/// A fleet, its data sets and transfers, and members that do what the Works ask: a Send's
/// snapshot is taken at once, a Receive's round is in after `copy_steps` steps.
struct World {
    now: i64,
    settings: Settings,
    clusters: BTreeMap<String, Cluster>,
    sets: Vec<Set>,
    transfers: Vec<Xfer>,
    works: BTreeMap<WorkKey, WorkSpec>,
    /// Each authoritative copy's data version, by cluster.
    versions: BTreeMap<String, u64>,
    /// Steps a Receive round has been copying, by (cluster, id).
    copying: BTreeMap<(String, String), u32>,
    copy_steps: u32,
    /// Every transfer's highest booked rate seen, and the links' bookings at each step.
    max_out: BTreeMap<String, i64>,
    max_in: BTreeMap<String, i64>,
}

impl World {
    fn new(clusters: &[(&str, Cluster)]) -> World {
        World {
            now: 1_700_000_000,
            settings: Settings::default(),
            clusters: clusters
                .iter()
                .map(|(n, c)| (n.to_string(), c.clone()))
                .collect(),
            sets: Vec::new(),
            transfers: Vec::new(),
            works: BTreeMap::new(),
            versions: BTreeMap::new(),
            copying: BTreeMap::new(),
            copy_steps: 2,
            max_out: BTreeMap::new(),
            max_in: BTreeMap::new(),
        }
    }

    fn set(&mut self, name: &str, size: i64, at: &[&str]) {
        self.sets.push(Set {
            namespace: "ml".into(),
            name: name.into(),
            spec: DataSetSpec {
                size: Quantity::from_int(size, orrery_api::Format::BinarySI),
                locations: at
                    .iter()
                    .map(|c| DataLocation {
                        cluster: c.to_string(),
                        tier: Tier::Warm,
                    })
                    .collect(),
            },
            ..Default::default()
        });
        for c in at {
            self.versions.insert(c.to_string(), 1);
        }
    }

    fn read(&mut self, set: &str, workload: &str, cluster: &str) {
        let s = self.sets.iter_mut().find(|s| s.name == set).unwrap();
        s.readers.push(DataReader {
            workload: workload.into(),
            cluster: cluster.into(),
        });
    }

    fn status(&self, set: &str) -> &DataSetStatus {
        &self.sets.iter().find(|s| s.name == set).unwrap().status
    }

    fn copy(&self, set: &str, cluster: &str) -> Option<&DataCopy> {
        self.status(set).copy(cluster)
    }

    /// One step of the plan, its output stored, and the members' answer to the Works.
    fn step(&mut self) -> Output {
        self.now += 1;
        let out = step(&Input {
            now: Time::from_unix_seconds(self.now).unwrap(),
            settings: &self.settings,
            clusters: &self.clusters,
            sets: &self.sets,
            transfers: &self.transfers,
        });
        for s in self.sets.iter_mut() {
            if let Some(st) = out.statuses.get(&(s.namespace.clone(), s.name.clone())) {
                s.status = st.clone();
            }
        }
        self.transfers
            .retain(|t| !out.delete.contains(&(t.namespace.clone(), t.name.clone())));
        for t in self.transfers.iter_mut() {
            if let Some(st) = out
                .transfer_statuses
                .get(&(t.namespace.clone(), t.name.clone()))
            {
                t.status = st.clone();
            }
        }
        for ((ns, name), spec) in &out.create {
            self.transfers.push(Xfer {
                namespace: ns.clone(),
                name: name.clone(),
                spec: spec.clone(),
                status: Default::default(),
                created: Some(Time::from_unix_seconds(self.now).unwrap()),
            });
        }
        // Links: what is booked never exceeds a cluster's bandwidth.
        let mut out_rate: BTreeMap<String, i64> = BTreeMap::new();
        let mut in_rate: BTreeMap<String, i64> = BTreeMap::new();
        for t in self.transfers.iter().filter(|t| t.status.phase.books()) {
            *out_rate.entry(t.status.source.clone()).or_default() += t.status.rate;
            *in_rate.entry(t.spec.destination.clone()).or_default() += t.status.rate;
        }
        for (c, r) in out_rate {
            assert!(r <= self.clusters[&c].bandwidth, "{c} sends {r}");
            let m = self.max_out.entry(c).or_default();
            *m = (*m).max(r);
        }
        for (c, r) in in_rate {
            assert!(r <= self.clusters[&c].bandwidth, "{c} receives {r}");
            let m = self.max_in.entry(c).or_default();
            *m = (*m).max(r);
        }
        self.works = out.works.clone();
        self.answer();
        out
    }

    /// What members report of the Works now.
    fn answer(&mut self) {
        let works = self.works.clone();
        for s in self.sets.iter_mut() {
            s.seen.clear();
        }
        for ((cluster, ns, set), w) in &works {
            let size = self
                .sets
                .iter()
                .find(|s| s.name == *set)
                .unwrap()
                .spec
                .bytes();
            let mut seen = Seen::default();
            if let Some(v) = self.versions.get(cluster) {
                seen.volume = Some(VolumeStatus {
                    name: orrery_api::data::claim_name(set),
                    used_bytes: size,
                    data_version: *v,
                    ..Default::default()
                });
            }
            for t in &w.transfers {
                let status = match t.role {
                    TransferRole::Send => TransferStatus {
                        id: t.id.clone(),
                        role: t.role,
                        round: t.round,
                        complete: true,
                        volumes: vec![TransferVolumeStatus {
                            name: t.volumes[0].name.clone(),
                            // A cache sends the version it holds.
                            data_version: self.versions.get(cluster).copied().unwrap_or_else(
                                || {
                                    let s = self.sets.iter().find(|s| s.name == *set).unwrap();
                                    s.status.copy(cluster).map_or(1, |c| c.data_version.max(1))
                                },
                            ),
                            used_bytes: size,
                            // The first round is all of it, the next what changed.
                            bytes: if t.round == 1 { size } else { size / 10 },
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                    TransferRole::Receive => {
                        let n = self
                            .copying
                            .entry((cluster.clone(), format!("{}#{}", t.id, t.round)))
                            .or_default();
                        *n += 1;
                        TransferStatus {
                            id: t.id.clone(),
                            role: t.role,
                            round: t.round,
                            complete: *n > self.copy_steps,
                            volumes: vec![TransferVolumeStatus {
                                name: t.volumes[0].name.clone(),
                                bytes: t.volumes[0].bytes,
                                copied: t.volumes[0].bytes * i64::from((*n).min(self.copy_steps))
                                    / i64::from(self.copy_steps),
                                ..Default::default()
                            }],
                            ..Default::default()
                        }
                    }
                };
                seen.transfers.push(status);
            }
            let s = self
                .sets
                .iter_mut()
                .find(|s| s.namespace == *ns && s.name == *set)
                .unwrap();
            s.seen.insert(cluster.clone(), seen);
        }
    }

    fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            self.step();
        }
    }

    fn transfers_into(&self, cluster: &str) -> Vec<&Xfer> {
        self.transfers
            .iter()
            .filter(|t| t.spec.destination == cluster)
            .collect()
    }
}

#[test]
fn a_reader_gets_its_copy_and_its_pods_wait_for_the_first_round() {
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("fast", cluster("west", 500 * MIB, 0)),
    ]);
    w.set("tokens", 10 * GIB, &["archive"]);
    w.step();
    // The authoritative copy's claim is adopted and kept when the data set goes.
    let auth = &w.works[&("archive".into(), "ml".into(), "tokens".into())];
    assert!(auth.preserve_resources_on_deletion);
    assert_eq!(auth.conflict_resolution, ConflictResolution::Overwrite);
    assert!(auth.transfers.is_empty());
    assert!(w.transfers.is_empty(), "nothing copied without a reader");

    w.read("tokens", "Job/train", "fast");
    let out = w.step();
    assert_eq!(out.create.len(), 1);
    let t = &w.transfers[0];
    assert_eq!(t.name, "tokens-fast-1");
    assert_eq!(t.spec.reason, "Job/train");
    w.step();
    let t = &w.transfers[0];
    assert_eq!(t.status.phase, TransferPhase::Snapshot);
    assert_eq!(t.status.source, "archive");
    // The slower end's whole bandwidth is free: it is booked.
    assert_eq!(t.status.rate, 500 * MIB);
    let send = &w.works[&("archive".into(), "ml".into(), "tokens".into())].transfers;
    assert_eq!((send[0].role, send[0].round), (TransferRole::Send, 1));
    w.step();
    assert_eq!(w.transfers[0].status.phase, TransferPhase::Copying);
    let dest = &w.works[&("fast".into(), "ml".into(), "tokens".into())];
    let recv = &dest.transfers[0];
    assert_eq!(recv.role, TransferRole::Receive);
    assert!(recv.hold_workload, "the claim waits for the first round");
    assert_eq!(recv.volumes[0].bytes, 10 * GIB);
    assert_eq!(recv.rate, 500 * MIB);
    assert!(!dest.preserve_resources_on_deletion);
    w.run(3);
    let t = &w.transfers[0];
    assert_eq!(t.status.phase, TransferPhase::Succeeded);
    assert_eq!(t.status.copied_bytes, 10 * GIB);
    let c = w.copy("tokens", "fast").unwrap();
    assert!(c.present && c.role == CopyRole::Cache && c.data_version == 1);
    let recv = &w.works[&("fast".into(), "ml".into(), "tokens".into())].transfers[0];
    assert!(!recv.hold_workload);
    // Settled: the same facts give the same Works and no new transfer.
    let before = w.works.clone();
    let out = w.step();
    assert!(out.create.is_empty());
    assert_eq!(w.works, before);
    // A finished transfer's record goes after a while; the copy stays.
    w.now += w.settings.keep_done_seconds;
    w.step();
    assert!(w.transfers.is_empty());
    assert!(w.copy("tokens", "fast").is_some_and(|c| c.present));
}

#[test]
fn links_are_never_booked_beyond_their_bandwidth() {
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("a", cluster("west", 400 * MIB, 0)),
        ("b", cluster("north", 400 * MIB, 0)),
        ("c", cluster("south", 400 * MIB, 0)),
        ("d", cluster("moon", 400 * MIB, 0)),
    ]);
    w.set("tokens", 10 * GIB, &["archive"]);
    for c in ["a", "b", "c", "d"] {
        w.read("tokens", &format!("Job/j-{c}"), c);
    }
    w.copy_steps = 5;
    w.run(2);
    let mut rates: Vec<(String, i64)> = w
        .transfers
        .iter()
        .filter(|t| t.status.phase.books())
        .map(|t| (t.spec.destination.clone(), t.status.rate))
        .collect();
    rates.sort();
    // 400 + 400 + 200 of the archive's 1000; the fourth waits for room.
    assert_eq!(
        rates,
        vec![
            ("a".into(), 400 * MIB),
            ("b".into(), 400 * MIB),
            ("c".into(), 200 * MIB)
        ]
    );
    let queued = w
        .transfers
        .iter()
        .find(|t| t.spec.destination == "d")
        .unwrap();
    assert_eq!(queued.status.phase, TransferPhase::Queued);
    assert!(
        queued.status.message.contains("waiting for bandwidth"),
        "{}",
        queued.status.message
    );
    w.run(20);
    assert!(
        w.transfers
            .iter()
            .all(|t| t.status.phase == TransferPhase::Succeeded),
        "{:?}",
        w.transfers
            .iter()
            .map(|t| (&t.name, t.status.phase))
            .collect::<Vec<_>>()
    );
    assert_eq!(w.max_out["archive"], 1000 * MIB);
}

#[test]
fn a_second_reader_in_a_region_copies_from_the_first_not_across_regions() {
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("w1", cluster("west", 1000 * MIB, 100 * GIB)),
        ("w2", cluster("west", 1000 * MIB, 100 * GIB)),
    ]);
    w.set("tokens", 10 * GIB, &["archive"]);
    w.read("tokens", "Job/a", "w1");
    w.read("tokens", "Job/b", "w2");
    w.run(12);
    let from = |c: &str| w.transfers_into(c)[0].status.source.clone();
    // One copy crosses into the region; the other comes from it.
    let (first, second) = if from("w1") == "archive" {
        ("w1", "w2")
    } else {
        ("w2", "w1")
    };
    assert_eq!(from(first), "archive");
    assert_eq!(from(second), first);
    assert!(
        w.transfers
            .iter()
            .all(|t| t.status.phase == TransferPhase::Succeeded)
    );
    assert_eq!(w.copy("tokens", second).unwrap().source, first);
    // The second copy's Send is at the first, which is pinned while it sends.
    // Reads per region are counted.
    let west = w
        .status("tokens")
        .regions
        .iter()
        .find(|r| r.region == "west")
        .unwrap();
    assert_eq!((west.last_hour, west.last_day), (2, 2));
}

#[test]
fn caches_beyond_their_tier_go_coldest_first_and_authoritative_copies_never() {
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("w1", cluster("west", 1000 * MIB, 25 * GIB)),
    ]);
    w.set("old", 10 * GIB, &["archive"]);
    w.set("new", 10 * GIB, &["archive"]);
    w.set("third", 10 * GIB, &["archive"]);
    w.set("local", 50 * GIB, &["w1"]);
    w.read("old", "Job/o", "w1");
    w.run(8);
    w.now += 100;
    w.read("new", "Job/n", "w1");
    w.run(8);
    // Both fit in 25 GiB; the readers go, the copies stay as caches.
    for s in w.sets.iter_mut() {
        s.readers.clear();
    }
    w.run(1);
    assert!(w.copy("old", "w1").is_some() && w.copy("new", "w1").is_some());
    // A third does not fit: the least recently used unread copy goes.
    w.now += 100;
    w.read("third", "Job/t", "w1");
    w.run(8);
    assert!(w.copy("old", "w1").is_none(), "{:?}", w.status("old"));
    assert!(w.copy("new", "w1").is_some() && w.copy("third", "w1").is_some());
    assert!(
        !w.works
            .contains_key(&("w1".into(), "ml".into(), "old".into()))
    );
    // The authoritative 50 GiB at w1 is not counted against its cache, nor evicted.
    assert!(
        w.copy("local", "w1")
            .is_some_and(|c| c.role == CopyRole::Authoritative)
    );
}

#[test]
fn a_cache_behind_its_source_is_refreshed_with_what_changed() {
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("w1", cluster("west", 1000 * MIB, 100 * GIB)),
    ]);
    w.set("tokens", 10 * GIB, &["archive"]);
    w.read("tokens", "Job/a", "w1");
    w.run(8);
    assert_eq!(w.copy("tokens", "w1").unwrap().data_version, 1);
    // The data changes at the source.
    w.versions.insert("archive".into(), 2);
    w.run(8);
    let refresh = w
        .transfers_into("w1")
        .into_iter()
        .find(|t| t.status.round == 2)
        .unwrap();
    assert_eq!(refresh.spec.reason, "refresh");
    assert_eq!(refresh.status.base_version, 1);
    assert_eq!(
        refresh.status.bytes, GIB,
        "only what changed: {:?}",
        refresh.status
    );
    assert_eq!(refresh.status.phase, TransferPhase::Succeeded);
    let c = w.copy("tokens", "w1").unwrap();
    assert_eq!((c.data_version, c.round), (2, 2));
    // The Receive round applies on top of the version held; the claim is not held again.
    let recv = &w.works[&("w1".into(), "ml".into(), "tokens".into())].transfers[0];
    assert_eq!((recv.round, recv.volumes[0].base_version), (2, 1));
    assert!(!recv.hold_workload);
}

#[test]
fn a_region_reading_often_gets_a_cache_copy() {
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("w1", cluster("west", 1000 * MIB, 0)),
        ("w2", cluster("west", 1000 * MIB, 50 * GIB)),
    ]);
    w.set("tokens", 10 * GIB, &["archive"]);
    // Two reads from the west, run where the data is... in the west, at w1 without a cache.
    w.read("tokens", "Job/a", "w1");
    w.run(8);
    for s in w.sets.iter_mut() {
        s.readers.clear();
    }
    w.run(1);
    assert!(
        w.copy("tokens", "w1").is_none(),
        "no cache tier at w1: the copy goes"
    );
    w.read("tokens", "Job/b", "w1");
    w.run(8);
    for s in w.sets.iter_mut() {
        s.readers.clear();
    }
    w.run(10);
    // Read twice from the west in the last hour: w2, with a cache tier, keeps a copy.
    let cached = w.copy("tokens", "w2").expect("a cache copy in the west");
    assert!(cached.present);
    let t = w.transfers_into("w2")[0];
    assert!(
        t.spec.reason.starts_with("cache: read 2 times from west"),
        "{}",
        t.spec.reason
    );
}

#[test]
fn transfers_of_what_does_not_exist_fail_and_authoritative_destinations_are_done() {
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("w1", cluster("west", 1000 * MIB, 0)),
    ]);
    w.set("tokens", 10 * GIB, &["archive"]);
    let mk = |name: &str, set: &str, dest: &str| Xfer {
        namespace: "ml".into(),
        name: name.into(),
        spec: DataTransferSpec {
            data_set: set.into(),
            destination: dest.into(),
            ..Default::default()
        },
        ..Default::default()
    };
    w.transfers.push(mk("x", "nope", "w1"));
    w.transfers.push(mk("y", "tokens", "mars"));
    w.transfers.push(mk("z", "tokens", "archive"));
    w.step();
    let phase = |n: &str| {
        let t = w.transfers.iter().find(|t| t.name == n).unwrap();
        (t.status.phase, t.status.message.clone())
    };
    assert_eq!(
        phase("x"),
        (TransferPhase::Failed, "data set nope not found".into())
    );
    assert_eq!(
        phase("y"),
        (TransferPhase::Failed, "no cluster mars".into())
    );
    assert_eq!(phase("z").0, TransferPhase::Succeeded);
}

#[test]
fn a_round_whose_writes_were_lost_is_taken_up_again() {
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("fast", cluster("west", 1000 * MIB, 0)),
    ]);
    w.set("tokens", 10 * GIB, &["archive"]);
    w.read("tokens", "Job/train", "fast");
    // Every other step's writes are lost (a data set status that conflicts holds back its
    // transfers' writes too): the plan starts over from what is stored.
    for n in 0..16 {
        let (set, transfers) = (w.sets[0].status.clone(), w.transfers.clone());
        w.step();
        if n % 2 == 1 {
            w.sets[0].status = set;
            w.transfers = transfers;
            w.answer();
        }
    }
    assert_eq!(w.transfers.len(), 1, "one copy, not one per try");
    assert_eq!(w.transfers[0].status.phase, TransferPhase::Succeeded);
    assert!(
        w.copy("tokens", "fast").is_some_and(|c| c.present),
        "{:?}",
        w.status("tokens")
    );
    // A transfer that went ahead of a lost status write: the copy is taken from it.
    let t = w.transfers[0].status.clone();
    let c = w.sets[0]
        .status
        .copies
        .iter_mut()
        .find(|c| c.cluster == "fast")
        .unwrap();
    c.present = false;
    c.data_version = 0;
    w.step();
    let c = w.copy("tokens", "fast").unwrap();
    assert!(c.present && c.data_version == t.data_version);
}

#[test]
fn a_copy_a_member_reports_of_its_own_is_read_and_copied_from_but_never_touched() {
    let lab = lab_holding_corpus();
    let mut w = World::new(&[("lab", lab), ("fast", cluster("west", 500 * MIB, 20 * GIB))]);
    // Named by no location: only the member's report says where it is.
    w.set("corpus", 8 * GIB, &[]);
    w.versions.insert("lab".into(), 3);
    w.step();
    let c = w.copy("corpus", "lab").unwrap();
    assert_eq!(c.role, CopyRole::Reported);
    assert!(c.present);
    assert_eq!((c.bytes, c.data_version), (8 * GIB, 3));
    // Its claim is the member's: no Work while nothing is copied from it.
    assert!(w.works.is_empty(), "{:?}", w.works);

    // A reader there needs no copy.
    w.read("corpus", "Job/scan", "lab");
    w.step();
    assert!(w.transfers.is_empty());

    // A reader elsewhere gets one, from the member's own claim, and is refreshed from nothing
    // newer (the member's version is the newest).
    w.read("corpus", "Job/train", "fast");
    w.run(2);
    let send = &w.works[&("lab".into(), "ml".into(), "corpus".into())];
    assert!(
        send.workload.manifests.is_empty(),
        "the member's claim is not Orrery's"
    );
    assert_eq!(send.transfers[0].role, TransferRole::Send);
    assert_eq!(send.transfers[0].volumes[0].name, "corpus-v3");
    w.run(4);
    let t = &w.transfers_into("fast")[0];
    assert_eq!(t.status.phase, TransferPhase::Succeeded);
    assert_eq!(t.status.source, "lab");
    let fast = w.copy("corpus", "fast").unwrap();
    assert!(fast.present && fast.role == CopyRole::Cache && fast.data_version == 3);
    assert_eq!(w.transfers_into("fast").len(), 1);
    // Its Work keeps the Send of the copy taken from it (the base of the next round's
    // changes), and never a manifest.
    w.step();
    let send = &w.works[&("lab".into(), "ml".into(), "corpus".into())];
    assert!(send.workload.manifests.is_empty());
    assert_eq!(send.transfers.len(), 1);

    // A cluster that stops reporting it no longer holds a copy.
    w.clusters.get_mut("lab").unwrap().held.clear();
    w.step();
    assert!(w.copy("corpus", "lab").is_none());
    assert!(w.copy("corpus", "fast").is_some_and(|c| c.present));
}

#[test]
fn a_copy_goes_through_a_relay_when_the_direct_path_is_slow() {
    // The path from `home` to `far` carries 100 MiB/s of their 1000 MiB/s uplinks.
    let mut far = cluster("west", 1000 * MIB, 0);
    far.paths.insert("home".into(), 100 * MIB);
    let clusters = [
        ("home", cluster("east", 1000 * MIB, 0)),
        ("far", far),
        ("mid", cluster("central", 1000 * MIB, 0)),
    ];
    // With nowhere to hold a copy in between, it goes straight, booked at what the path
    // carries, not what the uplinks have free.
    let mut w = World::new(&clusters);
    w.set("tokens", 10 * GIB, &["home"]);
    w.read("tokens", "Job/train", "far");
    w.run(2);
    let t = &w.transfers_into("far")[0];
    assert_eq!(t.status.source, "home");
    assert_eq!(t.status.rate, 100 * MIB);
    assert_eq!(t.status.path, vec!["home".to_string(), "far".to_string()]);

    // `mid` has a cache tier: the copy goes there first, then on to `far`.
    let mut clusters = clusters.clone();
    clusters[2].1.cache_bytes = 20 * GIB;
    let mut w = World::new(&clusters);
    w.set("tokens", 10 * GIB, &["home"]);
    w.read("tokens", "Job/train", "far");
    w.run(2);
    let to_far = &w.transfers_into("far")[0];
    assert_eq!(to_far.status.phase, TransferPhase::Queued);
    assert!(
        to_far
            .status
            .message
            .contains("arriving at mid, to relay it"),
        "{}",
        to_far.status.message
    );
    let to_mid = &w.transfers_into("mid")[0];
    assert_eq!(to_mid.spec.reason, "relay: on to far");
    w.run(16);
    let to_mid = &w.transfers_into("mid")[0];
    assert_eq!(to_mid.status.phase, TransferPhase::Succeeded);
    assert_eq!(to_mid.status.source, "home");
    let to_far = &w.transfers_into("far")[0];
    assert_eq!(to_far.status.phase, TransferPhase::Succeeded);
    assert_eq!(to_far.status.source, "mid");
    assert_eq!(to_far.status.rate, 1000 * MIB);
    assert_eq!(
        to_far.status.path,
        vec!["home".to_string(), "mid".to_string(), "far".to_string()]
    );
    assert!(w.copy("tokens", "far").is_some_and(|c| c.present));
    // Nothing more is copied once it is in: two transfers, no more.
    let out = w.step();
    assert!(out.create.is_empty());
    assert_eq!(w.transfers.len(), 2, "{:#?}", w.transfers);
}

#[test]
fn stale_caches_are_refreshed_from_the_newest_copy_never_from_each_other() {
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("w1", cluster("west", 1000 * MIB, 100 * GIB)),
        ("w2", cluster("west", 1000 * MIB, 100 * GIB)),
    ]);
    w.set("tokens", 10 * GIB, &["archive"]);
    w.read("tokens", "Job/a", "w1");
    w.read("tokens", "Job/b", "w2");
    w.run(20);
    assert!(
        ["w1", "w2"]
            .iter()
            .all(|c| w.copy("tokens", c).is_some_and(|c| c.present))
    );
    let before = w.transfers.len();
    // The data changes at the archive: each cache is refreshed once, from a copy of the new
    // data (the archive, or the other cache once it holds it), never from a stale one.
    w.versions.insert("archive".into(), 2);
    w.run(30);
    let refreshes: Vec<&Xfer> = w
        .transfers
        .iter()
        .filter(|t| t.spec.reason == "refresh")
        .collect();
    assert_eq!(refreshes.len(), 2, "{:#?}", w.transfers);
    assert!(
        refreshes
            .iter()
            .all(|t| t.status.phase == TransferPhase::Succeeded && t.status.data_version == 2),
        "{refreshes:#?}"
    );
    assert_eq!(w.transfers.len(), before + 2);
    for c in ["w1", "w2"] {
        assert_eq!(w.copy("tokens", c).unwrap().data_version, 2);
    }
    // A newer copy no one can reach is no reason to copy.
    w.versions.insert("archive".into(), 3);
    w.clusters.get_mut("archive").unwrap().serving = false;
    let out = w.step();
    assert!(out.create.is_empty(), "{:?}", out.create);
}

#[test]
fn a_reported_copy_keeps_its_status_from_step_to_step() {
    let lab = lab_holding_corpus();
    let mut w = World::new(&[("lab", lab)]);
    w.set("corpus", 8 * GIB, &[]);
    w.step();
    let first = w.status("corpus").clone();
    w.run(3);
    // Nothing changed, so nothing is written again (a changing status would be written
    // every round, and each write would start another).
    assert_eq!(w.status("corpus"), &first);
}

#[test]
fn a_copy_whose_source_goes_fails_and_a_second_copy_into_a_cluster_waits() {
    let lab = lab_holding_corpus();
    let mut w = World::new(&[("lab", lab), ("fast", cluster("west", 500 * MIB, 20 * GIB))]);
    w.set("corpus", 8 * GIB, &[]);
    w.versions.insert("lab".into(), 3);
    w.copy_steps = 20;
    // Two prefetches into one cluster: the second waits for the first.
    for n in ["p1", "p2"] {
        w.transfers.push(Xfer {
            namespace: "ml".into(),
            name: n.into(),
            spec: DataTransferSpec {
                data_set: "corpus".into(),
                destination: "fast".into(),
                source: String::new(),
                reason: "prefetch".into(),
            },
            status: Default::default(),
            created: Some(Time::from_unix_seconds(w.now).unwrap()),
        });
    }
    w.run(3);
    fn by(w: &World, n: &str) -> DataTransferStatus {
        w.transfers
            .iter()
            .find(|t| t.name == n)
            .unwrap()
            .status
            .clone()
    }
    assert_eq!(by(&w, "p1").phase, TransferPhase::Copying);
    assert_eq!(by(&w, "p2").phase, TransferPhase::Queued);
    assert!(
        by(&w, "p2").message.contains("under way into fast"),
        "{}",
        by(&w, "p2").message
    );
    // The member stops holding it mid-copy: the copy fails, and gives its bandwidth back.
    w.clusters.get_mut("lab").unwrap().held.clear();
    w.step();
    let p1 = by(&w, "p1");
    assert_eq!(p1.phase, TransferPhase::Failed);
    assert!(
        p1.message.contains("lab it was taken from is gone"),
        "{}",
        p1.message
    );
    assert_eq!(p1.rate, 0);
}

#[test]
fn a_relay_in_the_destinations_region_is_used_once_its_copy_is_in() {
    // `home` and `far` share a region, but the path between them is slow; `mid` is fast to both.
    let mut far = cluster("west", 1000 * MIB, 0);
    far.paths.insert("home".into(), 100 * MIB);
    let mut w = World::new(&[
        ("home", cluster("west", 1000 * MIB, 0)),
        ("far", far),
        ("mid", cluster("central", 1000 * MIB, 20 * GIB)),
    ]);
    w.set("tokens", 10 * GIB, &["home"]);
    w.read("tokens", "Job/train", "far");
    w.run(24);
    let to_far = &w.transfers_into("far")[0];
    assert_eq!(
        to_far.status.phase,
        TransferPhase::Succeeded,
        "{:?}",
        to_far.status
    );
    assert_eq!(to_far.status.source, "mid");
}

#[test]
fn transfer_names_never_run_together() {
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("c", cluster("west", 1000 * MIB, 100 * GIB)),
        ("b-c", cluster("west", 1000 * MIB, 100 * GIB)),
    ]);
    w.set("a-b", GIB, &["archive"]);
    w.set("a", GIB, &["archive"]);
    w.read("a-b", "Job/x", "c");
    w.read("a", "Job/y", "b-c");
    w.run(2);
    let mut names: Vec<&str> = w.transfers.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn a_copy_made_again_after_eviction_goes_on_from_its_last_round() {
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("w1", cluster("west", 1000 * MIB, 100 * GIB)),
    ]);
    w.set("tokens", 10 * GIB, &["archive"]);
    w.read("tokens", "Job/a", "w1");
    w.run(8);
    assert_eq!(w.copy("tokens", "w1").unwrap().round, 1);
    assert_eq!(w.status("tokens").rounds["w1"], 1);
    // The copy is evicted, and its record goes; a reader there needs it again.
    let s = w.sets.iter_mut().find(|s| s.name == "tokens").unwrap();
    s.status.copies.retain(|c| c.cluster != "w1");
    w.now += w.settings.keep_done_seconds;
    w.run(8);
    let again = w.transfers_into("w1");
    assert_eq!(again.len(), 1, "{again:#?}");
    assert_eq!(again[0].name, "tokens-w1-2");
    assert_eq!(
        again[0].status.round, 2,
        "a member never takes round 1 again"
    );
    assert_eq!(again[0].status.base_version, 0, "the whole copy");
}

#[test]
fn a_hot_regions_copy_goes_where_the_cache_has_room_left() {
    // w1 has the bigger cache, but a copy its reader holds fills it; w2's is smaller and free.
    let mut w = World::new(&[
        ("archive", cluster("east", 1000 * MIB, 0)),
        ("w1", cluster("west", 1000 * MIB, 12 * GIB)),
        ("w2", cluster("west", 1000 * MIB, 11 * GIB)),
    ]);
    w.set("images", 10 * GIB, &["archive"]);
    w.set("tokens", 10 * GIB, &["archive"]);
    w.read("images", "Job/keep", "w1");
    w.run(8);
    assert!(w.copy("images", "w1").is_some_and(|c| c.present));
    // Two reads of tokens from the west, at a cluster without a copy of it kept.
    for job in ["Job/a", "Job/b"] {
        w.read("tokens", job, "w1");
        w.run(8);
        let s = w.sets.iter_mut().find(|s| s.name == "tokens").unwrap();
        s.readers.clear();
        w.run(2);
    }
    w.run(10);
    let cached = w.copy("tokens", "w2").expect("the hot copy at w2");
    assert!(cached.present);
    assert!(
        w.copy("images", "w1").is_some_and(|c| c.present),
        "the read copy stays"
    );
    // Settled: nothing is copied again.
    let n = w.transfers.len();
    w.run(10);
    assert_eq!(w.transfers.len(), n, "{:#?}", w.transfers);
}
