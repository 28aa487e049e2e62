//! Leader gating and fencing: a server's controllers run only while it leads, each term on a
//! store view fenced by the term's Lease (its writes commit only while the Lease stands, so a
//! leader paused past its lease commits nothing when it wakes), and a term's controllers are
//! stopped and joined before the next term starts its own.
//!
//! ```text
//!   following ──lease won (fence)──▶ leading: start(fenced store, term shutdown)
//!       ▲                                 │ lease lost, or server stopping
//!       └──── controllers joined (≤10 s) ◀┘
//! ```

use std::sync::Arc;
use std::time::Duration;

use orrery_store::{Fence, Store};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Runs terms until `shutdown`: while `leading` holds a fence, the controllers `start` returns
/// run on the fenced store with a shutdown of their own; `on_term(true/false)` is told when a
/// term starts and ends (the leader metric).
pub async fn run<F>(
    store: Arc<dyn Store>,
    mut leading: watch::Receiver<Option<Fence>>,
    mut shutdown: watch::Receiver<bool>,
    on_term: impl Fn(bool),
    mut start: F,
) where
    F: FnMut(Arc<dyn Store>, watch::Receiver<bool>) -> Vec<JoinHandle<()>>,
{
    loop {
        let fence = tokio::select! {
            r = leading.wait_for(Option::is_some) => match r {
                Ok(f) => f.clone(),
                Err(_) => return,
            },
            _ = shutdown.wait_for(|s| *s) => return,
        };
        let Some(fence) = fence else { continue };
        let term_store = store.fenced(fence).unwrap_or_else(|| store.clone());
        let (term_tx, term_rx) = watch::channel(false);
        on_term(true);
        let handles = start(term_store, term_rx);
        let stopping = tokio::select! {
            _ = leading.wait_for(Option::is_none) => false,
            _ = shutdown.wait_for(|s| *s) => true,
        };
        on_term(false);
        let _ = term_tx.send(true);
        stop_all(handles).await;
        if stopping {
            return;
        }
        tracing::warn!("this server no longer leads; its controllers stopped");
    }
}

/// Joins controller tasks, giving them 10 s to finish the writes they have begun.
pub async fn stop_all(handles: Vec<JoinHandle<()>>) {
    let aborts: Vec<_> = handles.iter().map(|h| h.abort_handle()).collect();
    let joined = futures_util::future::join_all(handles);
    if tokio::time::timeout(Duration::from_secs(10), joined)
        .await
        .is_err()
    {
        tracing::warn!("controllers did not stop within 10 s; stopping them");
        for a in aborts {
            a.abort();
        }
    }
}
