//! Prices of member clusters and a placement's `cost` block (the draft's multi-cloud cost
//! models and cost-performance-optimised scheduling, 4.2.6).
//!
//! A cluster's prices are properties: KEP-2149 ClusterProperty objects its member reports
//! (`status.properties`), overridden key by key by the Cluster's own `spec.properties` (what
//! the platform team knows of its contract). Prices are per hour, in whatever currency the
//! fleet's prices share; Orrery never converts between currencies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::validation::{ErrorList, FieldError};

pub const CPU_CORE_HOUR: &str = "cost.orrery.io/cpu-core-hour";
pub const MEMORY_GIB_HOUR: &str = "cost.orrery.io/memory-gib-hour";
pub const GPU_HOUR: &str = "cost.orrery.io/gpu-hour";
pub const EGRESS_PER_GIB: &str = "cost.orrery.io/egress-per-gib";
pub const CAPACITY_TYPE: &str = "cost.orrery.io/capacity-type";
/// For spot capacity: the share of its replicas interrupted in an hour, 0 to 1.
pub const INTERRUPTION_RATE: &str = "cost.orrery.io/interruption-rate";
/// The currency of a cluster's prices, an ISO 4217 code (`USD`, `EUR`): shown beside costs,
/// never converted.
pub const CURRENCY: &str = "cost.orrery.io/currency";
/// KubeFleet's (Azure property provider's) hourly price of a core, read when Orrery's own is
/// absent.
pub const FLEET_CPU_CORE: &str = "kubernetes.azure.com/per-cpu-core-cost";
/// KubeFleet's hourly price of a GiB of memory, read when Orrery's own is absent.
pub const FLEET_MEMORY_GIB: &str = "kubernetes.azure.com/per-gb-memory-cost";

pub const ON_DEMAND: &str = "on-demand";
pub const SPOT: &str = "spot";

/// The largest weight a placement may give cost.
pub const MAX_WEIGHT: f64 = 10.0;

/// Whether a cluster's capacity can be taken back by its provider.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Capacity {
    #[default]
    OnDemand,
    Spot,
}

impl Capacity {
    pub fn as_str(self) -> &'static str {
        match self {
            Capacity::OnDemand => ON_DEMAND,
            Capacity::Spot => SPOT,
        }
    }
}

/// The one currency the priced clusters' prices are in: `Ok(Some(code))` when every priced
/// cluster that names one names the same, `Ok(None)` when none names one, and the codes
/// when they differ (their costs are then not comparable, and are shown without a currency).
pub fn fleet_currency<'a>(
    prices: impl IntoIterator<Item = &'a Prices>,
) -> Result<Option<String>, Vec<String>> {
    let codes: std::collections::BTreeSet<&str> = prices
        .into_iter()
        .filter(|p| p.is_priced())
        .filter_map(|p| p.currency.as_deref())
        .collect();
    match codes.len() {
        0 => Ok(None),
        1 => Ok(codes.into_iter().next().map(str::to_string)),
        _ => Err(codes.into_iter().map(str::to_string).collect()),
    }
}

/// A cluster's prices, per hour. A price that is absent is not known (not free).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Prices {
    pub cpu_core_hour: Option<f64>,
    pub memory_gib_hour: Option<f64>,
    pub gpu_hour: Option<f64>,
    pub egress_per_gib: Option<f64>,
    pub capacity: Capacity,
    /// For spot capacity: the share of its replicas interrupted in an hour.
    pub interruption_rate: f64,
    /// The currency the prices are in, if the cluster says.
    pub currency: Option<String>,
}

/// Why a price property cannot be read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PriceError {
    #[error("{key}: {value:?} is not a price (a number of at least 0)")]
    NotAPrice { key: String, value: String },
    #[error("{CAPACITY_TYPE}: {0:?} is not a capacity type (on-demand or spot)")]
    Capacity(String),
    #[error("{INTERRUPTION_RATE}: {0:?} is not a rate (a number from 0 to 1)")]
    Rate(String),
    #[error("{INTERRUPTION_RATE} is for spot capacity only")]
    RateOnDemand,
    #[error("{CURRENCY}: {0:?} is not a currency code (three capital letters, ISO 4217: USD, EUR)")]
    Currency(String),
}

