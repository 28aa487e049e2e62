//! Clusterset DNS wiring: the server answers from the ServiceImports and EndpointSlices in
//! the store (the whole fleet's directory), an agent from those its member imports.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use orrery_api::services::{IMPORT_KIND, LABEL_MANAGED_BY, MANAGED_BY};
use orrery_controllers::runtime::cache::Cache;
use orrery_controllers::runtime::controller::{
    Action, Controller, Keys, Origin, Reconciler, Source,
};
use orrery_controllers::runtime::reflector::Event;
use orrery_dns::Directory;
use orrery_store::Store;
use serde_json::Value;
use tokio::sync::watch;

/// Rebuilds are at most this often: a burst of slice changes makes one directory.
const SETTLE: Duration = Duration::from_millis(10);

/// The fleet's directory, built again from the cached imports and slices after a change.
struct Feeder {
    imports: Arc<Cache>,
    slices: Arc<Cache>,
    tx: watch::Sender<Arc<Directory>>,
}

#[async_trait::async_trait]
impl Reconciler for Feeder {
    type Key = ();
    type Error = String;

    fn on_event(&mut self, _: Origin, _: Event, keys: &mut Keys<()>) {
        keys.push(());
    }

    fn all_keys(&self) -> Vec<()> {
        vec![()]
    }

    async fn reconcile(&self, _: &()) -> Result<Action, String> {
        let values = |c: &Cache, managed: bool| -> Vec<Value> {
            c.list()
                .iter()
                .filter(|o| {
                    !managed
                        || o.labels().get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
                })
                .filter_map(|o| serde_json::to_value(&**o).ok())
                .collect()
        };
        let dir = Directory::build(&values(&self.imports, false), &values(&self.slices, true));
        self.tx.send_replace(Arc::new(dir));
        Ok(Action::Done)
    }
}

/// Serves the fleet's clusterset DNS on `addr`, from the store.
pub async fn serve_fleet(
    store: Arc<dyn Store>,
    addr: SocketAddr,
    shutdown: watch::Receiver<bool>,
    metrics: orrery_controllers::runtime::metrics::Handle,
) -> anyhow::Result<SocketAddr> {
    let (tx, rx) = watch::channel(Arc::new(Directory::default()));
    let bound = orrery_dns::serve(addr, rx, shutdown.clone()).await?;
    let imports = Arc::new(Cache::new(&[]));
    let slices = Arc::new(Cache::new(&[]));
    let f = Feeder {
        imports: imports.clone(),
        slices: slices.clone(),
        tx,
    };
    let c = Controller::new("dns", store, f, metrics)
        .source(
            Source::new(
                "imports",
                orrery_api::keys::prefix(
                    orrery_api::services::GROUP,
                    orrery_api::services::IMPORT_PLURAL,
                    None,
                ),
            )
            .cached(imports),
        )
        .source(
            Source::new(
                "slices",
                orrery_api::keys::prefix("discovery.k8s.io", "endpointslices", None),
            )
            .cached(slices),
        )
        .settle(SETTLE);
    tokio::spawn(c.run(shutdown));
    Ok(bound)
}

/// Serves an agent's clusterset DNS on `addr`, from the objects its member imports.
pub async fn serve_imports(
    addr: SocketAddr,
    mut objects: watch::Receiver<Vec<Value>>,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr> {
    let build = |objects: &[Value]| {
        let (imports, slices): (Vec<Value>, Vec<Value>) = objects
            .iter()
            .cloned()
            .partition(|o| o.get("kind").and_then(Value::as_str) == Some(IMPORT_KIND));
        Arc::new(Directory::build(&imports, &slices))
    };
    let (tx, rx) = watch::channel(build(&objects.borrow_and_update()));
    let bound = orrery_dns::serve(addr, rx, shutdown.clone()).await?;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                changed = objects.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let dir = build(&objects.borrow_and_update());
                    tx.send_replace(dir);
                }
            }
        }
    });
    Ok(bound)
}
