//! What a simulated cluster is made of (`--simulate nodes=8,cpu=32,...`) and how its background
//! load varies: the spec, its parsing, the load profiles and the latency between regions.

use crate::hash_value;
use orrery_api::Quantity;
use serde_json::Value;
use serde_json::json;
use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

/// How a simulated cluster's background load varies over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    Flat,
    Diurnal,
    Spikes,
}

/// The `--simulate` specification: per-node capacity, node count, load.
#[derive(Debug, Clone, PartialEq)]
pub struct SimSpec {
    pub nodes: usize,
    pub cpu: Quantity,
    pub memory: Quantity,
    pub gpu: i64,
    pub pods: i64,
    /// Base background load, a fraction of capacity.
    pub load: f64,
    pub profile: Profile,
    /// The period of the diurnal profile (and the spike cycle).
    pub period: Duration,
    /// How much the load grows each period, a share of the base load (`trend=`).
    pub trend: f64,
    /// The standard deviation of the load's noise, a share of the base load (`noise=`).
    pub noise: f64,
    /// How much of the noise of one 96th of the period carries into the next (`persistence=`,
    /// 0.9 by default: a busy morning stays busy for hours, as real load does; 0: independent
    /// draws).
    pub persistence: f64,
    /// How long a scheduled pod takes to become Running.
    pub start_delay: Duration,
    /// How long a Job's pod runs before it succeeds.
    pub job_duration: Duration,
    /// The data uplink, bytes per second, shared by the member's volume transfers.
    pub bandwidth: i64,
    /// The storage classes the member offers; the first is its default.
    pub storage_classes: Vec<String>,
    /// The GPU model of its nodes, and its performance against the reference GPU (reported
    /// as the properties `gpu.orrery.io/model` and `gpu.orrery.io/performance`).
    pub gpu_model: String,
    pub gpu_performance: Option<f64>,
    /// The price of a GiB leaving the member (`cost.orrery.io/egress-per-gib`).
    pub egress_per_gib: Option<f64>,
    /// Its prices, reported as the `cost.orrery.io/...` properties: per core-hour
    /// (`cpuCoreHour=`), per GiB-hour of memory (`memoryGiBHour=`), per GPU-hour (`gpuHour=`),
    /// its capacity type (`capacityType=on-demand|spot`) and, for spot, the share of its
    /// replicas interrupted in an hour (`interruptionRate=`).
    pub prices: BTreeMap<&'static str, String>,
    /// Bytes of its cache tier for copies of data sets (`cache.orrery.io/capacity`).
    pub cache: Option<Quantity>,
    /// What the paths to other clusters carry, bytes per second, where they are slower than
    /// both uplinks (`path.<cluster>=`).
    pub paths: BTreeMap<String, i64>,
}

/// How much of the load's noise carries from one 96th of the period to the next.
pub const DEFAULT_PERSISTENCE: f64 = 0.9;

/// The default data uplink: 1 Gbit/s.
pub const DEFAULT_BANDWIDTH: i64 = 125 << 20;

impl Default for SimSpec {
    fn default() -> Self {
        SimSpec {
            nodes: 8,
            cpu: Quantity::from_int(32, orrery_api::Format::DecimalSI),
            memory: Quantity::from_int(128 << 30, orrery_api::Format::BinarySI),
            gpu: 0,
            pods: 110,
            load: 0.3,
            profile: Profile::Flat,
            period: Duration::from_secs(24 * 3600),
            trend: 0.0,
            noise: 0.0,
            persistence: DEFAULT_PERSISTENCE,
            start_delay: Duration::from_millis(500),
            job_duration: Duration::from_secs(5),
            bandwidth: DEFAULT_BANDWIDTH,
            storage_classes: vec!["standard".into()],
            gpu_model: String::new(),
            gpu_performance: None,
            egress_per_gib: None,
            prices: BTreeMap::new(),
            cache: None,
            paths: BTreeMap::new(),
        }
    }
}

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    orrery_api::duration::parse(s).map_err(|e| e.to_string())
}

impl FromStr for SimSpec {
    type Err = String;