/// The names one price goes by (Orrery's, KubeFleet's).
const SAME_PRICE: [[&str; 2]; 2] = [
    [CPU_CORE_HOUR, FLEET_CPU_CORE],
    [MEMORY_GIB_HOUR, FLEET_MEMORY_GIB],
];

/// The properties `spec` over those of `status`, key by key; a price the spec sets under
/// either of its names hides the member's under both.
pub fn merged<'a>(
    status: &'a BTreeMap<String, String>,
    spec: &'a BTreeMap<String, String>,
) -> BTreeMap<&'a str, &'a str> {
    let hidden = |k: &str| {
        SAME_PRICE
            .iter()
            .any(|names| names.contains(&k) && names.iter().any(|n| spec.contains_key(*n)))
    };
    let mut out: BTreeMap<&str, &str> = status
        .iter()
        .filter(|(k, _)| !hidden(k))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    out.extend(spec.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    out
}

fn price(key: &str, value: &str) -> Result<f64, PriceError> {
    value
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x >= 0.0)
        .ok_or_else(|| PriceError::NotAPrice {
            key: key.to_string(),
            value: value.to_string(),
        })
}

impl Prices {
    /// The prices among `props`, and what could not be read (left out of the prices).
    pub fn of<'a>(
        props: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> (Prices, Vec<PriceError>) {
        let props: BTreeMap<&str, &str> = props.into_iter().collect();
        let mut p = Prices::default();
        let mut errs = Vec::new();
        let mut read = |keys: &[&str]| -> Option<f64> {
            let (k, v) = keys.iter().find_map(|k| props.get(k).map(|v| (*k, *v)))?;
            price(k, v).map_err(|e| errs.push(e)).ok()
        };
        p.cpu_core_hour = read(&[CPU_CORE_HOUR, FLEET_CPU_CORE]);
        p.memory_gib_hour = read(&[MEMORY_GIB_HOUR, FLEET_MEMORY_GIB]);
        p.gpu_hour = read(&[GPU_HOUR]);
        p.egress_per_gib = read(&[EGRESS_PER_GIB]);
        match props.get(CAPACITY_TYPE).map(|v| v.trim()) {
            None | Some(ON_DEMAND) => {}
            Some(SPOT) => p.capacity = Capacity::Spot,
            Some(other) => errs.push(PriceError::Capacity(other.to_string())),
        }
        if let Some(v) = props.get(CURRENCY).map(|v| v.trim()) {
            if v.len() == 3 && v.bytes().all(|b| b.is_ascii_uppercase()) {
                p.currency = Some(v.to_string());
            } else {
                errs.push(PriceError::Currency(v.to_string()));
            }
        }
        if let Some(v) = props.get(INTERRUPTION_RATE) {
            match v.trim().parse::<f64>() {
                Ok(r) if (0.0..=1.0).contains(&r) => {
                    if p.capacity == Capacity::Spot {
                        p.interruption_rate = r;
                    } else {
                        errs.push(PriceError::RateOnDemand);
                    }
                }
                _ => errs.push(PriceError::Rate(v.to_string())),
            }
        }
        (p, errs)
    }

    /// Whether any price is known.
    pub fn is_priced(&self) -> bool {
        self.cpu_core_hour.is_some() || self.memory_gib_hour.is_some() || self.gpu_hour.is_some()
    }

