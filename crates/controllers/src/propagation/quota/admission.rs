//! The FederatedResourceQuota check of a template change, at admission: a write to a placed
//! template (its replicas, or what a replica requests) that would take its namespace's use
//! over a quota's `overall` is refused, 403 `QuotaExceeded`, with Karmada's message naming the
//! quota. (Karmada checks the binding the change leads to, and so accepts the template and
//! leaves it unpropagated with an Event; Orrery tells the writer.) A template not placed yet
//! is not refused here: its first decision is checked by the scheduler, as in Karmada.
//!
//! What the template needs is read by the same interpreter the policy controller uses (the
//! user's customizations over the bundled ones, or its `ResourceInterpreter`), and how much it
//! would use is projected on its placement ([`fq::projected_use`]). Writes in a namespace
//! without a quota cost nothing but a look at the quotas followed in memory.
//!
//! Two changes in one namespace admitted at the same moment may both pass (Karmada writes
//! `overallUsed` at admission to close that window, and leaves drift to a resync); the
//! scheduler's check of each decision stays the bound.

use std::collections::HashMap;
use std::sync::Arc;

use crate::runtime::admission::{Admission, Refusal};
use orrery_api::binding::{self, BindingSpec};
use orrery_api::federated_quota::{self as fq, FederatedResourceQuotaSpec};
use orrery_api::kinds::{
    FEDERATED_RESOURCE_QUOTA, RESOURCE_BINDING, RESOURCE_INTERPRETER_CUSTOMIZATION,
};
use orrery_api::meta::ResourceList;
use orrery_api::{Object, keys};
use orrery_store::{ListOptions, Store, StoreError};
use tokio::sync::watch;

use crate::runtime::cache::Cache;
use crate::runtime::controller::{Action, Controller, Keys, Origin, Reconciler, Source};
use crate::runtime::metrics::Handle;
use crate::runtime::reflector::Event;

/// The check, with the quotas it follows in memory (on every replica, leader or not).
#[derive(Debug, Default)]
pub struct QuotaAdmission {
    quotas: Arc<Cache>,
}

impl QuotaAdmission {
    pub fn new() -> Arc<Self> {
        Arc::new(QuotaAdmission::default())
    }

    /// Follows the quotas until shutdown.
    pub fn follow(
        self: &Arc<Self>,
        store: Arc<dyn Store>,
        metrics: Handle,
        shutdown: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let c = Controller::new("quota-admission", store, Follow, metrics).source(
            Source::new("quotas", FEDERATED_RESOURCE_QUOTA.prefix(None))
                .cached(self.quotas.clone()),
        );
        tokio::spawn(c.run(shutdown))
    }

    /// The limits of the namespace's quotas (read from the store until the cache has listed).
    async fn limits(
        &self,
        store: &dyn Store,
        ns: &str,
    ) -> Result<Vec<(String, ResourceList)>, StoreError> {
        let items = if self.quotas.is_listed() {
            self.quotas.in_namespace(ns)
        } else {
            let list = store
                .list(
                    &FEDERATED_RESOURCE_QUOTA.prefix(Some(ns)),
                    &ListOptions::default(),
                )
                .await?;
            list.items.into_iter().map(Arc::new).collect()
        };
        Ok(items
            .iter()
            .filter_map(|q| {
                let s: FederatedResourceQuotaSpec = serde_json::from_value(q.spec.clone()?).ok()?;
                (!s.overall.is_empty()).then(|| (q.name().to_string(), s.overall))
            })
            .collect())
    }
}

/// The cache is all the follower needs: nothing to reconcile.
struct Follow;

#[async_trait::async_trait]
impl Reconciler for Follow {
    type Key = ();
    type Error = StoreError;
    fn on_event(&mut self, _: Origin, _: Event, _: &mut Keys<()>) {}
    fn all_keys(&self) -> Vec<()> {
        Vec::new()
    }
    async fn reconcile(&self, _: &()) -> Result<Action, StoreError> {
        Ok(Action::Done)
    }
}

/// What a template asks, as the policy controller reads it.
struct Demand {
    replicas: i64,
    request: ResourceList,
    /// Its components, when it has two or more (placed whole).
    components: Vec<orrery_api::binding::Component>,
}

/// Replicas, per-replica request and components of a template, as the policy controller
/// reads them.
async fn demand(store: &dyn Store, t: &Object) -> Result<Demand, StoreError> {
    let opts = ListOptions::default();
    let rics = store
        .list(&RESOURCE_INTERPRETER_CUSTOMIZATION.prefix(None), &opts)
        .await?;
    let ris = store.list(&keys::well_known::interpreters(), &opts).await?;
    let mut customized = crate::propagation::customized::Customized::default();
    customized.follow(Event::Listed(
        rics.items.into_iter().map(Arc::new).collect(),
    ));
    let mut specs = HashMap::new();
    crate::propagation::follow_interpreters(
        &mut specs,
        Event::Listed(ris.items.into_iter().map(Arc::new).collect()),
    );
    let interp = customized.interpreter(&specs, t);
    let v = serde_json::to_value(t).unwrap_or_default();
    Ok(Demand {
        replicas: interp.replicas(&v).unwrap_or(0),
        request: interp.requests(&v),
        components: interp.components(&v),
    })
}

fn internal(e: StoreError) -> Refusal {
    Refusal {
        code: 500,
        reason: "InternalError",
        message: format!("checking the namespace's FederatedResourceQuotas failed: {e}"),
    }
}

#[async_trait::async_trait]
impl Admission for QuotaAdmission {
    async fn admit(
        &self,
        store: &dyn Store,
        obj: &Object,
        _old: Option<&Object>,
    ) -> Result<(), Refusal> {
        let ns = obj.namespace();
        if ns.is_empty() || obj.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let limits = self.limits(store, ns).await.map_err(internal)?;
        if limits.is_empty() {
            return Ok(());
        }
        let bkey = RESOURCE_BINDING.key(ns, &binding::name_for(&obj.kind, obj.name()));
        let b = match store.get(&bkey).await {
            Ok(b) => b,
            // Not placed: nothing it asks is in use yet.
            Err(StoreError::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(internal(e)),
        };
        let Some(spec) = b
            .spec
            .clone()
            .and_then(|s| serde_json::from_value::<BindingSpec>(s).ok())
            .filter(|s| s.resource.kind == obj.kind && s.resource.uid == obj.metadata.uid)
        else {
            return Ok(());
        };
        let d = demand(store, obj).await.map_err(internal)?;
        let old = fq::usage_of(&spec);
        let new = if d.components.len() > 1 {
            // Placed whole: the new set in each cluster it runs in.
            let sets = spec.clusters.iter().filter(|c| c.replicas > 0).count();
            fq::whole_set_use(&d.components, sets as i64)
        } else {
            fq::projected_use(&spec, d.replicas, &d.request)
        };
        if !fq::changes_use(&old, &new) {
            return Ok(());
        }
        let bindings = store
            .list(&RESOURCE_BINDING.prefix(Some(ns)), &ListOptions::default())
            .await
            .map_err(internal)?;
        let before = super::namespace_use(ns, bindings.items.iter());
        let after = fq::add(&fq::sub(&before, &old), &new);
        for (name, overall) in &limits {
            if let Some(message) = fq::refusal(ns, name, overall, &before, &after) {
                return Err(Refusal {
                    code: 403,
                    reason: fq::REASON_QUOTA_EXCEEDED,
                    message,
                });
            }
        }
        Ok(())
    }
}
