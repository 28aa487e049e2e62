//! The default profile: the filter and score plugins that run, in their order. Apart from
//! the plugin traits (`filter`, `score`) so that plugins kept elsewhere (`data`, `cost`)
//! depend on the traits and this list depends on every plugin, never the other way round.

use crate::filter::{self, Filter};
use crate::score::{self, Score};
use crate::{cost, data};

/// The filters of the default profile, cheapest and most selective first.
pub fn default_filters() -> Vec<Box<dyn Filter>> {
    vec![
        Box::new(filter::Readiness),
        Box::new(filter::Evicted),
        Box::new(filter::ApiEnablement),
        Box::new(filter::Affinity),
        Box::new(filter::TargetClusters),
        Box::new(filter::TaintToleration),
        Box::new(filter::Capabilities),
        Box::new(filter::StorageClass),
        Box::new(data::StorageTier),
        Box::new(data::Network),
        Box::new(filter::WorkloadAffinity),
        Box::new(filter::NodeFit),
        Box::new(filter::ResourceQuota),
        Box::new(cost::Priced),
        Box::new(filter::WaterLevel),
        // Last: it estimates each transfer, and only tasks that read data sets pay for it.
        Box::new(data::DataReach),
    ]
}

/// The scores of the default profile.
pub fn default_scores() -> Vec<Box<dyn Score>> {
    vec![
        Box::new(score::Headroom),
        Box::new(score::Balance),
        Box::new(score::Locality),
        Box::new(score::Priority),
        Box::new(score::Network),
        Box::new(score::Proximity),
        Box::new(data::Completion),
        Box::new(cost::CostScore),
    ]
}