    /// `nodes=8,cpu=32,memory=128Gi,gpu=0,pods=110,load=0.3,profile=flat` (any subset; also
    /// `period=`, `start=` and `job=` durations, `trend=` and `noise=` shares of the base
    /// load, `bandwidth=` a quantity of bytes per second,
    /// `storageclasses=` names separated by `:`, the default first, `gpuModel=`, `gpuPerf=` a
    /// factor against the reference GPU, `egressPerGiB=` a price, `cpuCoreHour=`,
    /// `memoryGiBHour=`, `gpuHour=` prices, `capacityType=` on-demand or spot and
    /// `interruptionRate=` (spot: the share interrupted in an hour), `cache=` a quantity of
    /// bytes, and `path.<cluster>=` what the path to that cluster carries, bytes per second).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut spec = SimSpec::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?} is not key=value"))?;
            spec.set(k, v)?;
        }
        let (_, errs) =
            orrery_api::cost::Prices::of(spec.prices.iter().map(|(k, v)| (*k, v.as_str())));
        if let Some(e) = errs.first() {
            return Err(format!("invalid prices: {e}"));
        }
        Ok(spec)
    }
}

impl SimSpec {
    /// What each node has and how many there are: `nodes`, `cpu`, `memory`, `gpu`, `pods`, `gpuModel`.
    /// Other keys are not sent here (`set` dispatches by key).
    fn set_size(&mut self, k: &str, v: &str, bad: &dyn Fn(&str) -> String) -> Result<(), String> {
        match k {
            "nodes" => {
                self.nodes = v.parse().map_err(|_| bad("a node count"))?;
                if self.nodes == 0 || self.nodes > 100_000 {
                    return Err(bad("between 1 and 100000"));
                }
            }
            "cpu" | "memory" => {
                let q: Quantity = v.parse().map_err(|e| bad(&format!("{e}")))?;
                if q.is_negative() || q.is_zero() {
                    return Err(bad("must be positive"));
                }
                if k == "cpu" {
                    self.cpu = q;
                } else {
                    self.memory = q;
                }
            }
            "gpu" | "pods" => {
                let n: i64 = v.parse().map_err(|_| bad("a whole number"))?;
                if n < 0 {
                    return Err(bad("must not be negative"));
                }
                if k == "gpu" {
                    self.gpu = n;
                } else {
                    self.pods = n;
                }
            }
            "gpuModel" => {
                if v.is_empty() || v.len() > 63 || v.contains(char::is_whitespace) {
                    return Err(bad("a model name such as NVIDIA-H100-80GB-HBM3"));
                }
                self.gpu_model = v.to_string();
            }
            _ => {}
        }
        Ok(())
    }