    /// The hourly price of what one replica requests (cores, GiB of memory, GPUs), or the
    /// first resource requested that has no price here.
    pub fn hourly(&self, cores: f64, memory_gib: f64, gpus: f64) -> Result<f64, &'static str> {
        let mut total = 0.0;
        for (amount, price, what) in [
            (cores, self.cpu_core_hour, "cpu"),
            (memory_gib, self.memory_gib_hour, "memory"),
            (gpus, self.gpu_hour, "gpu"),
        ] {
            if amount > 0.0 {
                total += amount * price.ok_or(what)?;
            }
        }
        Ok(total)
    }

    /// What an hour of served replica costs: spot capacity serves only the share of the hour
    /// it is not interrupted, and the interrupted share is paid for again where the replica
    /// restarts.
    pub fn per_served_hour(&self, hourly: f64) -> f64 {
        match self.capacity {
            Capacity::OnDemand => hourly,
            Capacity::Spot => hourly / (1.0 - self.interruption_rate).max(0.05),
        }
    }
}

/// Appends the errors of a Cluster's `spec.properties` at `path` to `errs`: every price a
/// platform team writes down must be readable.
pub fn validate_properties(props: &BTreeMap<String, String>, path: &str, errs: &mut ErrorList) {
    let (_, bad) = Prices::of(props.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    for e in bad {
        let key = match &e {
            PriceError::NotAPrice { key, .. } => key.clone(),
            PriceError::Capacity(_) => CAPACITY_TYPE.to_string(),
            PriceError::Rate(_) | PriceError::RateOnDemand => INTERRUPTION_RATE.to_string(),
            PriceError::Currency(_) => CURRENCY.to_string(),
        };
        let value = props.get(&key).cloned().unwrap_or_default();
        errs.push(FieldError::invalid(
            format!("{path}[{key}]"),
            value,
            e.to_string(),
        ));
    }
}

/// Orrery's `placement.cost`: how much price counts in the ranking, a budget, and a floor of
/// on-demand capacity.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CostPolicy {
    /// How much the hourly price of the replicas counts among the scores, 0 to 10 (balance counts 2, headroom 1). 0: price does not rank clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    /// The most the workload's replicas may cost per hour, together, in the fleet's prices' currency; replicas beyond it are left unplaced, and say so. A cluster without a price for what the workload requests takes none of its replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_hourly: Option<f64>,
    /// The share of the replicas, 0 to 1, that must run on on-demand capacity when any run on spot capacity (rounded up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_on_demand: Option<f64>,
    /// Move running replicas to clusters where they cost at least a tenth less, as room opens there under the water level limit (a few workloads at a time; needs a weight above 0). Off by default: a move restarts the replicas it moves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidate: Option<bool>,
}

impl CostPolicy {
    pub fn validate(&self, path: &str, errs: &mut ErrorList) {
        if let Some(w) = self.weight
            && !(w.is_finite() && (0.0..=MAX_WEIGHT).contains(&w))
        {
            errs.push(FieldError::invalid(
                format!("{path}.weight"),
                w,
                "must be a number from 0 to 10",
            ));
        }
        if let Some(m) = self.max_hourly
            && !(m.is_finite() && m >= 0.0)
        {
            errs.push(FieldError::invalid(
                format!("{path}.maxHourly"),
                m,
                "must be a number of at least 0",
            ));
        }
        if let Some(f) = self.min_on_demand
            && !(f.is_finite() && (0.0..=1.0).contains(&f))
        {
            errs.push(FieldError::invalid(
                format!("{path}.minOnDemand"),
                f,
                "must be a number from 0 to 1",
            ));
        }
        if self.consolidate == Some(true) && self.weight() <= 0.0 {
            errs.push(FieldError::invalid(
                format!("{path}.consolidate"),
                true,
                "needs cost.weight above 0: consolidation moves replicas by the price that weight ranks clusters by",
            ));
        }
    }

    pub fn weight(&self) -> f64 {
        self.weight.unwrap_or(0.0)
    }

