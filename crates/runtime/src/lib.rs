//! The controller runtime every controller stands on, and the API server's caches of tokens,
//! roles and members (after kube-runtime's reflector and `Controller`, and
//! controller-runtime's `WaitForCacheSync`). It knows the `Store` trait and the api crate only:
//!
//! - [`reflector`]: list, then watch from the list's revision; a broken watch resumes from the
//!   last revision seen, and only a 410 (history gone) makes it list again. Its events go to
//!   the controller, and optionally into an indexed [`cache::Cache`].
//! - [`inbox`]: what a controller's reflectors saw waits there, one change per object (the
//!   newest, in the place of the first), so a controller that falls behind a busy source
//!   holds at most one change per object.
//! - [`Barrier`]: a controller does not reconcile until every source it reads has delivered its
//!   first listing; a decision to delete something is never taken from a partial view.
//! - [`queue::WorkQueue`]: keys to reconcile, each once however often it is added, never two
//!   reconciles of one key at a time, failures retried with per-key exponential backoff behind
//!   fresh work, and a shutdown that stops handing out keys.
//! - [`metrics::ControllerMetrics`]: queue depth, reconcile duration, errors and retries per
//!   controller on `/metrics`.
//! - [`controller::Controller`]: the loop every controller runs over the pieces above: its
//!   sources, its barrier, one queue, one retry behaviour, concurrent reconciles, metrics.
//! - [`terms`]: leader gating and fencing, a term's controllers on a fenced store.
//!
//! Invariants the controllers keep with it (ARCHITECTURE.md): a controller never deletes from
//! a cache that has not synced, and re-reads from the store what a deletion is decided on
//! before carrying it out; reconciliation compares against the latest cached state, never
//! against the event that woke it.

use std::collections::BTreeSet;

pub mod admission;
pub mod cache;
pub mod controller;
pub mod inbox;
pub mod metrics;
pub mod queue;
pub mod reflector;
pub mod terms;

pub use reflector::Event;

/// Which of a controller's sources have delivered their first listing.
#[derive(Debug, Default, Clone)]
pub struct Barrier {
    pending: BTreeSet<String>,
    listed: BTreeSet<String>,
}

impl Barrier {
    pub fn new() -> Self {
        Self::default()
    }

    /// A source the controller must have listed before it acts (sources may be added while
    /// it runs: a template kind followed later holds the barrier until it is listed).
    pub fn expect(&mut self, source: impl Into<String>) {
        let s = source.into();
        if !self.listed.contains(&s) {
            self.pending.insert(s);
        }
    }

    /// The source's listing arrived.
    pub fn listed(&mut self, source: impl Into<String>) {
        let s = source.into();
        self.pending.remove(&s);
        self.listed.insert(s);
    }

    /// Whether every expected source has been listed.
    pub fn is_synced(&self) -> bool {
        self.pending.is_empty()
    }

    /// Whether this source has been listed.
    pub fn has_listed(&self, source: &str) -> bool {
        self.listed.contains(source)
    }

    /// The sources still waited for.
    pub fn waiting_for(&self) -> impl Iterator<Item = &str> {
        self.pending.iter().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_barrier_holds_until_every_source_listed_even_those_added_late() {
        let mut b = Barrier::new();
        assert!(b.is_synced(), "nothing expected yet");
        b.expect("bindings");
        b.expect("works");
        assert!(!b.is_synced());
        b.listed("bindings");
        assert!(!b.is_synced());
        b.listed("works");
        assert!(b.is_synced());
        b.expect("templates/apps/deployments");
        assert!(!b.is_synced(), "a source followed later holds it again");
        assert_eq!(
            b.waiting_for().collect::<Vec<_>>(),
            ["templates/apps/deployments"]
        );
        b.listed("templates/apps/deployments");
        b.expect("works");
        assert!(
            b.is_synced(),
            "a source listed before is not waited for again"
        );
        assert!(b.has_listed("works") && !b.has_listed("clusters"));
    }
}
