//! `orrery-bench`: Orrery's benchmarks. Each scenario prints one JSON object per line on
//! stdout (progress goes to stderr). Run in release mode:
//!
//! ```text
//! cargo run --release -p orrery-bench -- store-writes
//! cargo run --release -p orrery-bench -- store-writes --etcd
//! cargo run --release -p orrery-bench -- store-watch
//! cargo run --release -p orrery-bench -- store-memory
//! ```

use std::path::PathBuf;

use clap::{Parser, Subcommand};

mod abuse;
mod api;
mod children;
mod dns;
mod dro;
mod elastic;
mod forecast;
mod forecast_input;
mod ha;
mod hierarchy;
mod inproc;
mod members;
mod outage;
mod propagation;
mod proxy;
mod quality;
mod rbac;
mod rollout;
mod scheduler;
mod services;
mod stateful;
mod stats;
mod stci;
mod store;

/// The allocator the `orrery` binary runs with: in-process scenarios (the scheduler, the store)
/// measure what the server does.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "orrery-bench",
    about = "Orrery benchmarks (one JSON object per scenario)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Scenarios are named by area (`store-...`, `api-...`, `members-...`).
#[allow(clippy::enum_variant_names)]
#[derive(Subcommand, Debug)]
enum Command {
    /// Durable creates/s through the Store trait with 1, 16 and 256 writers, next to plain
    /// rusqlite at 1 and 256 rows per transaction on the same disk.
    StoreWrites {
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long, default_value_t = 1024)]
        bytes: usize,
        #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
        writers: Vec<usize>,
        /// Where the databases go (defaults to the system temp dir).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Also measure a single local etcd member (Debian's etcd-server).
        #[arg(long)]
        etcd: bool,
        /// Measure only Orrery's store (for profiling).
        #[arg(long)]
        skip_baselines: bool,
        /// The store's longest wait for more writes before a commit, in microseconds (the
        /// store's default when absent; 0 commits at once).
        #[arg(long)]
        commit_delay_us: Option<u64>,
    },
    /// Watch fan-out: many watchers on one prefix, latency from write to the last watcher.
    StoreWatch {
        #[arg(long, default_value_t = 1000)]
        watchers: usize,
        #[arg(long, default_value_t = 10_000)]
        writes: usize,
        #[arg(long, default_value_t = 16)]
        writers: usize,
        /// Writes per second (0: as fast as the writers go).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Resident memory with many stored objects.
    StoreMemory {
        #[arg(long, default_value_t = 100_000)]
        objects: usize,
        #[arg(long, default_value_t = 2048)]
        bytes: usize,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Clusterset DNS queries per second: the responder agents and servers run, from a
    /// directory of many services (or a running one at --addr).
    DnsQps {
        #[arg(long, default_value_t = 1000)]
        services: usize,
        #[arg(long, default_value_t = 16)]
        clients: usize,
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Ask this DNS server (an `orrery agent --dns-listen`) instead.
        #[arg(long)]
        addr: Option<std::net::SocketAddr>,
    },
    /// Hierarchies: a Deployment at the root to ready, with two and with three levels.
    HierarchyLatency {
        #[arg(long, default_value_t = 20)]
        rounds: usize,
        #[arg(long, default_value_t = 4)]
        replicas: i64,
        #[arg(long)]
        server_bin: Option<PathBuf>,
    },
    /// What misbehaving clients cost the others: a user's and an agent's latency alone and
    /// while slow bodies trickle in and idle TLS connections are held, the server's memory per
    /// idle connection, and how many it still holds past the header timeout.
    ApiSlowClients {
        /// Requests whose bodies arrive a byte every 3 s.
        #[arg(long, default_value_t = 200)]
        slow: usize,
        /// TLS connections that send nothing.
        #[arg(long, default_value_t = 3000)]
        idle: usize,
        /// Each phase's length.
        #[arg(long, default_value_t = 8)]
        seconds: u64,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The cluster proxy: latency added by the tunnel through a member's agent.
    ProxyLatency {
        #[arg(long, default_value_t = 2000)]
        requests: usize,
        #[arg(long, default_value_t = 20)]
        pods: usize,
        /// Two replicas on etcd, the agent connected to one, the proxy asked of the other
        /// (which forwards to the first).
        #[arg(long)]
        via_replica: bool,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Multi-cluster services: from a pod starting in an exporting member to its
    /// EndpointSlice applied in every consuming member.
    McsPropagation {
        #[arg(long, default_value_t = 100)]
        clusters: usize,
        #[arg(long, default_value_t = 30)]
        rounds: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The cost of one RBAC decision with many role bindings (in process).
    RbacDecision {
        #[arg(long, default_value_t = 10_000)]
        bindings: usize,
        #[arg(long, default_value_t = 1_000_000)]
        checks: usize,
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// Single-object create/update/get through the API server with concurrent clients.
    ApiCrud {
        /// Run as a user RBAC decides for, with this many other RoleBindings stored (without
        /// it: as the admin, whom RBAC does not consult).
        #[arg(long)]
        as_user_with_bindings: Option<usize>,
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long, default_value_t = 100)]
        per_client: usize,
        /// Requests per second over all clients (0: as fast as they go).
        #[arg(long, default_value_t = 0)]
        rate: u64,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// The orrery binary (defaults to the one next to this benchmark).
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// LIST of many Deployments (whole, paginated, and as a Table).
    ApiList {
        #[arg(long, default_value_t = 10_000)]
        objects: usize,
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Many watchers over HTTPS; latency from write to the last watcher.
    ApiWatch {
        #[arg(long, default_value_t = 1000)]
        watchers: usize,
        #[arg(long, default_value_t = 1000)]
        writes: usize,
        #[arg(long, default_value_t = 200)]
        rate: u64,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Registration to Ready latency of agents with fresh bootstrap tokens.
    MembersRegister {
        #[arg(long, default_value_t = 100)]
        clusters: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Leader failover on a three-member etcd with three replicas (Kubernetes' lease
    /// timings): time from `kill -9` of the leader to another replica leading.
    HaFailover {
        #[arg(long, default_value_t = 20)]
        kills: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Create throughput on a three-member etcd through one replica and through three.
    HaWrites {
        #[arg(long, default_value_t = 64)]
        clients: usize,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// One agent process hosting a fleet of simulated clusters: steady-state costs.
    MembersFleet {
        #[arg(long, default_value_t = 1000)]
        clusters: usize,
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        #[arg(long, default_value_t = 60)]
        steady_secs: u64,
        #[arg(long, default_value = "10s")]
        heartbeat: String,
        /// Server replicas: 1 on SQLite, more on a three-member etcd (an agent process per
        /// replica, each hosting its share of the clusters).
        #[arg(long, default_value_t = 1)]
        replicas: usize,
        /// The members' background load (the sim's `profile=` and `period=`): by default a
        /// day compressed into 10 minutes, so that it moves within a run (every heartbeat then
        /// carries a new usage); `profile=diurnal,period=24h` is a day as it is.
        #[arg(long, default_value = "profile=diurnal,period=600s")]
        load: String,
        /// The niceness (0-19) of the processes simulating the members. Members run on
        /// machines of their own; here they share the control plane's cores, and a niceness
        /// gives the control plane (servers and etcd) those cores first.
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=19))]
        agents_nice: u8,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Memory of one agent process for one cluster (simulated, and a member API of many nodes).
    MembersAgentMemory {
        #[arg(long, default_value_t = 5000)]
        nodes: usize,
        #[arg(long, default_value_t = 20)]
        settle_secs: u64,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Template + policy to applied in a member, one template at a time, over a fleet.
    PropagationLatency {
        #[arg(long, default_value_t = 100)]
        clusters: usize,
        #[arg(long, default_value_t = 300)]
        templates: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// A progressive rollout over four stages: a healthy revision's time against its floor,
    /// and a bad one halted in stage 2 and rolled back.
    RolloutStages {
        #[arg(long, default_value_t = 100)]
        clusters: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// A fleet-wide outage under `--eviction-rate`: the dark clusters' evictions against the
    /// set pace, and each workload's ready replicas on the live clusters (never taken down).
    OutageEviction {
        #[arg(long, default_value_t = 40)]
        clusters: usize,
        #[arg(long, default_value_t = 30)]
        dark: usize,
        #[arg(long, default_value_t = 10)]
        workloads: usize,
        /// Clusters' worth of evictions a minute.
        #[arg(long, default_value_t = 60.0)]
        rate: f64,
        #[arg(long, default_value_t = 3)]
        burst: u32,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// One policy over many existing templates: Works per second and time to FullyApplied.
    PropagationThroughput {
        #[arg(long, default_value_t = 3)]
        clusters: usize,
        #[arg(long, default_value_t = 10_000)]
        templates: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// A restart with every template placed and applied: time to serving, time until every
    /// controller is synced and idle, and the operations the members carried out (goal 0).
    PropagationRestart {
        #[arg(long, default_value_t = 100)]
        clusters: usize,
        #[arg(long, default_value_t = 10_000)]
        templates: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The binding controller alone: scheduled bindings already stored, Works written per
    /// second (SQLite store, in this process).
    PropagationWorks {
        #[arg(long, default_value_t = 3)]
        clusters: usize,
        #[arg(long, default_value_t = 10_000)]
        templates: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// The scheduling engine alone: decisions per second and latency per decision.
    SchedulerEngine {
        #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
        clusters: Vec<usize>,
        #[arg(long, default_value_t = 100_000)]
        bindings: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Also split the same work over this many threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Every cluster has a forecast with a season of history, so decisions judge clusters
        /// by it (the cost of scheduling ahead).
        #[arg(long)]
        forecasts: bool,
    },
    /// Data-aware scheduling: four strategies on one trace of jobs reading data sets over a
    /// simulated fleet (completion time, bytes moved, egress cost, GPU utilization).
    Stci {
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 500)]
        jobs: usize,
    },
    /// Forecasts of simulated members' load (diurnal, with a trend, spikes, flat with noise):
    /// MASE, sMAPE and interval coverage of the model Orrery chooses, against naive and
    /// seasonal naive, 1 and 6 hours ahead.
    ForecastAccuracy {
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Days of history before the first forecast.
        #[arg(long, default_value_t = 14)]
        history: usize,
        /// Days forecast, from an origin each hour.
        #[arg(long, default_value_t = 3)]
        test: usize,
        /// Points of history each forecast is made from (the newest; all when not given), as
        /// the server's forecaster keeps fewer at scale (`forecast-load`'s
        /// `history_points_kept`).
        #[arg(long, value_parser = clap::value_parser!(u64).range(2..))]
        window: Option<u64>,
        /// Hours between two choices of a series' model (the server's: one). With `--input`,
        /// when given, the model at an origin is the one chosen at the last multiple of it
        /// since the series' first sample, on the history then (not given: chosen at every
        /// origin).
        #[arg(long)]
        choose_every: Option<usize>,
        /// Series of your own instead of the simulator's: a CSV of `series_id,timestamp,value`
        /// (timestamps RFC 3339 or unix seconds, evenly spaced), forecast at rolling origins as
        /// `crates/bench/peers/run_statsforecast.py` forecasts them.
        #[arg(long)]
        input: Option<std::path::PathBuf>,
        /// With `--input`: origins per series, the last one the largest horizon before its end.
        #[arg(long, default_value_t = 15)]
        origins: usize,
        /// With `--input`: steps between two origins.
        #[arg(long, default_value_t = 20)]
        stride: usize,
        /// With `--input`: samples per season (a day of the file's step when not given).
        #[arg(long)]
        season: Option<usize>,
        /// With `--input`: samples per long season, a week (7 seasons) when not given, as
        /// the server; 0 for none. The MSTL models take it where two of it precede a
        /// backtest's folds and it forecast them better.
        #[arg(long)]
        long_season: Option<usize>,
        /// With `--input`: the horizons scored, in steps (a forecast is made to the largest).
        #[arg(long, value_delimiter = ',', default_value = "12,72")]
        horizons: Vec<usize>,
        /// With `--input`: this model at every origin instead of the one chosen (naive,
        /// seasonal-naive, ets, mstl-ets, mstl-ar).
        #[arg(long)]
        fixed: Option<String>,
        /// With `--input`: only the first this many series.
        #[arg(long)]
        limit_series: Option<usize>,
    },
    /// A FederatedHPA reactive vs predictive over simulated business days: minutes
    /// under-provisioned and replica-hours (Orrery's autoscaler code on a simulated clock).
    Elastic {
        #[arg(long, value_delimiter = ',', default_value = "1,2,3,4,5")]
        seeds: Vec<u64>,
        /// Days before the measured ones (the predictive one forecasts after a day and a
        /// quarter).
        #[arg(long, default_value_t = 2)]
        history: usize,
        /// Days measured.
        #[arg(long, default_value_t = 3)]
        test: usize,
        /// Seconds from a pod being asked for to its being ready.
        #[arg(long, default_value_t = 120)]
        pod_start: i64,
        /// The predictive one's `predictive.horizon`.
        #[arg(long, default_value = "10m")]
        horizon: String,
        /// Its `predictive.bound`.
        #[arg(long, default_value = "Mean")]
        bound: String,
    },
    /// What forecasting a fleet costs the server's forecaster: memory for the history of
    /// 1,000 clusters × 5 series, CPU per minute of its rounds.
    ForecastLoad {
        #[arg(long, default_value_t = 1000)]
        clusters: usize,
        /// Days of 5-minute history each series holds.
        #[arg(long, default_value_t = 14)]
        days: usize,
        /// Clusters whose rounds are timed.
        #[arg(long, default_value_t = 20)]
        timed: usize,
        /// The forecaster's budget for its history (the server's `--forecast-history-mib`).
        #[arg(long, default_value_t = orrery_controllers::forecasting::DEFAULT_HISTORY_BYTES >> 20)]
        history_mib: usize,
    },
    /// Scheduling quality: eight strategies on one trace over a simulated fleet (Orrery with
    /// and without prediction, with prices weighed and with consolidation among them).
    SchedulerQuality {
        #[arg(long, default_value_t = 1)]
        seed: u64,
        #[arg(long, default_value_t = 50)]
        clusters: usize,
        /// Five-minute steps (288 = one day).
        #[arg(long, default_value_t = 288)]
        steps: usize,
        /// Water level above which Orrery's clusters shed replicas (the server's `--shed-mark`).
        #[arg(long, default_value_t = orrery_scheduler::DEFAULT_SHED_MARK)]
        shed_mark: f64,
        /// How far each cluster's background load swings over the day, as a multiple of the
        /// default (±5–20 % of capacity around its base).
        #[arg(long, default_value_t = 1.0)]
        swing: f64,
    },
    /// The scheduling controller over a real store: bindings decided per second, then the
    /// latency of single decisions arriving at a steady rate.
    SchedulerService {
        #[arg(long, value_delimiter = ',', default_value = "100,1000,5000")]
        clusters: Vec<usize>,
        #[arg(long, default_value_t = 100_000)]
        bindings: usize,
        /// Bindings created one by one after the bulk, for the latency per decision.
        #[arg(long, default_value_t = 2000)]
        latency_bindings: usize,
        /// Their arrival rate, per second.
        #[arg(long, default_value_t = 500)]
        latency_rate: u64,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// DRO-DS metrics ingestion: many clusters each reporting every second.
    DroMetrics {
        #[arg(long, default_value_t = 1000)]
        clusters: usize,
        #[arg(long, default_value_t = 30)]
        seconds: u64,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// DRO-DS status batches of many objects.
    DroBatch {
        #[arg(long, default_value_t = 1000)]
        objects: usize,
        #[arg(long, default_value_t = 50)]
        requests: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Planned moves of a StatefulSet: end to end on two simulated members (downtime, the
    /// control plane's latency per hop), then modelled at 10 GiB, 100 GiB and 1 TiB over the
    /// link at several write rates, against stop-and-copy and Karmada's re-creation.
    StatefulMigration {
        /// Moves end to end.
        #[arg(long, default_value_t = 5)]
        runs: usize,
        #[arg(long, value_delimiter = ',', default_value = "10,100,1024")]
        sizes_gib: Vec<u64>,
        #[arg(long, value_delimiter = ',', default_value = "0,1,20")]
        write_percents: Vec<f64>,
        /// Bytes per second of the link (1 Gbit/s).
        #[arg(long, default_value_t = 125_000_000.0)]
        link: f64,
        /// Seconds a pod takes to start, in the model.
        #[arg(long, default_value_t = 5.0)]
        pod_start: f64,
        #[arg(long)]
        server_bin: Option<PathBuf>,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Internal: the fresh process of `store-memory`.
    #[command(hide = true)]
    StoreMemoryProbe { path: String },
}

/// Runs one scenario: a data table, an arm per command handing its flags to its scenario.
fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        children::stop_on_signals()?;
        match cli.command {
            Command::StoreWrites {
                runs,
                seconds,
                bytes,
                writers,
                dir,
                etcd,
                skip_baselines,
                commit_delay_us,
            } => {
                store::writes(store::WriteArgs {
                    runs,
                    seconds,
                    bytes,
                    writers,
                    dir,
                    etcd,
                    skip_baselines,
                    commit_delay: commit_delay_us.map(std::time::Duration::from_micros),
                })
                .await
            }
            Command::StoreWatch {
                watchers,
                writes,
                writers,
                rate,
                runs,
                dir,
            } => {
                store::fanout(store::FanoutArgs {
                    watchers,
                    writes,
                    writers,
                    rate,
                    runs,
                    dir,
                })
                .await
            }
            Command::StoreMemory {
                objects,
                bytes,
                dir,
            } => {
                store::memory(store::MemoryArgs {
                    objects,
                    bytes,
                    dir,
                })
                .await
            }
            Command::StoreMemoryProbe { path } => store::memory_probe(&path).await,
            Command::StatefulMigration {
                runs,
                sizes_gib,
                write_percents,
                link,
                pod_start,
                server_bin,
                dir,
            } => {
                stateful::run(stateful::Args {
                    runs,
                    sizes_gib,
                    write_percents,
                    link,
                    pod_start,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::DroMetrics {
                clusters,
                seconds,
                runs,
                server_bin,
                dir,
            } => {
                dro::metrics(dro::MetricsArgs {
                    clusters,
                    seconds,
                    runs,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::DroBatch {
                objects,
                requests,
                runs,
                server_bin,
                dir,
            } => {
                dro::batch(dro::BatchArgs {
                    objects,
                    requests,
                    runs,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::Stci { seed, jobs } => stci::stci(stci::StciArgs { seed, jobs }),
            Command::ForecastAccuracy {
                seed: _,
                history: _,
                test: _,
                window: _,
                choose_every,
                input: Some(path),
                origins,
                stride,
                season,
                long_season,
                horizons,
                fixed,
                limit_series,
            } => forecast_input::run(forecast_input::InputArgs {
                path,
                origins,
                stride,
                season,
                long_season,
                horizons,
                fixed: fixed
                    .map(|m| {
                        orrery_forecast::Model::named(&m).ok_or_else(|| {
                            anyhow::anyhow!(
                                "--fixed: one of naive, seasonal-naive, ets, mstl-ets, mstl-ar"
                            )
                        })
                    })
                    .transpose()?,
                limit: limit_series,
                choose_every_hours: choose_every,
            }),
            Command::ForecastAccuracy {
                seed,
                history,
                test,
                window,
                choose_every,
                ..
            } => forecast::forecast_accuracy(forecast::ForecastArgs {
                seed,
                history,
                test,
                window: window.map(|w| w as usize),
                choose_every: choose_every.unwrap_or(1),
            }),
            Command::Elastic {
                seeds,
                history,
                test,
                pod_start,
                horizon,
                bound,
            } => elastic::elastic(elastic::ElasticArgs {
                seeds,
                history,
                test,
                pod_start_seconds: pod_start,
                horizon,
                bound,
            }),
            Command::ForecastLoad {
                clusters,
                days,
                timed,
                history_mib,
            } => forecast::forecast_load(forecast::LoadArgs {
                clusters,
                days,
                timed,
                history_bytes: history_mib.saturating_mul(1 << 20),
            }),
            Command::SchedulerQuality {
                seed,
                clusters,
                steps,
                shed_mark,
                swing,
            } => quality::quality(quality::QualityArgs {
                seed,
                clusters,
                steps,
                shed_mark,
                swing,
            }),
            Command::SchedulerService {
                clusters,
                bindings,
                latency_bindings,
                latency_rate,
                runs,
                dir,
            } => {
                scheduler::service(scheduler::ServiceArgs {
                    clusters,
                    bindings,
                    latency_bindings,
                    latency_rate,
                    runs,
                    dir,
                })
                .await
            }
            Command::SchedulerEngine {
                clusters,
                bindings,
                runs,
                threads,
                forecasts,
            } => scheduler::engine(scheduler::EngineArgs {
                clusters,
                bindings,
                runs,
                threads,
                forecasts,
            }),
            Command::MembersRegister {
                clusters,
                server_bin,
                dir,
            } => {
                members::register(members::RegisterArgs {
                    clusters,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::OutageEviction {
                clusters,
                dark,
                workloads,
                rate,
                burst,
                server_bin,
                dir,
            } => {
                outage::run(outage::Args {
                    clusters,
                    dark,
                    workloads,
                    rate,
                    burst,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::RolloutStages {
                clusters,
                server_bin,
                dir,
            } => {
                rollout::run(propagation::Args {
                    clusters,
                    templates: 1,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::PropagationLatency {
                clusters,
                templates,
                server_bin,
                dir,
            } => {
                propagation::latency(propagation::Args {
                    clusters,
                    templates,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::PropagationWorks {
                clusters,
                templates,
                runs,
                dir,
            } => {
                propagation::works(propagation::WorksArgs {
                    clusters,
                    templates,
                    runs,
                    dir,
                })
                .await
            }
            Command::PropagationRestart {
                clusters,
                templates,
                runs,
                server_bin,
                dir,
            } => {
                propagation::restart(propagation::RestartArgs {
                    clusters,
                    templates,
                    runs,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::PropagationThroughput {
                clusters,
                templates,
                server_bin,
                dir,
            } => {
                propagation::throughput(propagation::Args {
                    clusters,
                    templates,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::HaFailover {
                kills,
                server_bin,
                dir,
            } => {
                ha::failover(ha::FailoverArgs {
                    kills,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::HaWrites {
                clients,
                seconds,
                runs,
                server_bin,
                dir,
            } => {
                ha::writes(ha::WritesArgs {
                    clients,
                    seconds,
                    runs,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::MembersFleet {
                clusters,
                nodes,
                steady_secs,
                heartbeat,
                replicas,
                load,
                agents_nice,
                server_bin,
                dir,
            } => {
                members::fleet(members::FleetArgs {
                    clusters,
                    nodes,
                    steady_secs,
                    heartbeat,
                    replicas,
                    load,
                    agents_nice,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::MembersAgentMemory {
                nodes,
                settle_secs,
                server_bin,
                dir,
            } => {
                members::agent_memory(members::AgentMemoryArgs {
                    nodes,
                    settle_secs,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::RbacDecision {
                bindings,
                checks,
                runs,
            } => rbac::decisions(bindings, checks, runs),
            Command::HierarchyLatency {
                rounds,
                replicas,
                server_bin,
            } => {
                hierarchy::latency(hierarchy::Args {
                    rounds,
                    replicas,
                    server_bin,
                })
                .await
            }
            Command::ApiSlowClients {
                slow,
                idle,
                seconds,
                runs,
                server_bin,
                dir,
            } => {
                abuse::slow_clients(abuse::Args {
                    slow,
                    idle,
                    seconds,
                    runs,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::ProxyLatency {
                requests,
                pods,
                via_replica,
                server_bin,
                dir,
            } => {
                proxy::latency(proxy::Args {
                    requests,
                    pods,
                    via_replica,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::McsPropagation {
                clusters,
                rounds,
                server_bin,
                dir,
            } => {
                services::propagation(services::Args {
                    clusters,
                    rounds,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::DnsQps {
                services,
                clients,
                seconds,
                runs,
                addr,
            } => {
                dns::qps(dns::Args {
                    services,
                    clients,
                    seconds,
                    runs,
                    addr,
                })
                .await
            }
            Command::ApiCrud {
                as_user_with_bindings,
                clients,
                per_client,
                rate,
                runs,
                server_bin,
                dir,
            } => {
                api::crud(api::CrudArgs {
                    as_user_with_bindings,
                    clients,
                    per_client,
                    rate,
                    runs,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::ApiList {
                objects,
                runs,
                server_bin,
                dir,
            } => {
                api::list(api::ListArgs {
                    objects,
                    runs,
                    server_bin,
                    dir,
                })
                .await
            }
            Command::ApiWatch {
                watchers,
                writes,
                rate,
                runs,
                server_bin,
                dir,
            } => {
                api::watch(api::WatchArgs {
                    watchers,
                    writes,
                    rate,
                    runs,
                    server_bin,
                    dir,
                })
                .await
            }
        }
    });
    // Scenarios leave watchers and readers running; the figures are out, so end now rather
    // than wait for every task to notice (a process left behind skews the next run).
    rt.shutdown_background();
    result
}