    /// Whether replicas are consolidated onto cheaper clusters (only when price ranks them).
    pub fn consolidates(&self) -> bool {
        self.consolidate == Some(true) && self.weight() > 0.0
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn props(p: &[(&str, &str)]) -> BTreeMap<String, String> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn prices_are_read_from_orrerys_properties_then_kubefleets() {
        // (properties, cpu price, memory price, capacity, errors)
        type Case<'a> = (
            &'a [(&'a str, &'a str)],
            Option<f64>,
            Option<f64>,
            Capacity,
            usize,
        );
        let cases: &[Case] = &[
            (&[], None, None, Capacity::OnDemand, 0),
            (
                &[(CPU_CORE_HOUR, "0.04"), (MEMORY_GIB_HOUR, "0.005")],
                Some(0.04),
                Some(0.005),
                Capacity::OnDemand,
                0,
            ),
            // KubeFleet's names, when Orrery's are absent; Orrery's win when both are there.
            (
                &[(FLEET_CPU_CORE, "0.073"), (FLEET_MEMORY_GIB, "0.022")],
                Some(0.073),
                Some(0.022),
                Capacity::OnDemand,
                0,
            ),
            (
                &[(FLEET_CPU_CORE, "0.073"), (CPU_CORE_HOUR, "0.05")],
                Some(0.05),
                None,
                Capacity::OnDemand,
                0,
            ),
            (
                &[
                    (CPU_CORE_HOUR, "0.01"),
                    (CAPACITY_TYPE, "spot"),
                    (INTERRUPTION_RATE, "0.05"),
                ],
                Some(0.01),
                None,
                Capacity::Spot,
                0,
            ),
            // What cannot be read is left out, and said.
            (
                &[(CPU_CORE_HOUR, "cheap")],
                None,
                None,
                Capacity::OnDemand,
                1,
            ),
            (&[(CPU_CORE_HOUR, "-1")], None, None, Capacity::OnDemand, 1),
            (
                &[(CAPACITY_TYPE, "reserved")],
                None,
                None,
                Capacity::OnDemand,
                1,
            ),
            (
                &[(INTERRUPTION_RATE, "0.1")],
                None,
                None,
                Capacity::OnDemand,
                1,
            ),
            (
                &[(CAPACITY_TYPE, "spot"), (INTERRUPTION_RATE, "2")],
                None,
                None,
                Capacity::Spot,
                1,
            ),
        ];
        for (p, cpu, mem, cap, n_errs) in cases {
            let p = props(p);
            let (got, errs) = Prices::of(p.iter().map(|(k, v)| (k.as_str(), v.as_str())));
            assert_eq!(
                (
                    got.cpu_core_hour,
                    got.memory_gib_hour,
                    got.capacity,
                    errs.len()
                ),
                (*cpu, *mem, *cap, *n_errs),
                "{p:?}: {errs:?}"
            );
        }
    }

    #[test]
    fn the_cluster_spec_overrides_what_the_member_reports() {
        let status = props(&[(CPU_CORE_HOUR, "0.05"), (GPU_HOUR, "2")]);
        let spec = props(&[(CPU_CORE_HOUR, "0.03")]);
        let (p, _) = Prices::of(merged(&status, &spec));
        assert_eq!((p.cpu_core_hour, p.gpu_hour), (Some(0.03), Some(2.0)));
        // The Cluster's price under KubeFleet's name beats the member's under Orrery's, and
        // the other way round.
        let spec = props(&[(FLEET_CPU_CORE, "0.02")]);
        let (p, _) = Prices::of(merged(&status, &spec));
        assert_eq!((p.cpu_core_hour, p.gpu_hour), (Some(0.02), Some(2.0)));
        let status = props(&[(FLEET_MEMORY_GIB, "0.01")]);
        let spec = props(&[(MEMORY_GIB_HOUR, "0.004")]);
        let (p, _) = Prices::of(merged(&status, &spec));
        assert_eq!(p.memory_gib_hour, Some(0.004));
    }