    /// The load its users put on it: `load`, `profile`, `period`, `persistence`, `trend`, `noise`.
    /// Other keys are not sent here (`set` dispatches by key).
    fn set_load(&mut self, k: &str, v: &str, bad: &dyn Fn(&str) -> String) -> Result<(), String> {
        match k {
            "load" => {
                let f: f64 = v.parse().map_err(|_| bad("a fraction"))?;
                if !(0.0..=1.0).contains(&f) {
                    return Err(bad("between 0 and 1"));
                }
                self.load = f;
            }
            "profile" => {
                self.profile = match v {
                    "flat" => Profile::Flat,
                    "diurnal" => Profile::Diurnal,
                    "spikes" => Profile::Spikes,
                    _ => return Err(bad("one of flat, diurnal, spikes")),
                }
            }
            "period" => self.period = parse_duration(v)?.max(Duration::from_secs(1)),
            "persistence" => {
                let f: f64 = v
                    .parse()
                    .ok()
                    .filter(|f: &f64| (0.0..1.0).contains(f))
                    .ok_or_else(|| bad("a fraction from 0 up to (not including) 1"))?;
                self.persistence = f;
            }
            "trend" | "noise" => {
                let f: f64 = v
                    .parse()
                    .ok()
                    .filter(|f: &f64| f.is_finite())
                    .ok_or_else(|| bad("a number"))?;
                if k == "trend" {
                    if !(-1.0..=1.0).contains(&f) {
                        return Err(bad(
                            "between -1 and 1 (a share of the base load per period)",
                        ));
                    }
                    self.trend = f;
                } else {
                    if !(0.0..=1.0).contains(&f) {
                        return Err(bad("between 0 and 1"));
                    }
                    self.noise = f;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Its storage and links: `cache`, `bandwidth`, `storageclasses`.
    /// Other keys are not sent here (`set` dispatches by key).
    fn set_storage(
        &mut self,
        k: &str,
        v: &str,
        bad: &dyn Fn(&str) -> String,
    ) -> Result<(), String> {
        match k {
            "cache" => {
                let q: Quantity = v.parse().map_err(|e| bad(&format!("{e}")))?;
                if q.is_negative() {
                    return Err(bad("must not be negative"));
                }
                self.cache = Some(q);
            }
            "bandwidth" => {
                let q: Quantity = v.parse().map_err(|e| bad(&format!("{e}")))?;
                if q.value() < 1 {
                    return Err(bad("must be at least 1 byte per second"));
                }
                self.bandwidth = q.value() as i64;
            }
            "storageclasses" => {
                let classes: Vec<String> = v
                    .split(':')
                    .map(str::trim)
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect();
                if classes.is_empty() {
                    return Err(bad("one or more names separated by ':'"));
                }
                for c in &classes {
                    if let Some(m) = orrery_api::validation::is_dns1123_subdomain(c).first() {
                        return Err(bad(m));
                    }
                }
                self.storage_classes = classes;
            }
            _ => {}
        }
        Ok(())
    }

    /// Its prices and what a GPU of it does: the `cost.orrery.io` keys, `gpuPerf`, `egressPerGiB`.
    /// Other keys are not sent here (`set` dispatches by key).
    fn set_prices(&mut self, k: &str, v: &str, bad: &dyn Fn(&str) -> String) -> Result<(), String> {
        match k {
            "cpuCoreHour" | "memoryGiBHour" | "gpuHour" | "capacityType" | "interruptionRate"
            | "currency" => {
                use orrery_api::cost as c;
                let key = match k {
                    "cpuCoreHour" => c::CPU_CORE_HOUR,
                    "memoryGiBHour" => c::MEMORY_GIB_HOUR,
                    "gpuHour" => c::GPU_HOUR,
                    "capacityType" => c::CAPACITY_TYPE,
                    "currency" => c::CURRENCY,
                    _ => c::INTERRUPTION_RATE,
                };
                self.prices.insert(key, v.to_string());
                let (_, errs) = c::Prices::of(self.prices.iter().map(|(k, v)| (*k, v.as_str())));
                // Whether a rate goes with spot capacity is checked once all is read.
                if let Some(e) = errs.iter().find(|e| **e != c::PriceError::RateOnDemand) {
                    return Err(bad(&e.to_string()));
                }
            }
            "gpuPerf" | "egressPerGiB" => {
                let f: f64 = v
                    .parse()
                    .ok()
                    .filter(|f: &f64| f.is_finite() && *f >= 0.0)
                    .ok_or_else(|| bad("a number of at least 0"))?;
                if k == "gpuPerf" {
                    if f == 0.0 {
                        return Err(bad("must be above 0"));
                    }
                    self.gpu_performance = Some(f);
                } else {
                    self.egress_per_gib = Some(f);
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// `path.<cluster>=RATE`: what the path to that cluster carries.
    fn set_path(
        &mut self,
        peer: &str,
        v: &str,
        bad: &dyn Fn(&str) -> String,
    ) -> Result<(), String> {
        if let Some(m) = orrery_api::validation::is_dns1123_subdomain(peer).first() {
            return Err(bad(&format!("the cluster name: {m}")));
        }
        let q: Quantity = v.parse().map_err(|e| bad(&format!("{e}")))?;
        if q.value() < 1 {
            return Err(bad("must be at least 1 byte per second"));
        }
        self.paths.insert(peer.to_string(), q.value() as i64);
        Ok(())
    }

    /// One `key=value` setting.
    fn set(&mut self, k: &str, v: &str) -> Result<(), String> {
        let bad = |what: &str| format!("invalid {k}={v:?}: {what}");
        match k {
            "nodes" | "cpu" | "memory" | "gpu" | "pods" | "gpuModel" => {
                self.set_size(k, v, &bad)?
            }
            "load" | "profile" | "period" | "persistence" | "trend" | "noise" => {
                self.set_load(k, v, &bad)?
            }
            "cache" | "bandwidth" | "storageclasses" => self.set_storage(k, v, &bad)?,
            "cpuCoreHour" | "memoryGiBHour" | "gpuHour" | "capacityType" | "interruptionRate"
            | "currency" | "gpuPerf" | "egressPerGiB" => self.set_prices(k, v, &bad)?,
            "start" => self.start_delay = parse_duration(v)?,
            "job" => self.job_duration = parse_duration(v)?,
            _ if k.starts_with("path.") => self.set_path(&k["path.".len()..], v, &bad)?,
            _ => {
                return Err(format!(
                    "unknown simulation setting {k:?} (known: nodes, cpu, memory, gpu, pods, load, profile, period, trend, noise, persistence, start, job, bandwidth, storageclasses, gpuModel, gpuPerf, egressPerGiB, cpuCoreHour, memoryGiBHour, gpuHour, capacityType, interruptionRate, cache, path.<cluster>)"
                ));
            }
        }
        Ok(())
    }
}

/// The cpu a workload's users in this member ask of it, over wall-clock time (so every member
/// and the control plane agree on the phase): traffic routed to the nearest cluster that
/// runs it, and spread evenly over its ready pods there.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadProfile {
    pub profile: Profile,
    pub period: Duration,
    /// Millicores asked at the peak, and at the trough.
    pub peak_m: i64,
    pub base_m: i64,
}

/// Pod template annotations: the shape of a workload's demand (`flat`, `diurnal`, `spikes`),
/// its period (default 24h), the cpu asked at the peak in each member it runs in, and at the
/// trough (default a quarter of the peak). A diurnal demand is at its trough at the start of
/// each period (counted from the Unix epoch) and at its peak halfway.
pub const LOAD_PROFILE_ANNOTATION: &str = "sim.orrery.io/load-profile";
pub const LOAD_PERIOD_ANNOTATION: &str = "sim.orrery.io/load-period";
pub const LOAD_PEAK_ANNOTATION: &str = "sim.orrery.io/load-peak";
pub const LOAD_BASE_ANNOTATION: &str = "sim.orrery.io/load-base";

/// How far a pod's usage may go beyond its cpu request (it bursts into the node's spare room).
pub(crate) const BURST: f64 = 2.0;

impl LoadProfile {
    pub(crate) fn of(annotations: Option<&Value>) -> Option<LoadProfile> {
        let a = annotations?;
        let get = |k: &str| a.get(k).and_then(Value::as_str);
        let profile = match get(LOAD_PROFILE_ANNOTATION)? {
            "flat" => Profile::Flat,
            "diurnal" => Profile::Diurnal,
            "spikes" => Profile::Spikes,
            _ => return None,
        };
        let period = get(LOAD_PERIOD_ANNOTATION)
            .and_then(|p| parse_duration(p).ok())
            .filter(|p| !p.is_zero())
            .unwrap_or(Duration::from_secs(24 * 3600));
        let milli = |k: &str| {
            get(k)
                .and_then(|q| q.parse::<Quantity>().ok())
                .map(|q| q.milli_value() as i64)
        };
        let peak_m = milli(LOAD_PEAK_ANNOTATION)?.max(0);
        let base_m = milli(LOAD_BASE_ANNOTATION)
            .unwrap_or(peak_m / 4)
            .clamp(0, peak_m);
        Some(LoadProfile {
            profile,
            period,
            peak_m,
            base_m,
        })
    }

    /// The usage figures change once per window: a 288th of the period, at least a second.
    pub(crate) fn window(&self) -> Duration {
        (self.period / 288).max(Duration::from_secs(1))
    }

    pub(crate) fn window_at(&self, unix: Duration) -> u64 {
        (unix.as_millis() / self.window().as_millis().max(1)) as u64
    }

    /// Millicores asked at wall-clock time `unix` (since the epoch), as of its window's start.
    pub fn demand_m(&self, unix: Duration) -> i64 {
        let w = self.window_at(unix);
        let t = (w as u128 * self.window().as_millis()) as f64 / 1000.0;
        let period = self.period.as_secs_f64();
        let phase = (t % period) / period;
        let share = match self.profile {
            Profile::Flat => 1.0,
            Profile::Diurnal => (1.0 - (2.0 * std::f64::consts::PI * phase).cos()) / 2.0,
            Profile::Spikes => {
                let slot = (t / (period / 24.0)) as u64;
                if hash_value(&json!(["load", slot])).is_multiple_of(7) {
                    1.0
                } else {
                    0.0
                }
            }
        };
        self.base_m + ((self.peak_m - self.base_m) as f64 * share).round() as i64
    }
}

/// The multiplier of a simulation's base load `elapsed` into it: its profile (flat; diurnal,
/// a sine of ±60 % over the period; spikes, 2.5× in about one of 24 windows a period), plus
/// its trend (a share of the base load per period, added as time goes) and its noise (a
/// standard normal deviate per 1/96 of the period, each carrying `persistence` of the one
/// before, times `noise`), both fixed by `seed`. Never below 0.
pub fn profile_factor(spec: &SimSpec, seed: u64, elapsed: Duration) -> f64 {
    let t = elapsed.as_secs_f64();
    let period = spec.period.as_secs_f64();
    let shape = match spec.profile {
        Profile::Flat => 1.0,
        Profile::Diurnal => 1.0 + 0.6 * (2.0 * std::f64::consts::PI * t / period).sin(),
        Profile::Spikes => {
            // 24 windows per period; about one in seven spikes, chosen by the seed.
            let window = (t / (period / 24.0)) as u64;
            let h = hash_value(&json!([seed, window]));
            if h.is_multiple_of(7) { 2.5 } else { 1.0 }
        }
    };
    let trend = spec.trend * t / period;
    let noise = if spec.noise > 0.0 {
        let window = (t / (period / 96.0)) as u64;
        spec.noise * persistent_noise(seed, window, spec.persistence)
    } else {
        0.0
    };
    (shape + trend + noise).max(0.0)
}

/// A standard normal deviate per window, each the last's times `rho` plus a fresh draw (an
/// AR(1) process, unit variance): the sum of the fresh draws of the windows before it, each
/// weighed by `rho` to its age, so any window is computed alone. Draws older than where the
/// weight falls below 1/1000 (at most 200 windows) are left out, and the sum is scaled to unit
/// variance.
pub(crate) fn persistent_noise(seed: u64, window: u64, rho: f64) -> f64 {
    let rho = rho.clamp(0.0, 0.999);
    let terms = if rho > 0.0 {
        ((1e-3f64.ln() / rho.ln()).ceil() as u64).clamp(1, 200)
    } else {
        1
    };
    let (mut sum, mut norm, mut w) = (0.0, 0.0, 1.0);
    for age in 0..terms.min(window + 1) {
        sum += w * standard_normal(seed, window - age);
        norm += w * w;
        w *= rho;
    }
    if norm > 0.0 { sum / norm.sqrt() } else { 0.0 }
}

/// A standard normal deviate fixed by `seed` and `window` (Box-Muller over two uniforms from
/// SplitMix64).
pub(crate) fn standard_normal(seed: u64, window: u64) -> f64 {
    let mix = |mut z: u64| {
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let base = mix(seed ^ mix(window));
    let uniform = |k: u64| ((mix(base ^ k) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let (u, v) = (uniform(1), uniform(2));
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// The simulated round-trip latency between two clusters, milliseconds: 2 within a region,
/// 30 to 150 (stable per pair) between regions.
pub fn region_latency(a: &str, region_a: &str, b: &str, region_b: &str) -> f64 {
    if region_a == region_b {
        2.0
    } else {
        // The same both ways.
        let (x, y) = if a < b { (a, b) } else { (b, a) };
        30.0 + (hash_value(&json!([x, y])) % 120) as f64
    }
}
