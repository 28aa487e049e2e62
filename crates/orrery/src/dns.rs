//! Clusterset DNS wiring: the server answers from the ServiceImports and EndpointSlices in
//! the store (the whole fleet's directory), an agent from those its member imports.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use orrery_api::services::{IMPORT_KIND, LABEL_MANAGED_BY, MANAGED_BY};
use orrery_controllers::runtime::cache::Cache;
use orrery_controllers::runtime::reflector;
use orrery_dns::Directory;
use orrery_store::Store;
use serde_json::Value;
use tokio::sync::watch;

/// Rebuilds are at most this often: a burst of slice changes makes one directory.
const SETTLE: Duration = Duration::from_millis(10);

/// Serves the fleet's clusterset DNS on `addr`, from the store.
pub async fn serve_fleet(
    store: Arc<dyn Store>,
    addr: SocketAddr,
    mut shutdown: watch::Receiver<bool>,
) -> anyhow::Result<SocketAddr> {
    let (tx, rx) = watch::channel(Arc::new(Directory::default()));
    let bound = orrery_dns::serve(addr, rx, shutdown.clone()).await?;
    let imports = Arc::new(Cache::new(&[]));
    let slices = Arc::new(Cache::new(&[]));
    let mut import_events = reflector::spawn_cached(
        store.clone(),
        orrery_api::keys::prefix(
            orrery_api::services::GROUP,
            orrery_api::services::IMPORT_PLURAL,
            None,
        ),
        Some(imports.clone()),
        shutdown.clone(),
    );
    let mut slice_events = reflector::spawn_cached(
        store,
        orrery_api::keys::prefix("discovery.k8s.io", "endpointslices", None),
        Some(slices.clone()),
        shutdown.clone(),
    );
    tokio::spawn(async move {
        loop {
            let ev = tokio::select! {
                _ = shutdown.changed() => return,
                e = import_events.recv() => e,
                e = slice_events.recv() => e,
            };
            if ev.is_none() {
                return;
            }
            tokio::time::sleep(SETTLE).await;
            while import_events.try_recv().is_ok() || slice_events.try_recv().is_ok() {}
            if !imports.is_listed() || !slices.is_listed() {
                continue;
            }
            let values = |c: &Cache, managed: bool| -> Vec<Value> {
                c.list()
                    .iter()
                    .filter(|o| {
                        !managed
                            || o.labels().get(LABEL_MANAGED_BY).map(String::as_str)
                                == Some(MANAGED_BY)
                    })
                    .filter_map(|o| serde_json::to_value(&**o).ok())
                    .collect()
            };
            let dir = Directory::build(&values(&imports, false), &values(&slices, true));
            tx.send_replace(Arc::new(dir));
        }
    });
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