    #[test]
    fn a_currency_is_a_code_and_the_fleet_has_one_or_says_it_has_several() {
        let (usd, errs) = Prices::of([(CPU_CORE_HOUR, "0.04"), (CURRENCY, "USD")]);
        assert_eq!((usd.currency.as_deref(), errs.len()), (Some("USD"), 0));
        for bad in ["usd", "US", "US$", "EURO"] {
            let (p, errs) = Prices::of([(CURRENCY, bad)]);
            assert_eq!(p.currency, None);
            assert_eq!(errs, [PriceError::Currency(bad.into())], "{bad}");
        }
        let (eur, _) = Prices::of([(CPU_CORE_HOUR, "0.03"), (CURRENCY, "EUR")]);
        let (unnamed, _) = Prices::of([(CPU_CORE_HOUR, "0.03")]);
        // An unpriced cluster's currency says nothing about costs.
        let (idle, _) = Prices::of([(CURRENCY, "EUR")]);
        assert_eq!(
            fleet_currency([&usd, &unnamed, &idle]),
            Ok(Some("USD".into()))
        );
        assert_eq!(fleet_currency([&unnamed]), Ok(None));
        assert_eq!(
            fleet_currency([&usd, &eur]),
            Err(vec!["EUR".to_string(), "USD".to_string()])
        );
        let mut errs = ErrorList::default();
        validate_properties(
            &props(&[(CURRENCY, "dollars")]),
            "spec.properties",
            &mut errs,
        );
        let text = format!("{errs:?}");
        assert!(
            text.contains("spec.properties[cost.orrery.io/currency]"),
            "{text}"
        );
    }

    #[test]
    fn a_replica_costs_what_it_requests() {
        let (p, _) = Prices::of([(CPU_CORE_HOUR, "0.04"), (MEMORY_GIB_HOUR, "0.005")]);
        assert!((p.hourly(2.0, 4.0, 0.0).unwrap() - 0.1).abs() < 1e-12);
        // No price for a GPU: a GPU replica cannot be costed here.
        assert_eq!(p.hourly(1.0, 1.0, 1.0), Err("gpu"));
        // Nothing requested costs nothing.
        assert_eq!(p.hourly(0.0, 0.0, 0.0), Ok(0.0));
        let (spot, _) = Prices::of([
            (CPU_CORE_HOUR, "0.01"),
            (CAPACITY_TYPE, "spot"),
            (INTERRUPTION_RATE, "0.2"),
        ]);
        assert!((spot.per_served_hour(0.04) - 0.05).abs() < 1e-12);
        assert_eq!(p.per_served_hour(0.04), 0.04);
    }

    #[test]
    fn bad_prices_in_a_cluster_spec_are_refused_with_their_key() {
        let mut errs = ErrorList::default();
        validate_properties(
            &props(&[(CPU_CORE_HOUR, "free"), (CAPACITY_TYPE, "spot")]),
            "spec.properties",
            &mut errs,
        );
        let text = format!("{errs:?}");
        assert!(
            text.contains("spec.properties[cost.orrery.io/cpu-core-hour]"),
            "{text}"
        );
        assert!(text.contains("is not a price"), "{text}");
    }

    #[test]
    fn a_cost_block_is_checked() {
        for (c, ok) in [
            (
                CostPolicy {
                    weight: Some(5.0),
                    max_hourly: Some(3.0),
                    min_on_demand: Some(0.3),
                    consolidate: None,
                },
                true,
            ),
            (
                CostPolicy {
                    weight: Some(11.0),
                    ..Default::default()
                },
                false,
            ),
            (
                CostPolicy {
                    weight: Some(f64::NAN),
                    ..Default::default()
                },
                false,
            ),
            (
                CostPolicy {
                    max_hourly: Some(-1.0),
                    ..Default::default()
                },
                false,
            ),
            (
                CostPolicy {
                    min_on_demand: Some(1.5),
                    ..Default::default()
                },
                false,
            ),
            (
                CostPolicy {
                    weight: Some(2.0),
                    consolidate: Some(true),
                    ..Default::default()
                },
                true,
            ),
            (
                CostPolicy {
                    consolidate: Some(true),
                    ..Default::default()
                },
                false,
            ),
            (
                CostPolicy {
                    consolidate: Some(false),
                    ..Default::default()
                },
                true,
            ),
        ] {
            let mut errs = ErrorList::default();
            c.validate("spec.placement.cost", &mut errs);
            assert_eq!(errs.is_empty(), ok, "{c:?}: {errs:?}");
        }
    }
}
